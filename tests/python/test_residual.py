"""The library's residual update (turbopairformer._residual): the CUDA kernels against the FP64
formula on the same inputs, for every scale form the pair stack uses (a dropout mask shared
along rows or along columns, a row mask broadcast over channels, none), every built dtype pair,
odd sizes, NaN inputs and poisoned outputs; the PyTorch path off the GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

from conftest import requires_gpu  # noqa: E402
from turbopairformer import _residual  # noqa: E402

SCALES = {
    "rows": lambda B, N, C: (B, 1, N, C),  # one mask for every row i (dim -3)
    "cols": lambda B, N, C: (B, N, 1, C),  # one mask for every column j (dim -2)
    "rowmask": lambda B, N, C: (B, N, N, 1),  # the transition's pair mask
    "none": None,
}


def _scale(kind, B, N, C, dtype, device, gen):
    if SCALES[kind] is None:
        return None
    keep = torch.rand(SCALES[kind](B, N, C), generator=gen, device=device) < 0.75
    return (keep.double() / 0.75).to(dtype)


def test_pytorch_path_is_the_formula():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(2, 5, 5, 8, generator=gen, dtype=torch.float64)
    u = torch.randn(2, 5, 5, 8, generator=gen, dtype=torch.float64)
    s = _scale("rows", 2, 5, 8, torch.float64, "cpu", gen)
    assert torch.allclose(_residual.forward(z, u, s), z + s * u, rtol=1e-14)
    assert torch.equal(_residual.backward(u, s, torch.float64), u * s)
    assert torch.equal(_residual.forward(z, u), z + u)


PAIRS = [
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
]
U = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-23}


@requires_gpu
@pytest.mark.parametrize("kind", list(SCALES))
@pytest.mark.parametrize("zd,ud", PAIRS)
@pytest.mark.parametrize("B,N,C", [(1, 1, 8), (1, 7, 16), (2, 100, 128), (1, 333, 32)])
def test_kernels_match_fp64(kind, zd, ud, B, N, C):
    gen = torch.Generator(device="cuda").manual_seed(N + C)
    junk = torch.full((4 * B * N * N * C,), float("nan"), device="cuda")
    del junk  # poison the blocks the outputs will reuse
    z = (torch.randn(B, N, N, C, generator=gen, device="cuda") * 4).to(zd)
    u = torch.randn(B, N, N, C, generator=gen, device="cuda").to(ud)
    dout = torch.randn(B, N, N, C, generator=gen, device="cuda").to(zd)
    s = _scale(kind, B, N, C, ud, "cuda", gen)
    assert _residual._on_kernel(z, ud, s)
    out = _residual.forward(z, u, s)
    du = _residual.backward(dout, s, ud)
    sd = 1.0 if s is None else s.double()
    want_out = z.double() + sd * u.double()
    want_du = (dout.double() * sd).expand(du.shape)
    assert out.dtype == zd and du.dtype == ud
    bound = z.double().abs() + (sd * u.double()).abs()
    assert ((out.double() - want_out).abs() <= U[zd] * bound + 1e-30).all()
    # (+ 2^-25: half the quantum of fp16's subnormals, which randn reaches)
    assert ((du.double() - want_du).abs() <= U[ud] * want_du.abs() + 2.0**-25).all()
    assert torch.equal(_residual.forward(z, u, s), out)


@requires_gpu
def test_kernels_keep_nans_in_place():
    z = torch.randn(1, 9, 9, 16, device="cuda")
    u = torch.randn(1, 9, 9, 16, device="cuda", dtype=torch.bfloat16)
    s = torch.ones(1, 1, 9, 16, device="cuda", dtype=torch.bfloat16)
    z[0, 2, 3, 4] = float("nan")
    u[0, 5, 1, 7] = float("nan")
    out = _residual.forward(z, u, s)
    assert (
        torch.isnan(out[0, 2, 3, 4])
        and torch.isnan(out[0, 5, 1, 7])
        and torch.isnan(out).sum() == 2
    )
    dout = torch.randn(1, 9, 9, 16, device="cuda")
    dout[0, 8, 8, 15] = float("nan")
    du = _residual.backward(dout, s, torch.bfloat16)
    assert torch.isnan(du[0, 8, 8, 15].float()) and torch.isnan(du.float()).sum() == 1
