"""The results files every bench table writes: <stem>.json (gpu, command, rows, and any extra
fields of the table) and <stem>.md (a title with the GPU, the command that made it, then the
table's own lines)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def _replace(path: Path, text: str):
    """Writes text to path through a temporary file beside it: a call killed while writing
    leaves the previous file whole (a --resume reads it back)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_tables(
    out_dir: Path, stem: str, gpu: str, command: str, rows, title: str, lines, extra=None
):
    out_dir.mkdir(parents=True, exist_ok=True)
    _replace(
        out_dir / f"{stem}.json",
        json.dumps({"gpu": gpu, "command": command, "rows": rows, **(extra or {})}, indent=1),
    )
    head = [f"# {title} ({gpu})", "", f"`{command}`", ""]
    _replace(out_dir / f"{stem}.md", "\n".join(head + list(lines)) + "\n")


def doc_table(doc: str, header, rows) -> list:
    """A results file's lines: a module docstring's body (after its first paragraph), then a
    Markdown table of the header cells and each row's cells."""
    return [
        doc.split("\n\n", 1)[1].strip(),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cells) + " |" for cells in rows),
    ]


def failure(e: BaseException, width: int = 120) -> dict:
    """A failed case's fields: its status for the table ("failed: Type: first line", and the
    message's last line where it has more: a subprocess's or a wrapped error's real cause is
    usually there, e.g. inductor's SubprocException) and the message's end in full for the
    JSON (error)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0][:width] if lines else ""
    if len(lines) > 1:
        text += " ... " + lines[-1][:width]
    row = {"status": f"failed: {type(e).__name__}: {text}"}
    if len(lines) > 1:
        row["error"] = "\n".join(lines)[-2000:]
    return row
