"""turbopairformer.layers: each fused projection against the same PyTorch ops under autograd,
outputs and every gradient, in fp64 (exact up to summation order) and under bf16 autocast (the
training configuration, where both sides round at the same places)."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")
from torch import nn  # noqa: E402

from conftest import requires_gpu  # noqa: E402
from turbopairformer.layers import gated_linear, layer_norm, norm_linear, swiglu_transition  # noqa: E402


def _layers(C, widths, bias, dtype, seed):
    torch.manual_seed(seed)
    norm = nn.LayerNorm(C).to(dtype)
    lins = [nn.Linear(C, w, bias=bias and i % 2 == 0).to(dtype) for i, w in enumerate(widths)]
    with torch.no_grad():
        norm.weight.add_(0.3 * torch.randn_like(norm.weight))
        norm.bias.add_(0.3 * torch.randn_like(norm.bias))
    return norm, lins


def _grads(tensors):  # an unused layer's weights: None on one side, zeros on the other
    return [torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in tensors]


def _check(fused, plain, inputs, params, rtol, atol):
    """The fused and the plain function of the same inputs: outputs and every gradient."""
    outs = []
    for fn in (fused, plain):
        for t in (*inputs, *params):
            t.grad = None
        out = fn()
        g = torch.Generator(device=out.device).manual_seed(7)
        w = torch.randn(out.shape, generator=g, dtype=torch.float32, device=out.device)
        (out.float() * w).sum().backward()
        outs.append((out.detach().float(), _grads((*inputs, *params))))
    (a, ga), (b, gb) = outs
    for x, y in zip((a, *ga), (b, *gb)):  # relative to each tensor's scale (sums of roundings)
        x, y = x.double(), y.double()
        assert (x - y).norm() <= rtol * y.norm()
        assert (x - y).abs().max() <= atol * y.abs().max()


U = 2.0**-8  # bf16's unit roundoff: both sides round the same products, in different orders
CASES = [  # (device, autocast dtype or None, relative-norm tolerance, max-abs tolerance / max)
    ("cpu", None, 1e-12, 1e-11),
    ("cpu", torch.bfloat16, 4 * U, 16 * U),
    pytest.param("cuda", torch.bfloat16, 4 * U, 16 * U, marks=requires_gpu),
]


def _ctx(device, dtype):
    return torch.autocast(device, dtype=dtype, enabled=dtype is not None)


@pytest.mark.parametrize("device,amp,rtol,atol", CASES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("C", [24, 128])  # on CUDA, 128 runs the library's LayerNorm kernel
def test_norm_linear_matches_layer_norm_then_linears(device, amp, rtol, atol, bias, C):
    dtype = torch.float64 if amp is None else torch.float32
    norm, lins = _layers(C, (16, 8, 3), bias, dtype, seed=1)
    norm, lins = norm.to(device), [l.to(device) for l in lins]
    # a non-contiguous input (the transposed pair tensor of an ending node)
    x0 = torch.randn(2, 7, 5, C, dtype=dtype, device=device).requires_grad_(True)
    x = x0.transpose(1, 2)
    params = [*norm.parameters(), *[p for l in lins for p in l.parameters()]]

    def fused(use=(0, 2)):  # the middle output unused: its gradient arrives as None
        with _ctx(device, amp):
            outs = norm_linear(x, norm, lins, pad_to=8)
            return torch.cat([outs[i].float() for i in use], -1)

    def plain(use=(0, 2)):
        with _ctx(device, amp):
            y = norm(x)
            return torch.cat([lins[i](y).float() for i in use], -1)

    _check(fused, plain, [x0], params, rtol, atol)
    with _ctx(device, amp):
        outs = norm_linear(x, norm, lins, pad_to=8)
    assert [o.shape[-1] for o in outs] == [16, 8, 3]
    assert all(o.stride(-2) % 8 == 0 for o in outs)  # rows padded to 27 -> 32 columns


@pytest.mark.parametrize("device,amp,rtol,atol", CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_gated_linear_matches_sigmoid_gate_then_linear(device, amp, rtol, atol, bias):
    dtype = torch.float64 if amp is None else torch.float32
    torch.manual_seed(2)
    lin = nn.Linear(12, 10, bias=bias).to(device, dtype)
    g = torch.randn(3, 5, 3, 4, dtype=dtype, device=device).requires_grad_(True)
    o = torch.randn(3, 3, 5, 4, dtype=dtype, device=device).requires_grad_(True)

    def fused():
        with _ctx(device, amp):
            return gated_linear(g, o.transpose(1, 2), lin)

    def plain():
        with _ctx(device, amp):
            return lin((torch.sigmoid(g) * o.transpose(1, 2)).flatten(-2))

    _check(fused, plain, [g, o], list(lin.parameters()), rtol, atol)


@pytest.mark.parametrize("device,amp,rtol,atol", CASES)
def test_norm_linear_split_outputs_take_strided_gradients(device, amp, rtol, atol):
    """Outputs split to [*, h, c] and used through a permutation (as the attention kernel reads
    q, k, v): the same values and gradients as the plain ops."""
    dtype = torch.float64 if amp is None else torch.float32
    norm, lins = _layers(16, (12, 12, 2), False, dtype, seed=4)
    norm, lins = norm.to(device), [l.to(device) for l in lins]
    x = torch.randn(2, 5, 5, 16, dtype=dtype, device=device).requires_grad_(True)
    params = [*norm.parameters(), *[l.weight for l in lins]]

    def use(a, b, c):  # a, b: [*, 3, 4] read slice-major; c: [*, 2]
        return torch.cat([(a.permute(0, 1, 3, 2, 4) * 2).flatten(1), b.flatten(1), c.flatten(1)], 1)

    def fused():
        with _ctx(device, amp):
            a, b, c = norm_linear(x, norm, lins, pad_to=8, splits=[(3, 4), (3, 4), None])
            assert a.shape[-2:] == (3, 4) and c.shape[-1] == 2
            return use(a.float(), b.float(), c.float())

    def plain():
        with _ctx(device, amp):
            y = norm(x)
            a, b, c = (l(y).float() for l in lins)
            return use(a.unflatten(-1, (3, 4)), b.unflatten(-1, (3, 4)), c)

    _check(fused, plain, [x], params, rtol, atol)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_gpu)])
def test_layers_at_one_pair_and_with_a_nan_row(device):
    """N = 1 (one pair), and a NaN in one pair's input: that pair's outputs and the gradients
    that depend on it are NaN, the other pairs' outputs stay finite (nothing hidden, nothing
    spread)."""
    norm, lins = _layers(8, (8, 8), True, torch.float32, seed=5)
    norm, lins = norm.to(device), [l.to(device) for l in lins]
    out_layer = nn.Linear(8, 8).to(device)
    for N in (1, 3):
        x = torch.randn(1, N, N, 8, device=device)
        if N == 3:
            x[0, 1, 2, 5] = float("nan")
        x.requires_grad_(True)
        with torch.autocast(device, dtype=torch.bfloat16):
            g, o = norm_linear(x, norm, lins, pad_to=8, splits=[(2, 4), (2, 4)])
            y = gated_linear(g, o, out_layer)
        assert y.shape == (1, N, N, 8)
        y.float().sum().backward()
        bad = torch.isnan(y.float()).any(-1)
        if N == 1:
            assert not bad.any() and torch.isfinite(x.grad).all()
        else:
            assert bad[0, 1, 2] and bad.sum() == 1
            assert torch.isnan(x.grad[0, 1, 2]).all() and torch.isfinite(x.grad[0, 0]).all()
            assert torch.isnan(out_layer.weight.grad).any()  # the NaN pair's gradient reaches W


@pytest.mark.parametrize("device,amp,rtol,atol", CASES)
@pytest.mark.parametrize("C", [24, 128])
def test_layer_norm_matches_the_module_in_the_compute_dtype(device, amp, rtol, atol, C):
    dtype = torch.float64 if amp is None else torch.float32
    norm, _ = _layers(C, (), False, dtype, seed=6)
    norm = norm.to(device)
    x0 = torch.randn(3, 5, 7, C, dtype=dtype, device=device).requires_grad_(True)
    x = x0.transpose(1, 2)

    def fused():
        with _ctx(device, amp):
            y = layer_norm(x, norm)
            assert y.dtype == (amp or dtype)
            return y

    def plain():
        with _ctx(device, amp):
            return norm(x).to(amp or dtype)

    _check(fused, plain, [x0], list(norm.parameters()), rtol, atol)


@pytest.mark.parametrize("device,amp,rtol,atol", CASES)
@pytest.mark.parametrize("C", [24, 128])
def test_swiglu_transition_matches_the_plain_ops(device, amp, rtol, atol, C):
    dtype = torch.float64 if amp is None else torch.float32
    norm, (la, lb) = _layers(C, (2 * C, 2 * C), False, dtype, seed=8)
    lo = nn.Linear(2 * C, C, bias=False).to(dtype)
    norm, la, lb, lo = (m.to(device) for m in (norm, la, lb, lo))
    x0 = torch.randn(2, 7, 5, C, dtype=dtype, device=device).requires_grad_(True)
    x = x0.transpose(1, 2)
    params = [*norm.parameters(), la.weight, lb.weight, lo.weight]

    def fused():
        with _ctx(device, amp):
            return swiglu_transition(x, norm, la, lb, lo)

    def plain():
        with _ctx(device, amp):
            y = norm(x)
            return lo(nn.functional.silu(la(y)) * lb(y))

    # the plain ops round silu(a) and the product separately; the node rounds once
    _check(fused, plain, [x0], params, 2 * rtol, 2 * atol)
