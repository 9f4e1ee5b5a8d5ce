"""What a wheel needs on the machine it is installed on: no CUDA toolkit (the runtime is linked
statically and the driver is found at run time), no libtorch (the library is loaded through a
C ABI), so one wheel serves every PyTorch >= 2.4."""

import shutil
import subprocess

import pytest

pytest.importorskip("torch", reason="PyTorch is not importable here")

import turbopairformer as tpf

ALLOWED = {
    "libstdc++.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libc.so.6",
    "ld-linux-x86-64.so.2",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
}


def needed(path):
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return {
        line.split("[")[1].rstrip("]") for line in out.stdout.splitlines() if "(NEEDED)" in line
    }


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_native_library_needs_only_the_c_runtime():
    libs = needed(tpf.LIBRARY_PATH)
    assert libs and libs <= ALLOWED, f"{tpf.LIBRARY_PATH} needs {sorted(libs - ALLOWED)}"


def test_version_matches_the_library():
    assert tpf.version().startswith(tpf.__version__)
