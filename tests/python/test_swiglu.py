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


def _blocked_fp64(u, wa, wb, g, wo):
    """The fused projections' FP64 oracle: x = u [wa | wb]ᵀ and dy = g wo."""
    return u.double() @ torch.cat([wa, wb]).double().t(), g.double() @ wo.double()


def test_project_pytorch_path_matches_the_gemm_then_the_activation():
    g = torch.Generator().manual_seed(2)
    u, gr = (torch.randn(3, 5, 24, generator=g, dtype=torch.float64) for _ in range(2))
    wa, wb = (torch.randn(64, 24, generator=g, dtype=torch.float64) for _ in range(2))
    wo = torch.randn(24, 64, generator=g, dtype=torch.float64)
    x, y = _swiglu.project(u, wa, wb)
    dx, y2 = _swiglu.project_backward(x, gr, wo)
    rx, rdy = _blocked_fp64(u, wa, wb, gr, wo)
    ry, rdx = _fp64(rx, rdy)
    for got, want in ((x, rx), (y, ry), (dx, rdx)):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    assert torch.equal(y, y2)


def test_blocked_alternates_64_row_blocks():
    wa = torch.arange(128).repeat_interleave(2).reshape(128, 2).float()
    w = _swiglu.blocked(wa, -wa)
    assert torch.equal(w[:64], wa[:64]) and torch.equal(w[64:128], -wa[:64])
    assert torch.equal(w[128:192], wa[64:]) and torch.equal(w[192:], -wa[64:])


@requires_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,C,H", [(1, 128, 64), (7, 40, 128), (100, 128, 512), (333, 64, 192), (70001, 128, 512)]
)
def test_fused_projections_match_fp64(dtype, rows, C, H):
    gen = torch.Generator(device="cuda").manual_seed(rows + C + H)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device="cuda") * scale).to(dtype)

    u, g = rnd(rows, C), rnd(rows, C)
    wa, wb, wo = rnd(H, C, scale=C**-0.5), rnd(H, C, scale=C**-0.5), rnd(C, H, scale=H**-0.5)
    junk = torch.full((rows, 8 * H), float("nan"), dtype=dtype, device="cuda")
    del junk  # poison the blocks the outputs will reuse
    x, y = _swiglu.project(u, wa, wb)
    dx, y2 = _swiglu.project_backward(x, g, wo)
    rx, rdy = _blocked_fp64(u, wa, wb, g, wo)
    # y and dx are taken from x as the kernel stored it; x's own error is its rounding
    ry, rdx = _fp64(x, rdy)
    assert torch.equal(y, y2) and torch.equal(y, _swiglu.forward(x))
    for got, want in ((x, rx), (y, ry), (dx, rdx)):
        got = got.double()
        assert torch.isfinite(got).all()
        tol = 4 * U[dtype] * want.abs() + 1e-5 * want.abs().max()  # + fp32 accumulation
        assert (got - want).norm() <= 2 * U[dtype] * want.norm() + 1e-30
        assert ((got - want).abs() <= tol).all()
    x2, _ = _swiglu.project(u, wa, wb)
    dx2, _ = _swiglu.project_backward(x, g, wo)
    assert torch.equal(x, x2) and torch.equal(dx, dx2)


@requires_gpu
def test_fused_projections_keep_nans_in_their_rows():
    u = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    wa, wb = (torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) * 0.1 for _ in range(2))
    wo = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16) * 0.1
    u[3, 5] = float("nan")
    g[200, 7] = float("nan")
    x, y = _swiglu.project(u, wa, wb)
    assert torch.isnan(x[3].float()).all() and torch.isnan(y[3].float()).all()
    assert torch.isnan(x.float()).sum() == 256 and torch.isnan(y.float()).sum() == 128
    dx, _ = _swiglu.project_backward(x, g, wo)
    bad = torch.isnan(dx.float()).any(-1)
    assert bad[3] and bad[200] and bad.sum() == 2


@requires_gpu
def test_fused_projections_take_strided_inputs_on_the_pytorch_path():
    u = torch.randn(64, 2, 128, device="cuda", dtype=torch.bfloat16)[:, 0]  # rows 256 apart
    wa, wb = (torch.randn(64, 128, device="cuda", dtype=torch.bfloat16) * 0.1 for _ in range(2))
    x, y = _swiglu.project(u, wa, wb)
    xc, _ = _swiglu.project(u.contiguous(), wa, wb)
    assert (x.float() - xc.float()).abs().max() <= 2 * U[torch.bfloat16] * xc.float().abs().max()
    assert torch.equal(y, _swiglu.forward(x))
