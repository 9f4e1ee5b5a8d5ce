"""The binding: loads the C ABI (libturbopairformer_c.so) with ctypes and turns tensors into its
structs. No logic lives here: validation is done by the C++ core, whose messages name the
argument at fault; this module only maps its status codes to Python exceptions."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


class AbiField(ctypes.Structure):
    _fields_ = [
        ("record", ctypes.c_char_p),
        ("field", ctypes.c_char_p),
        ("kind", ctypes.c_char_p),
        ("offset", ctypes.c_size_t),
        ("size", ctypes.c_size_t),
    ]


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
            + ", ".join(tried)
            + "); install with 'pip install .' or build with scripts/install.sh"
        )
    lib.tpf_version.restype = ctypes.c_char_p
    lib.tpf_abi_fields.argtypes = (ctypes.POINTER(ctypes.c_size_t),)
    lib.tpf_abi_fields.restype = ctypes.POINTER(AbiField)
    return lib, path


LIB, LIBRARY_PATH = _load()


def abi_fields() -> list[tuple[str, str, str, int, int]]:
    """The library's own table of its C ABI structs (c_api.h):
    (record, field, kind, offset, size) rows."""
    n = ctypes.c_size_t(0)
    rows = LIB.tpf_abi_fields(ctypes.byref(n))
    return [
        (r.record.decode(), r.field.decode(), r.kind.decode(), r.offset, r.size)
        for r in (rows[i] for i in range(n.value))
    ]


def _struct(record: str, kinds: dict) -> type:
    """A ctypes mirror of one C struct, its fields in the library's order and types by kind. No
    other attribute can be set on it (__slots__): a name the library lacks raises instead of
    being kept by ctypes as a plain attribute the call never sees."""
    fields = [(f, kinds[k]) for rec, f, k, _, _ in abi_fields() if rec == record and k != "struct"]
    return type(record, (ctypes.Structure,), {"_fields_": fields, "__slots__": ()})


_SCALARS = {
    "ptr": ctypes.c_void_p,
    "i32": ctypes.c_int32,
    "f64": ctypes.c_double,
    "size": ctypes.c_size_t,
    "i64[6]": ctypes.c_int64 * 6,
}
TpfTensor = _struct("tpf_tensor", _SCALARS)
TRIMUL_WEIGHTS = tuple(f for rec, f, *_ in abi_fields() if rec == "trimul_weight")
_KINDS = {**_SCALARS, "tensor": TpfTensor, "tensor[12]": TpfTensor * len(TRIMUL_WEIGHTS)}
TpfAttentionArgs = _struct("tpf_attention_args", _KINDS)
TpfTrimulArgs = _struct("tpf_trimul_args", _KINDS)
TpfLayerNormArgs = _struct("tpf_layer_norm_args", _KINDS)
TpfSwigluArgs = _struct("tpf_swiglu_args", _KINDS)
TpfSigmoidGateArgs = _struct("tpf_sigmoid_gate_args", _KINDS)
TpfResidualArgs = _struct("tpf_residual_args", _KINDS)
TpfTransitionArgs = _struct("tpf_transition_args", _KINDS)
TpfTransitionBackwardArgs = _struct("tpf_transition_backward_args", _KINDS)
TpfGatedLinearArgs = _struct("tpf_gated_linear_args", _KINDS)
ATTENTION_TENSORS = tuple(f for f, t in TpfAttentionArgs._fields_ if t is TpfTensor)


def _signatures(lib) -> None:
    err = (ctypes.c_char_p, ctypes.c_size_t)
    args, targs = ctypes.POINTER(TpfAttentionArgs), ctypes.POINTER(TpfTrimulArgs)
    largs = ctypes.POINTER(TpfLayerNormArgs)
    sargs = ctypes.POINTER(TpfSwigluArgs)
    lib.tpf_swiglu_forward.argtypes = (sargs, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_swiglu_backward.argtypes = lib.tpf_swiglu_forward.argtypes
    gargs = ctypes.POINTER(TpfSigmoidGateArgs)
    lib.tpf_sigmoid_gate_forward.argtypes = (gargs, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_sigmoid_gate_backward.argtypes = lib.tpf_sigmoid_gate_forward.argtypes
    rargs = ctypes.POINTER(TpfResidualArgs)
    lib.tpf_residual_forward.argtypes = (rargs, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_residual_backward.argtypes = lib.tpf_residual_forward.argtypes
    targs_ = ctypes.POINTER(TpfTransitionArgs)
    lib.tpf_transition_forward.argtypes = (targs_, ctypes.c_int32, ctypes.c_void_p) + err
    tbargs = ctypes.POINTER(TpfTransitionBackwardArgs)
    lib.tpf_transition_backward.argtypes = (tbargs, ctypes.c_int32, ctypes.c_void_p) + err
    glargs = ctypes.POINTER(TpfGatedLinearArgs)
    lib.tpf_gated_linear_forward.argtypes = (glargs, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_layer_norm_forward.argtypes = (largs, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_layer_norm_backward_workspace_size.argtypes = (
        largs,
        ctypes.POINTER(ctypes.c_size_t),
    ) + err
    lib.tpf_layer_norm_backward.argtypes = (
        largs,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
    ) + err
    lib.tpf_attention_forward.argtypes = (args, ctypes.c_int32, ctypes.c_void_p) + err
    lib.tpf_attention_backward_workspace_size.argtypes = (
        args,
        ctypes.POINTER(ctypes.c_size_t),
    ) + err
    lib.tpf_attention_backward.argtypes = (
        args,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
    ) + err
    lib.tpf_trimul_workspace_size.argtypes = (
        targs,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_size_t),
    ) + err
    lib.tpf_trimul_forward.argtypes = (
        targs,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
    ) + err
    lib.tpf_trimul_backward.argtypes = lib.tpf_trimul_forward.argtypes
    lib.tpf_trimul_saved_size.argtypes = (ctypes.c_int64,) * 4
    lib.tpf_trimul_saved_size.restype = ctypes.c_size_t
    for f in (
        lib.tpf_attention_forward,
        lib.tpf_attention_backward_workspace_size,
        lib.tpf_attention_backward,
        lib.tpf_trimul_workspace_size,
        lib.tpf_trimul_forward,
        lib.tpf_trimul_backward,
        lib.tpf_layer_norm_forward,
        lib.tpf_layer_norm_backward_workspace_size,
        lib.tpf_layer_norm_backward,
        lib.tpf_swiglu_forward,
        lib.tpf_swiglu_backward,
        lib.tpf_sigmoid_gate_forward,
        lib.tpf_sigmoid_gate_backward,
        lib.tpf_residual_forward,
        lib.tpf_residual_backward,
        lib.tpf_transition_forward,
        lib.tpf_transition_backward,
        lib.tpf_gated_linear_forward,
    ):
        f.restype = ctypes.c_int


_signatures(LIB)

# tpf::StatusCode -> exception type
_ERRORS = {1: ValueError, 2: NotImplementedError, 3: RuntimeError, 4: RuntimeError, 5: TypeError}


def check(code: int, buf) -> None:
    if code != 0:
        raise _ERRORS.get(code, RuntimeError)(buf.value.decode(errors="replace"))


def error_buffer():
    return ctypes.create_string_buffer(1024)


def version() -> str:
    return LIB.tpf_version().decode()
