"""The fused gated output projection (turbopairformer._gated_linear): the CUDA kernel against
the FP64 formula and against the unfused bf16 path (gate kernel, cuBLAS, residual kernel) on the
same inputs, at odd row counts (one row, partial tiles, several tiles a block), fp32 and bf16
residuals, with and without a residual and a broadcast scale, the gate read as a column block
of a wider tensor, NaN rows, poisoned outputs and repeat runs; the FP64 CPU reference and the
argument checks off the GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

from conftest import requires_gpu  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from turbopairformer import _gate, _gated_linear, _residual  # noqa: E402

K = N = 128
U = 2.0**-8  # bf16 unit roundoff
SHAPES = [(1, 1, 1), (1, 7, 7), (1, 1, 333), (1, 100, 100), (2, 37, 41)]


def _inputs(shape, x_dtype, scale_kind, device, seed):
    """g as the gate block of a stacked [R, 520] projection (row stride 520), o, w, bias, x and
    a bf16 scale broadcast as a row-wise dropout mask ([B, 1, J, N]) or one value a row."""
    gen = torch.Generator(device=device).manual_seed(seed)
    R = shape[0] * shape[1] * shape[2]

    def rn(*s):
        return torch.randn(*s, generator=gen, device=device)

    g = (2 * rn(R, 520)).bfloat16()[:, 384:512]
    o = rn(R, K).bfloat16()
    w = (rn(N, K) / K**0.5).bfloat16()
    bias = (0.1 * rn(N)).bfloat16()
    x = (2 * rn(*shape, N)).to(x_dtype)
    scale = None
    if scale_kind == "dropout":
        scale = (torch.rand(shape[0], 1, shape[2], N, generator=gen, device=device) > 0.25) / 0.75
    elif scale_kind == "row":
        scale = (torch.rand(*shape, 1, generator=gen, device=device) > 0.1).float()
    scale = None if scale is None else scale.bfloat16()
    return g, o, w, bias, x, scale


def _fp64(g, o, w, bias, x, scale, shape):
    y = ((torch.sigmoid(g.double()) * o.double()) @ w.double().T + bias.double()).view(*shape, N)
    if x is None:
        return y
    return x.double() + (1 if scale is None else scale.double()) * y


def _unfused(g, o, w, bias, x, scale, shape):
    y = F.linear(_gate.forward(g, o), w, bias).view(*shape, N)
    return y if x is None else _residual.forward(x, y, scale)


def _rel(got, want, base=0):
    return ((got.double() - want).norm() / (want - base).norm().clamp_min(1e-300)).item()


def _poison(numel):
    junk = torch.full((numel,), float("nan"), device="cuda")
    del junk  # the caching allocator hands these blocks to the outputs


@requires_gpu
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale_kind", ["dropout", "row", None, "no residual"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_kernel_matches_fp64_and_the_unfused_path(x_dtype, scale_kind, shape):
    g, o, w, bias, x, scale = _inputs(shape, x_dtype, scale_kind, "cuda", seed=sum(shape))
    if scale_kind == "no residual":
        x = None
    full = (*shape, N)
    assert _gated_linear.supported(g, o, w, x, scale, full) == (x is not None)
    _poison(4 * g.shape[0] * N)
    out = _gated_linear.forward(g, o, w, bias, x, scale, full)
    want = _fp64(g, o, w, bias, x, scale, shape)
    assert out.shape == full and out.dtype == (torch.bfloat16 if x is None else x_dtype)
    assert torch.isfinite(out).all()
    base = 0 if x is None else x.double()
    err = _rel(out, want, base)
    err_unfused = _rel(_unfused(g, o, w, bias, x, scale, shape), want, base)
    # the branch to the bf16 floor of its roundings (h, y, and x's dtype), and no worse than
    # the unfused path's
    assert err <= 8 * U, (err, err_unfused)
    assert err <= 1.25 * err_unfused + U / 4, (err, err_unfused)
    assert torch.equal(out, _gated_linear.forward(g, o, w, bias, x, scale, full))


@requires_gpu
def test_nan_rows_stay_in_their_rows():
    shape = (1, 3, 100)
    g, o, w, bias, x, scale = _inputs(shape, torch.float32, "dropout", "cuda", seed=3)
    g[17, 5] = float("nan")
    o[130, :] = float("inf")
    out = _gated_linear.forward(g, o, w, bias, x, scale, (*shape, N)).view(-1, N)
    bad = torch.zeros(300, dtype=torch.bool, device="cuda")
    bad[17] = bad[130] = True
    assert not torch.isfinite(out[bad]).all(dim=-1).any()
    assert torch.isfinite(out[~bad]).all()


def test_reference_matches_the_fp64_formula():
    shape = (2, 3, 5)
    g, o, w, bias, x, scale = _inputs(shape, torch.float32, "dropout", "cpu", seed=11)
    for xx, s in ((x, scale), (None, None)):
        out = _gated_linear.forward(g, o, w, bias, xx, s, (*shape, N))
        want = _fp64(g, o, w, bias, xx, s, shape)
        assert torch.allclose(out.double(), want.to(out.dtype).double(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "change,error",
    [
        (lambda a: a.update(o=a["o"][:, :64]), (NotImplementedError, ValueError)),  # K != 128
        (lambda a: a.update(w=a["w"].float()), (TypeError, ValueError)),
        (lambda a: a.update(w=torch.randn(64, K).bfloat16()), NotImplementedError),
        (lambda a: a.update(x=None), ValueError),  # a scale without a residual
        (lambda a: a.update(x=a["x"].half()), (TypeError, ValueError)),
        (lambda a: a.update(scale=a["scale"].float()), (TypeError, ValueError)),
    ],
)
def test_bad_arguments_raise_clear_errors(change, error):
    shape = (1, 2, 3)
    g, o, w, bias, x, scale = _inputs(shape, torch.float32, "dropout", "cpu", seed=2)
    args = dict(g=g, o=o, w=w, x=x, scale=scale)
    change(args)
    with pytest.raises(error, match="tpf.gated_linear"):
        _gated_linear.forward(
            args["g"], args["o"], args["w"], bias, args["x"], args["scale"], (*shape, N)
        )
