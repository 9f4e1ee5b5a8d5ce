"""The fused SwiGLU transition forward (turbopairformer._transition): the CUDA kernel against the
FP64 formula and against the unfused bf16 path on the same inputs, at odd row counts (partial
tiles, one row, several tiles a block), fp32 and bf16 x, with and without the residual and a
row scale, NaN rows, poisoned outputs and repeat runs; the FP64 CPU reference and the argument
checks off the GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

from conftest import requires_gpu  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import turbopairformer as tpf  # noqa: E402
from turbopairformer import _swiglu, _transition  # noqa: E402

C = 128
U = 2.0**-8  # bf16 unit roundoff


def _inputs(shape, H, x_dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(*shape, C, generator=g, device=device) * 2 + 0.5).to(x_dtype)
    ln_w = 1 + 0.2 * torch.randn(C, generator=g, device=device)
    ln_b = 0.2 * torch.randn(C, generator=g, device=device)
    wab = (torch.randn(2 * H, C, generator=g, device=device) / C**0.5).bfloat16()
    wo = (torch.randn(C, H, generator=g, device=device) / H**0.5).bfloat16()
    scale = (torch.rand(shape, generator=g, device=device) > 0.2).float()
    return x, ln_w, ln_b, wab, wo, scale


def _fp64(x, ln_w, ln_b, eps, wab, wo, residual, scale):
    xd = x.double()
    xh = F.layer_norm(xd, [C], ln_w.double(), ln_b.double(), eps)
    a, b = (xh @ wab.double().T).chunk(2, -1)
    y = (F.silu(a) * b) @ wo.double().T
    if residual:
        y = xd + (1 if scale is None else scale.double().unsqueeze(-1)) * y
    return y, xh


def _unfused(x, ln_w, ln_b, eps, wab, wo, residual, scale):
    """Today's unfused bf16 path: the same roundings, separate kernels."""
    xh = F.layer_norm(x.float(), [C], ln_w, ln_b, eps).bfloat16()
    y = F.linear(_swiglu.forward(F.linear(xh, wab)), wo)
    if residual:
        y = (x.float() + (1 if scale is None else scale.unsqueeze(-1)) * y.float()).to(x.dtype)
    return y


def _fp64_backward(xhat, g, wab, wo):
    a, b = (xhat.double() @ wab.double().T).chunk(2, -1)
    dh = g.double() @ wo.double()
    s = torch.sigmoid(a)
    da, db = dh * b * s * (1 + a * (1 - s)), dh * a * s
    dab = torch.cat([da, db], -1)
    return a * s * b, dab, dab @ wab.double()


def _unfused_backward(xhat, g, wab, wo):
    dab, h = _swiglu.backward(F.linear(xhat, wab), g @ wo)
    return h, dab, dab @ wab


def _rel(got, want, base):
    return ((got.double() - want).norm() / (want - base).norm().clamp_min(1e-300)).item()


@requires_gpu
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("residual,with_scale", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize(
    "shape,H",
    [((1,), 64), ((1, 7, 7), 512), ((333,), 128), ((100, 100), 512), ((3, 160, 160), 512)],
)
def test_kernel_matches_fp64_and_the_unfused_path(x_dtype, residual, with_scale, shape, H):
    eps = 1e-5
    x, ln_w, ln_b, wab, wo, scale = _inputs(shape, H, x_dtype, "cuda", seed=len(shape) * 1000 + H)
    scale = scale if with_scale else None
    junk = torch.full((x.numel() * 4,), float("nan"), device="cuda")
    del junk  # poison the blocks the outputs will reuse
    out, xhat, mean, rstd = _transition.forward(x, ln_w, ln_b, eps, wab, wo, residual, scale)
    ref, ref_xh = _fp64(x, ln_w, ln_b, eps, wab, wo, residual, scale)
    base = x.double() if residual else torch.zeros_like(ref)
    if residual and with_scale:
        base = base + 0 * scale.unsqueeze(-1)
    assert out.dtype == (x_dtype if residual else torch.bfloat16) and out.shape == x.shape
    assert torch.isfinite(out).all() and torch.isfinite(xhat).all()
    # the branch (out - x where residual) to the bf16 floor of its roundings, and no worse
    # than the unfused path's
    err = _rel(out, ref, base)
    err_unfused = _rel(_unfused(x, ln_w, ln_b, eps, wab, wo, residual, scale), ref, base)
    assert err <= 8 * U, (err, err_unfused)
    assert err <= 1.25 * err_unfused + U / 4, (err, err_unfused)
    assert ((xhat.double() - ref_xh).abs() <= 2 * U * ref_xh.abs() + 1e-5).all()
    xd = x.double().reshape(-1, C)
    assert torch.allclose(mean.double(), xd.mean(-1), rtol=1e-5, atol=1e-5)
    want_rstd = (xd.var(-1, unbiased=False) + eps).rsqrt()
    assert torch.allclose(rstd.double(), want_rstd, rtol=1e-5)
    again = _transition.forward(x, ln_w, ln_b, eps, wab, wo, residual, scale)
    for a, b in zip((out, xhat, mean, rstd), again):
        assert torch.equal(a, b)  # bitwise repeatable


@requires_gpu
@pytest.mark.parametrize(
    "shape,H",
    [((1,), 64), ((1, 7, 7), 512), ((333,), 128), ((100, 100), 512), ((3, 160, 160), 512)],
)
def test_backward_kernel_matches_fp64_and_the_unfused_path(shape, H):
    x, ln_w, ln_b, wab, wo, _ = _inputs(shape, H, torch.float32, "cuda", seed=7 + H)
    xhat = F.layer_norm(x, [C], ln_w, ln_b).bfloat16()
    g = (torch.randn(*shape, C, device="cuda") * 0.3).bfloat16()
    junk = torch.full((x.numel() * 16,), float("nan"), device="cuda")
    del junk  # poison the blocks the outputs will reuse
    got = _transition.backward(xhat, g, wab, wo)
    want = _fp64_backward(xhat, g, wab, wo)
    unfused = _unfused_backward(xhat, g, wab, wo)
    for name, t, w, u in zip(("h", "dab", "dxhat"), got, want, unfused):
        assert t.dtype == torch.bfloat16 and t.shape == w.shape and torch.isfinite(t).all(), name
        err, err_unfused = _rel(t, w, 0), _rel(u, w, 0)
        assert err <= 8 * U, (name, err, err_unfused)
        assert err <= 1.25 * err_unfused + U / 4, (name, err, err_unfused)
    for a, b in zip(got, _transition.backward(xhat, g, wab, wo)):
        assert torch.equal(a, b)  # bitwise repeatable


@requires_gpu
def test_module_gradients_match_the_unfused_path_and_repeat_bitwise():
    N = 50
    m = tpf.SwiGLUTransition(C, 4).cuda()
    x0 = torch.randn(1, N, N, C, device="cuda")
    mask = (torch.rand(1, N, N, device="cuda") > 0.1).float()
    g = torch.randn_like(x0)

    def run(fused):
        orig = _transition.supported
        _transition.supported = orig if fused else (lambda *a: False)
        try:
            x = x0.clone().requires_grad_(True)
            m.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = m.residual_update(x, mask)
            y.backward(g)
            return [y.detach(), x.grad] + [p.grad.clone() for p in m.parameters()]
        finally:
            _transition.supported = orig

    fused, again, unfused = run(True), run(True), run(False)
    for a, b in zip(fused, again):
        assert torch.equal(a, b)
    for a, b in zip(fused, unfused):
        assert ((a - b).norm() / b.norm()).item() <= 4 * U


@requires_gpu
def test_nan_rows_stay_in_their_rows():
    x, ln_w, ln_b, wab, wo, scale = _inputs((300,), 512, torch.float32, "cuda", seed=3)
    x[17, 5] = float("nan")
    x[130, :] = float("inf")
    out, xhat, mean, rstd = _transition.forward(x, ln_w, ln_b, 1e-5, wab, wo, True, scale)
    bad = torch.zeros(300, dtype=torch.bool, device="cuda")
    bad[17] = bad[130] = True
    assert torch.isnan(out[bad]).all(dim=-1).any() or not torch.isfinite(out[bad]).all()
    assert torch.isfinite(out[~bad]).all() and torch.isfinite(xhat[~bad]).all()


@requires_gpu
def test_module_saves_no_hidden_activation_on_the_fused_path():
    """The pair transition's node under bf16 autocast keeps x, xhat (bf16) and the statistics;
    neither the stacked up projection [N, N, 8C] nor the activation [N, N, 4C]."""
    N = 40
    m = tpf.SwiGLUTransition(C, 4).cuda()
    x = torch.randn(1, N, N, C, device="cuda", requires_grad=True)
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m.residual_update(x, torch.ones(1, N, N, device="cuda"))
    sizes = [t.numel() for t in seen]
    assert not [s for s in sizes if s in (N * N * 8 * C, N * N * 4 * C)], sizes
    assert [t.dtype for t in seen if t.numel() == N * N * C].count(torch.bfloat16) == 1
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_reference_matches_the_fp64_formula():
    x, ln_w, ln_b, wab, wo, scale = _inputs((2, 5), 64, torch.float32, "cpu", seed=11)
    for residual, s in ((True, scale), (False, None)):
        out, xhat, mean, rstd = _transition.forward(x, ln_w, ln_b, 1e-5, wab, wo, residual, s)
        ref, ref_xh = _fp64(x, ln_w, ln_b, 1e-5, wab, wo, residual, s)
        assert torch.allclose(out.double(), ref.to(out.dtype).double(), rtol=1e-6, atol=1e-6)
        assert torch.allclose(xhat.double(), ref_xh, rtol=2 * U, atol=1e-6)


def test_backward_reference_matches_the_fp64_formula():
    x, ln_w, ln_b, wab, wo, _ = _inputs((3, 2), 64, torch.float32, "cpu", seed=12)
    xhat = F.layer_norm(x, [C], ln_w, ln_b).bfloat16()
    g = torch.randn(3, 2, C).bfloat16()
    got = _transition.backward(xhat, g, wab, wo)
    for t, w in zip(got, _fp64_backward(xhat, g, wab, wo)):
        assert torch.allclose(t.double(), w, rtol=2 * U, atol=1e-3 * w.abs().max().item())


@pytest.mark.parametrize(
    "change,error",
    [
        (lambda a: a.update(x=torch.randn(4, 64)), NotImplementedError),  # C != 128
        (
            lambda a: a.update(wab=torch.randn(96, C).bfloat16(), wo=torch.randn(C, 48).bfloat16()),
            NotImplementedError,
        ),
        (lambda a: a.update(wab=a["wab"].float()), (TypeError, ValueError)),
        (lambda a: a.update(wo=a["wo"][:, :32].contiguous()), ValueError),
        (lambda a: a.update(scale=torch.ones(3)), ValueError),
        (lambda a: a.update(x=a["x"].half()), (TypeError, ValueError)),
    ],
)
def test_bad_arguments_raise_clear_errors(change, error):
    x, ln_w, ln_b, wab, wo, scale = _inputs((4,), 64, torch.float32, "cpu", seed=2)
    args = dict(x=x, wab=wab, wo=wo, scale=scale)
    change(args)
    with pytest.raises(error, match="tpf.transition"):
        _transition.forward(
            args["x"], ln_w, ln_b, 1e-5, args["wab"], args["wo"], True, args["scale"]
        )


@requires_gpu
def test_node_custom_op_passes_opcheck():
    """The eager node's custom op: opcheck's schema, fake-tensor and autograd checks."""
    N = 24
    m = tpf.SwiGLUTransition(C, 4).cuda()
    x0 = torch.randn(1, N, N, C, device="cuda", requires_grad=True)
    scale = (torch.rand(1, N, N, 1, device="cuda") > 0.1).bfloat16()
    sw = m.swiglu
    args = (x0, m.layer_norm.weight, m.layer_norm.bias, sw.linear_a.weight,
            sw.linear_b.weight, m.linear_out.weight, scale, 1e-5, True)  # fmt: skip
    torch.library.opcheck(_transition.node, args)


@requires_gpu
def test_an_unaligned_view_takes_the_unfused_path():
    base = torch.randn(1 + 7 * 7 * C, device="cuda")
    x = base[1:].view(1, 7, 7, C)  # contiguous, 4 bytes past a 16-byte boundary
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    assert not _transition.supported(x, 4 * C, torch.bfloat16, None)
    assert _transition.supported(x.clone(), 4 * C, torch.bfloat16, None)
    m = tpf.SwiGLUTransition(C, 4).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x)
    assert torch.isfinite(y).all()
