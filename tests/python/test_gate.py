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


def _ending_delta(B, I, J, H, dtype=torch.float32, device="cpu"):
    """The [B, I, J, H] view of a poisoned [B, S=J, H, N=I] Dlt, as the ending node's layer
    passes it to the gate."""
    delta = torch.full((B, J, H, I), float("nan"), dtype=dtype, device=device)
    return delta.permute(0, 3, 1, 2)


def _delta_fp64(d_o, o, res, B, I, J, H):
    full = o.double() + (0 if res is None else res.double())
    return (d_o.double() * full).view(B, I, J, H, -1).sum(-1)


def test_pytorch_path_gives_each_heads_delta():
    gen = torch.Generator().manual_seed(3)
    B, I, J, H, D = 1, 3, 5, 2, 4
    g, o, res, dy = (
        torch.randn(B * I * J, H * D, generator=gen, dtype=torch.float64) for _ in range(4)
    )
    view = _ending_delta(B, I, J, H, dtype=torch.float64)
    _, d_o, _ = _gate.backward(g, o, dy, res=res, delta=view)
    assert torch.allclose(view, _delta_fp64(d_o, o, res, B, I, J, H), rtol=1e-12)


@requires_gpu
@pytest.mark.parametrize(
    "N,H,D,with_res", [(1, 4, 32, True), (7, 4, 32, False), (100, 2, 16, True), (333, 4, 32, True)]
)
def test_kernel_delta_matches_fp64(N, H, D, with_res):
    """Each head's Dlt from the gate's kernel against FP64 on the same bf16 values, written
    through the ending node's strides into a poisoned tensor, a NaN kept to its own head."""
    gen = torch.Generator(device="cuda").manual_seed(N + D)
    B, R, W = 1, N * N, H * D

    def rnd():
        return torch.randn(R, W, generator=gen, device="cuda").to(torch.bfloat16)

    g, o, dy = rnd(), rnd(), rnd()
    o[R - 1, D + 1] = float("nan")  # the last row's second head
    res = (rnd() * 2.0**-9).to(torch.bfloat16) if with_res else None
    view = _ending_delta(B, N, N, H, device="cuda")
    _, d_o, _ = _gate.backward(g, o, dy, res=res, delta=view)
    want = _delta_fp64(d_o, o, res, B, N, N, H)
    got = view.double()
    nan = torch.zeros_like(got, dtype=torch.bool)
    nan[0, N - 1, N - 1, 1] = True
    assert torch.equal(torch.isnan(got), nan)  # every other element written, and finite
    # a recursive fp32 sum of D products (o + res rounded once): at most D roundings a term
    terms = (d_o.double() * (o.double() + (0 if res is None else res.double()))).abs()
    bound = D * 2.0**-24 * terms.view(B, N, N, H, D).sum(-1)
    assert ((got - want).abs()[~nan] <= bound[~nan]).all()


@requires_gpu
@pytest.mark.parametrize(
    "N,D,starting", [(7, 32, True), (100, 16, False), (136, 32, True), (136, 32, False)]
)
def test_attention_backward_reads_the_gates_delta_bit_for_bit(N, D, starting):
    """The attention layer's backward takes Dlt from the gate's kernel; the attention's
    gradients must be the ones it computes with its own Dlt, bit for bit (one-pass D = 16 and
    N = 7, 100; the two-pass kernels at N = 136)."""
    from turbopairformer import attention
    from turbopairformer._attention_layer import _slice_order

    gen = torch.Generator(device="cuda").manual_seed(N * D + starting)
    B, H = 1, 4
    to, _ = _slice_order(starting)

    def layer(scale=1.0):  # [B, I, J, H, D] in the layer's row order
        return (torch.randn(B, N, N, H, D, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    q, k, v = layer(), layer(), layer()
    bias = torch.randn(B, 1, H, N, N, generator=gen, device="cuda").to(torch.bfloat16)
    mask = torch.rand(B, N, 1, 1, N, generator=gen, device="cuda") > 0.2
    mask[:, 0] = False  # a fully masked slice
    out, res = layer(), layer()
    lse = torch.empty(B, N, H, N, device="cuda")
    scale = D**-0.5
    attention.forward_into(
        *(t.permute(to) for t in (q, k, v)),
        bias,
        mask,
        scale,
        True,
        out.permute(to),
        res.permute(to),
        lse,
    )
    R, W = B * N * N, H * D
    g = torch.randn(R, W, generator=gen, device="cuda").to(torch.bfloat16)
    dy = torch.randn(R, W, generator=gen, device="cuda").to(torch.bfloat16)
    delta = torch.full((B, N, H, N), float("nan"), device="cuda")
    view = delta.permute((0, 1, 3, 2) if starting else (0, 3, 1, 2))
    _, d_o, _ = _gate.backward(g, out.view(R, W), dy, res=res.view(R, W), delta=view)
    grads = []
    for given in (None, delta):
        dq, dk, dv = (torch.full_like(q, float("nan")).permute(to) for _ in range(3))
        dbias = torch.full_like(bias, float("nan"))
        attention.backward_into(
            d_o.view(q.shape).permute(to), *(t.permute(to) for t in (q, k, v)), bias, mask,
            out.permute(to), res.permute(to), lse, scale, True, dq, dk, dv, dbias, given,
        )  # fmt: skip
        grads.append((dq, dk, dv, dbias))
    for own, read in zip(*grads):
        assert not torch.isnan(own.float()).any()
        assert torch.equal(own, read)
