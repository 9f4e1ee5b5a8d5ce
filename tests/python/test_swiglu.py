"""The library's SwiGLU (turbopairformer._swiglu): the CUDA kernels against the FP64 formula on
the same inputs, at odd row counts and every dtype, with NaN inputs, poisoned outputs, a
recomputed activation bitwise equal to the forward's, and the PyTorch path off the GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

from conftest import requires_gpu  # noqa: E402
from turbopairformer import _swiglu  # noqa: E402


def _fp64(x, dy):
    a, b = x.double().chunk(2, -1)
    a.requires_grad_(True)
    b.requires_grad_(True)
    y = torch.nn.functional.silu(a) * b
    y.backward(dy.double())
    return y.detach(), torch.cat([a.grad, b.grad], -1)


def test_pytorch_path_matches_autograd_in_double():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64) * 3
    dy = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    y = _swiglu.forward(x)
    dx, y2 = _swiglu.backward(x, dy)
    ry, rdx = _fp64(x, dy)
    assert torch.allclose(y, ry, rtol=1e-12) and torch.allclose(dx, rdx, rtol=1e-12)
    assert torch.equal(y, y2)


U = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-22}


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows,H", [(1, 8), (7, 24), (100, 512), (333, 64), (70001, 512)])
def test_kernels_match_fp64(dtype, rows, H):
    g = torch.Generator(device="cuda").manual_seed(rows + H)
    x = (torch.randn(rows, 2 * H, generator=g, device="cuda") * 3).to(dtype)
    dy = torch.randn(rows, H, generator=g, device="cuda").to(dtype)
    junk = torch.full((rows, 4 * H), float("nan"), dtype=dtype, device="cuda")
    del junk  # poison the blocks the outputs will reuse
    y = _swiglu.forward(x)
    dx, y2 = _swiglu.backward(x, dy)
    assert torch.equal(y, y2)  # the recomputed activation is the forward's, bit for bit
    ry, rdx = _fp64(x, dy)
    for got, want in ((y, ry), (dx, rdx)):
        got = got.double()
        assert torch.isfinite(got).all()
        assert (got - want).norm() <= 2 * U[dtype] * want.norm() + 1e-30
        assert ((got - want).abs() <= 4 * U[dtype] * want.abs() + 1e-6).all()
    dx2, _ = _swiglu.backward(x, dy)
    assert torch.equal(dx, dx2)


@requires_gpu
def test_kernels_keep_nans_in_place():
    x = torch.randn(100, 64, device="cuda", dtype=torch.bfloat16)
    x[3, 5] = float("nan")  # a of channel 5 in row 3
    dy = torch.randn(100, 32, device="cuda", dtype=torch.bfloat16)
    y = _swiglu.forward(x)
    dx, _ = _swiglu.backward(x, dy)
    bad = torch.isnan(y.float())
    assert bad[3, 5] and bad.sum() == 1
    assert torch.isnan(dx[3, 5].float()) and torch.isnan(dx[3, 37].float())
    assert torch.isnan(dx.float()).sum() == 2
