"""The library's sigmoid gate (turbopairformer._gate): the CUDA kernels against the FP64 formula
on the same inputs, at odd row counts and every dtype, on strided rows (g and dg as column
blocks of a wider tensor, as the attention layer passes them), with NaN inputs, poisoned
outputs, the columns outside dg left untouched, a recomputed y bitwise equal to the forward's,
and the PyTorch path off the GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

from conftest import requires_gpu  # noqa: E402
from turbopairformer import _gate  # noqa: E402


def _fp64(g, o, dy):
    g, o = (t.double().requires_grad_(True) for t in (g, o))
    y = torch.sigmoid(g) * o
    y.backward(dy.double())
    return y.detach(), g.grad, o.grad


def test_pytorch_path_matches_autograd_in_double():
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(7, 20, generator=gen, dtype=torch.float64) * 3
    g, o = wide[:, 4:12], torch.randn(7, 8, generator=gen, dtype=torch.float64)
    dy = torch.randn(7, 8, generator=gen, dtype=torch.float64)
    dwide = torch.full_like(wide, 7.0)
    y = _gate.forward(g, o)
    dg, d_o, y2 = _gate.backward(g, o, dy, dwide[:, 4:12])
    ry, rdg, rdo = _fp64(g, o, dy)
    assert torch.allclose(y, ry, rtol=1e-12) and torch.equal(y, y2)
    assert dg.data_ptr() == dwide[:, 4:12].data_ptr()
    assert torch.allclose(dwide[:, 4:12], rdg, rtol=1e-12) and torch.allclose(d_o, rdo, rtol=1e-12)
    assert (dwide[:, :4] == 7).all() and (dwide[:, 12:] == 7).all()


U = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-22}


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "rows,W,pad", [(1, 8, 0), (7, 24, 8), (100, 128, 392), (333, 64, 16), (70001, 128, 8)]
)
def test_kernels_match_fp64_on_strided_rows(dtype, rows, W, pad):
    gen = torch.Generator(device="cuda").manual_seed(rows + W)
    junk = torch.full((rows, 8 * (W + pad)), float("nan"), dtype=dtype, device="cuda")
    del junk  # poison the blocks the outputs will reuse
    wide = (torch.randn(rows, W + pad, generator=gen, device="cuda") * 3).to(dtype)
    g = wide[:, pad:]  # row stride W + pad
    o = torch.randn(rows, W, generator=gen, device="cuda").to(dtype)
    dy = torch.randn(rows, W, generator=gen, device="cuda").to(dtype)
    dwide = torch.full_like(wide, 5.0)
    y = _gate.forward(g, o)
    dg, d_o, y2 = _gate.backward(g, o, dy, dwide[:, pad:])
    assert torch.equal(y, y2)  # the recomputed y is the forward's, bit for bit
    assert (dwide[:, :pad] == 5).all()  # nothing written outside dg's columns
    ry, rdg, rdo = _fp64(g, o, dy)
    for got, want in ((y, ry), (dg, rdg), (d_o, rdo)):
        got = got.double()
        assert torch.isfinite(got).all()
        assert (got - want).norm() <= 2 * U[dtype] * want.norm() + 1e-30
        assert ((got - want).abs() <= 4 * U[dtype] * want.abs() + 1e-6).all()
    dg2, d_o2, _ = _gate.backward(g, o, dy)
    assert torch.equal(dg, dg2) and torch.equal(d_o, d_o2)


@requires_gpu
def test_kernels_keep_nans_in_place():
    g = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    o = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    g[3, 5] = float("nan")
    o[9, 1] = float("nan")
    dy = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    y = _gate.forward(g, o)
    dg, d_o, _ = _gate.backward(g, o, dy)
    bad = torch.isnan(y.float())
    assert bad[3, 5] and bad[9, 1] and bad.sum() == 2
    assert torch.isnan(dg[3, 5].float()) and torch.isnan(dg[9, 1].float())
    assert torch.isnan(dg.float()).sum() == 2
    assert torch.isnan(d_o[3, 5].float()) and torch.isnan(d_o.float()).sum() == 1
