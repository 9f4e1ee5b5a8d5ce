"""`tpf` console script: runs the tpf binary installed with the package."""

import os
import sys
from pathlib import Path


def main() -> None:
    exe = Path(__file__).resolve().parent / "tpf"
    if not exe.is_file():
        sys.exit("tpf: the tpf binary is not installed next to the package (build from source)")
    os.execv(str(exe), [str(exe)] + sys.argv[1:])
