"""The benchmark report writer (no GPU needed): Markdown, JSON and, with matplotlib, plots."""
import json

import pytest

pytest.importorskip("torch", reason="PyTorch is not importable here")

from turbopairformer import bench


def rows():
    r = []
    for backend, scale in (("turbopairformer", 1.0), ("pytorch_eager", 5.0)):
        for N in (128, 256):
            r.append({"op": "triangle_attention", "backend": backend, "N": N, "D": 32,
                      "fwd_ms": 0.1 * scale * N / 128, "fwd_bwd_ms": 0.5 * scale * N / 128,
                      "peak_mib": 10.0 * scale, "status": "ok"})
    r.append({"op": "triangle_attention", "backend": "trifast", "N": 128, "D": 32,
              "status": "not installed: pip install trifast"})
    r.append({"op": "note", "backend": "-", "N": 0, "status": "stopped: --budget 1 s reached"})
    return r


def test_report_files(tmp_path):
    bench.write_report(rows(), tmp_path, "Fake GPU")
    md = (tmp_path / "report.md").read_text()
    assert "| turbopairformer | 256 | 32 | 0.200 | 1.000 |" in md
    assert "not installed: pip install trifast" in md and "--budget 1 s" in md
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["gpu"] == "Fake GPU" and len(data["rows"]) == 6
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "triangle_attention.png").stat().st_size > 1000
