"""The binding: loads the C ABI (libturbopairformer_c.so) with ctypes and turns tensors into its
structs. No logic lives here: validation is done by the C++ core, whose messages name the
argument at fault; this module only maps its status codes to Python exceptions."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_MAX_RANK = 6


class TpfTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * _MAX_RANK),
        ("stride", ctypes.c_int64 * _MAX_RANK),
    ]


_ATTN_TENSORS = ("q", "k", "v", "bias", "mask", "out", "out_residual", "lse", "dout", "dq", "dk",
                 "dv", "dbias")


class TpfAttentionArgs(ctypes.Structure):
    _fields_ = [(n, TpfTensor) for n in _ATTN_TENSORS] + [
        ("scale", ctypes.c_double),
        ("compensate", ctypes.c_int32),
    ]


TRIMUL_WEIGHTS = ("norm_in_weight", "norm_in_bias", "p_in_weight", "p_in_bias", "g_in_weight",
                  "g_in_bias", "norm_out_weight", "norm_out_bias", "p_out_weight", "p_out_bias",
                  "g_out_weight", "g_out_bias")


class TpfTrimulArgs(ctypes.Structure):
    _fields_ = [("z", TpfTensor), ("mask", TpfTensor), ("out", TpfTensor), ("dout", TpfTensor),
                ("dz", TpfTensor), ("w", TpfTensor * len(TRIMUL_WEIGHTS)),
                ("dw", TpfTensor * len(TRIMUL_WEIGHTS)), ("direction", ctypes.c_int32),
                ("eps", ctypes.c_double), ("saved", ctypes.c_void_p), ("saved_bytes", ctypes.c_size_t)]


def _candidates():
    env = os.environ.get("TPF_LIBRARY")
    if env:
        yield Path(env)
    yield _HERE / "libturbopairformer_c.so"  # installed wheel
    for build in ("build", "build-python"):  # a source checkout built with scripts/install.sh
        yield _HERE.parent.parent / build / "libturbopairformer_c.so"


def _load():
    tried = []
    for path in _candidates():
        if path.is_file():
            lib = ctypes.CDLL(str(path))
            break
        tried.append(str(path))
    else:
        raise ImportError(
            "turbopairformer: the native library libturbopairformer_c.so was not found (looked in "
            + ", ".join(tried) + "); install with 'pip install .' or build with scripts/install.sh")
    args = ctypes.POINTER(TpfAttentionArgs)
    err = (ctypes.c_char_p, ctypes.c_size_t)
    lib.tpf_attention_forward.argtypes = (args, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_attention_backward_workspace_size.argtypes = (args, ctypes.POINTER(ctypes.c_size_t)) + err
    lib.tpf_attention_backward.argtypes = (args, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.c_void_p) + err
    targs = ctypes.POINTER(TpfTrimulArgs)
    lib.tpf_trimul_workspace_size.argtypes = (targs, ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)) + err
    lib.tpf_trimul_forward.argtypes = (targs, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p) + err
    lib.tpf_trimul_backward.argtypes = lib.tpf_trimul_forward.argtypes
    lib.tpf_trimul_saved_size.argtypes = (ctypes.c_int64,) * 4
    lib.tpf_trimul_saved_size.restype = ctypes.c_size_t
    for f in (lib.tpf_attention_forward, lib.tpf_attention_backward_workspace_size,
              lib.tpf_attention_backward, lib.tpf_trimul_workspace_size, lib.tpf_trimul_forward,
              lib.tpf_trimul_backward):
        f.restype = ctypes.c_int
    lib.tpf_version.restype = ctypes.c_char_p
    return lib, path


LIB, LIBRARY_PATH = _load()

# tpf::StatusCode -> exception type
_ERRORS = {1: ValueError, 2: NotImplementedError, 3: RuntimeError, 4: RuntimeError, 5: TypeError}


def check(code: int, buf) -> None:
    if code != 0:
        raise _ERRORS.get(code, RuntimeError)(buf.value.decode(errors="replace"))


def error_buffer():
    return ctypes.create_string_buffer(1024)


def version() -> str:
    return LIB.tpf_version().decode()
