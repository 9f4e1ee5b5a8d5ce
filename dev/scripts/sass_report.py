#!/usr/bin/env python3
"""Static report of the kernels in CUDA sources, for checking a change before spending device time.

    dev/scripts/sass_report.py [--filter REGEX] [--out FILE] [--waits] src/attention/forward.cu ...
    dev/scripts/sass_report.py --diff OLD.txt NEW.txt

For each kernel: registers and spill bytes (ptxas), local-memory instructions (LDL/STL),
warpgroup MMAs (HGMMA) and warp MMAs (HMMA) in its SASS, the SASS size and a hash of its
instruction bytes (equal hashes: the same machine code, so a refactor is provably neutral), and
the codes of ptxas's wgmma notes where it gave any (C7510-C7520: a wait or fence it inserted,
or wgmma it serialized; a software pipeline is only real without the serializing ones).
--waits also prints each kernel's warpgroup schedule in program order, runs of equal
instructions counted: WARPGROUP.ARRIVE, the HGMMAs by shape, WARPGROUP.DEPBAR (the wgmma waits,
with how many batches they leave in flight) and the named barriers.
Compiles with the library's flags (sm_90a, -O3) on this machine; needs no GPU. The SASS counts
need cuobjdump (the CUDA toolkit's, or `pip install nvidia-cuda-cuobjdump`, found on PATH, in
CUDA_HOME/bin or in that package); without it the report has the ptxas columns only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = [
    "-O3",
    "-DNDEBUG",
    "-gencode=arch=compute_90a,code=sm_90a",
    "--expt-relaxed-constexpr",
    "-std=c++17",
    f"-I{ROOT / 'include'}",
    f"-I{ROOT / 'src'}",
    "-Xptxas",
    "-v",
]


def tool(name: str) -> str | None:
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / name
    found = shutil.which(name) or (str(cuda) if cuda.exists() else None)
    if found:
        return found
    try:  # the pip wheel's copy
        import nvidia.cu13  # type: ignore

        path = Path(next(iter(nvidia.cu13.__path__))) / "bin" / name
        return str(path) if path.exists() else None
    except ImportError:
        return None


def short(mangled: str) -> str:
    """A readable kernel name: the function and its template arguments, demangled loosely
    (bf16, fp16, fp32 = float, T = the first argument again, numbers, true / false = 1 / 0)."""
    for m in re.finditer(r"\d+(?=[A-Za-z_])", mangled):  # <length><identifier>, the length
        lengths = {int(m.group(0)[i:]) for i in range(len(m.group(0)))}  # maybe after other digits
        name = next(
            (
                mangled[m.end() : m.end() + n]
                for n in lengths
                if mangled[m.end() : m.end() + n].endswith("_kernel")
            ),
            "",
        )
        rest = mangled[m.end() + len(name) :]
        if name and rest.startswith("I"):
            args = rest[1 : rest.find("EEv") if "EEv" in rest else None]
            args = (
                args.replace("13__nv_bfloat16", " bf16")
                .replace("6__half", " fp16")
                .replace("S3_", " T")
            )
            args = re.sub(r"(?:(?<=[ a-z0-9])|^)f(?=L|$| |f)", " fp32", args)
            args = re.sub(r"L[ib](\d+)E?", r" \1", args)
            return f"{name}<{','.join(args.split())}>"
    return mangled[:80]


def report(src: Path, pattern: re.Pattern, waits: bool = False) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        nvcc = tool("nvcc") or sys.exit("sass_report: nvcc not found")
        r = subprocess.run(
            [nvcc, *FLAGS, "-cubin", str(src), "-o", str(cubin)],
            check=False,
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            sys.exit(f"sass_report: {src} does not compile:\n{r.stderr[-4000:]}")
        ptxas, name = {}, None
        for line in r.stderr.splitlines():
            if m := re.search(r"\((C75\d\d)\).*in (?:the )?function '(\S+)'", line):
                ptxas.setdefault(m.group(2), {}).setdefault("notes", set()).add(m.group(1))
            elif m := re.search(r"Compiling entry function '(\S+)'", line):
                name = m.group(1)
            elif name and (m := re.search(r"(\d+) bytes spill stores", line)):
                ptxas.setdefault(name, {})["spill"] = int(m.group(1))
            elif name and (m := re.search(r"Used (\d+) registers", line)):
                ptxas.setdefault(name, {})["regs"] = int(m.group(1))
        sass = {}
        if cuobjdump := tool("cuobjdump"):
            text = subprocess.run(
                [cuobjdump, "--dump-sass", str(cubin)], check=False, capture_output=True, text=True
            ).stdout
            for block in re.split(r"\n\s*Function : ", text)[1:]:
                fname, body = block.split("\n", 1)
                ins = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", body)
                codes = re.findall(r"/\* (0x[0-9a-f]{16}) \*/", body)
                sass[fname.strip()] = {
                    "ldl_stl": sum(1 for i in ins if re.search(r"\b(LDL|STL)\b", i)),
                    "hgmma": sum(1 for i in ins if "HGMMA" in i),
                    "hmma": sum(1 for i in ins if re.search(r"\bHMMA\b", i)),
                    "bytes": 16 * len(ins),
                    "hash": hashlib.md5("".join(codes).encode()).hexdigest()[:12],
                    "waits": schedule(ins) if waits else "",
                }
    rows = []
    for fname in sorted(f for f in ptxas if "regs" in ptxas[f]):
        label = f"{src.name}:{short(fname)}"
        if not pattern.search(label):
            continue
        p, s = ptxas[fname], sass.get(fname, {})
        cols = [f"regs={p.get('regs', '?')}", f"spill={p.get('spill', '?')}"]
        if s:
            cols += [
                f"LDL/STL={s['ldl_stl']}",
                f"HGMMA={s['hgmma']}",
                f"HMMA={s['hmma']}",
                f"sass={s['bytes']}",
                f"hash={s['hash']}",
            ]
        if p.get("notes"):
            cols.append("ptxas=" + ",".join(sorted(p["notes"])))
        rows.append(f"{label}  " + " ".join(cols))
        if waits and s:
            rows.append("    schedule: " + (s["waits"] or "(no warpgroup instructions)"))
    return rows


def schedule(ins: list[str]) -> str:
    """The warpgroup instructions and named barriers of a kernel in program order, runs of equal
    ones counted: 'ARRIVE, 4 HGMMA.64x32x16, DEPBAR<=1, BAR.SYNC 0x1'."""
    seq = []
    for i in ins:
        op = re.sub(r"^@!?U?P\w+\s+", "", i.strip())  # drop a predicate
        if op.startswith("WARPGROUP.ARRIVE"):
            seq.append("ARRIVE")
        elif op.startswith("WARPGROUP.DEPBAR"):
            m = re.search(r"0x([0-9a-f]+)", op)
            seq.append(f"DEPBAR<={int(m.group(1), 16) if m else '?'}")
        elif m := re.match(r"HGMMA\.(\d+x\d+x\d+)", op):
            seq.append(f"HGMMA.{m.group(1)}")
        elif m := re.match(r"BAR\.(SYNC|ARV|RED)\S*\s+([^,]+)", op):
            seq.append(f"BAR.{m.group(1)} {m.group(2).strip()}")
    runs = []
    for op in seq:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    return ", ".join(op if n == 1 else f"{n} {op}" for op, n in runs)


def diff(old: Path, new: Path) -> int:
    parse = lambda p: dict(  # kernel rows only (a --waits schedule line is indented)
        line.split("  ", 1)
        for line in p.read_text().splitlines()
        if "  " in line and not line.startswith(" ")
    )
    a, b = parse(old), parse(new)
    changed = 0
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            changed += 1
            print(f"{k}\n  old: {a.get(k, '(absent)')}\n  new: {b.get(k, '(absent)')}")
    print(f"{changed} of {len(set(a) | set(b))} kernels differ")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sources", nargs="*", type=Path)
    ap.add_argument("--filter", default="", help="only kernels whose 'file:name<args>' matches")
    ap.add_argument("--out", type=Path, help="also write the report here (for --diff)")
    ap.add_argument(
        "--waits",
        action="store_true",
        help="also print each kernel's warpgroup schedule (arrives, HGMMAs, waits, barriers)",
    )
    ap.add_argument(
        "--diff", nargs=2, type=Path, metavar=("OLD", "NEW"), help="compare two reports"
    )
    args = ap.parse_args(argv)
    if args.diff:
        return diff(*args.diff)
    if not args.sources:
        ap.error("give CUDA sources (e.g. src/attention/forward.cu) or --diff OLD NEW")
    pattern = re.compile(args.filter)
    rows = [row for src in args.sources for row in report(src, pattern, args.waits)]
    print("\n".join(rows))
    if args.out:
        args.out.write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
