"""The C ABI structs have one definition (include/turbopairformer/c_api.h); the Python package
builds its ctypes mirrors from the library's own layout table. These tests fail if ctypes lays a
struct out differently from the compiler (a field of the wrong kind, a missing field, padding),
or if the package's names disagree with the library's."""

import ctypes

import pytest

pytest.importorskip("torch", reason="PyTorch is not importable here")

from turbopairformer import _native


@pytest.mark.parametrize(
    "record, mirror",
    [
        ("tpf_tensor", _native.TpfTensor),
        ("tpf_attention_args", _native.TpfAttentionArgs),
        ("tpf_trimul_args", _native.TpfTrimulArgs),
        ("tpf_layer_norm_args", _native.TpfLayerNormArgs),
        ("tpf_swiglu_args", _native.TpfSwigluArgs),
        ("tpf_sigmoid_gate_args", _native.TpfSigmoidGateArgs),
        ("tpf_residual_args", _native.TpfResidualArgs),
    ],
)
def test_ctypes_layout_equals_the_compiled_one(record, mirror):
    rows = [r for r in _native.abi_fields() if r[0] == record]
    size = [r[4] for r in rows if r[2] == "struct"]
    assert size == [ctypes.sizeof(mirror)], f"sizeof({record})"
    fields = [r for r in rows if r[2] != "struct"]
    assert [f for _, f, *_ in fields] == [f for f, _ in mirror._fields_]
    for _, name, kind, offset, nbytes in fields:
        assert getattr(mirror, name).offset == offset, f"offsetof({record}, {name})"
        assert getattr(mirror, name).size == nbytes, f"sizeof({record}::{name}) ({kind})"


def test_names_come_from_the_library():
    assert _native.ATTENTION_TENSORS[:3] == ("q", "k", "v") and "dbias" in _native.ATTENTION_TENSORS
    assert len(_native.TRIMUL_WEIGHTS) == 12 and _native.TRIMUL_WEIGHTS[2] == "p_in_weight"


def test_an_argument_the_library_lacks_raises():
    """An argument name the loaded library's struct does not have (a library older than the
    package) raises instead of becoming a ctypes attribute the call never sees."""
    from turbopairformer import _calls

    with pytest.raises(RuntimeError, match="'no_such_tensor'.*older than this Python package"):
        _calls.struct(_native.TpfLayerNormArgs, no_such_tensor=None)
    a = _calls.struct(_native.TpfLayerNormArgs, x=None)  # a known name: fine
    assert not a.x.data
