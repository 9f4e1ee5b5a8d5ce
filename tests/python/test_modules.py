"""TriangleAttention module: OpenFold3 weight names, equivalence with a plain-PyTorch
OpenFold3-style module, and deterministic training under torch.compile."""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

import turbopairformer as tpf
from conftest import requires_gpu
from reference import OpenFold3TriangleAttention, assert_module_matches

OPENFOLD3_KEYS = {
    "layer_norm.weight",
    "layer_norm.bias",
    "linear_z.weight",
    "mha.linear_q.weight",
    "mha.linear_k.weight",
    "mha.linear_v.weight",
    "mha.linear_o.weight",
    "mha.linear_o.bias",
    "mha.linear_g.weight",
    "mha.linear_g.bias",
}


def pair(B=2, N=6, C=8, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, N, C, generator=g, dtype=torch.float64).to(device, dtype)
    mask = (torch.rand(B, N, N, generator=g) < 0.9).double().to(device)
    mask[..., 0] = 1.0  # no row fully masked: OpenFold3's -1e9 bias would average those rows
    mask[..., 0, :] = 1.0
    return x, mask


def test_state_dict_keys_match_openfold3():
    assert set(tpf.TriangleAttention(8, 8, 2).state_dict()) == OPENFOLD3_KEYS
    # OpenFold3's AF3 configuration: no biases on the gate and output projections
    af3 = OPENFOLD3_KEYS - {"mha.linear_o.bias", "mha.linear_g.bias"}
    assert set(tpf.TriangleAttentionEndingNode(8, 8, 2, bias=False).state_dict()) == af3


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("starting", [True, False])
def test_matches_openfold3_module_on_cpu(starting, fused, monkeypatch):
    """Both eager forms of the layer: the one autograd node (layers.triangle_attention_layer) and
    the composed ops that torch.compile and the row-sharded path use."""
    if not fused:
        monkeypatch.setattr(tpf.TriangleAttention, "_fused", lambda self, x: False)
    torch.manual_seed(0)
    x, mask = pair()
    assert_module_matches(
        OpenFold3TriangleAttention(8, 8, 2, starting=starting).double(),
        tpf.TriangleAttention(8, 8, 2, starting=starting).double(),
        x,
        mask,
    )


@requires_gpu
def test_matches_openfold3_module_on_gpu_in_bf16():
    torch.manual_seed(1)
    ref = OpenFold3TriangleAttention(64, 32, 4).cuda()
    ours = tpf.TriangleAttention(64, 32, 4).cuda()
    ours.load_state_dict(ref.state_dict())
    x, mask = pair(B=1, N=96, C=64, dtype=torch.float32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = ours(x, mask)
    y_ref = ref.double()(x.double(), mask)
    err = ((y.double() - y_ref).norm() / y_ref.norm()).item()
    assert err < 2e-2  # bf16 projections and attention vs float64


def _train(seed, steps=50):
    torch.manual_seed(seed)
    blocks = torch.nn.ModuleList(
        [tpf.TriangleAttention(64, 32, 4, starting=i % 2 == 0) for i in range(4)]
    ).cuda()
    opt = torch.optim.Adam(blocks.parameters(), lr=1e-3)

    def step(x, mask, target):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            for b in blocks:
                x = x + b(x, mask)
        return torch.nn.functional.mse_loss(x.float(), target)

    step = torch.compile(step, fullgraph=True)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, 64, 64, 64, device="cuda", generator=g)
    mask = torch.ones(1, 64, 64, device="cuda")
    target = torch.randn(1, 64, 64, 64, device="cuda", generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = step(x, mask, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in blocks.parameters()]


@requires_gpu
def test_four_block_stack_trains_deterministically_under_compile():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        l1, p1 = _train(0)
        l2, p2 = _train(0)
    finally:
        torch.use_deterministic_algorithms(False)
    assert l1[-1] < 0.9 * l1[0], (l1[0], l1[-1])
    assert l1 == l2
    assert all(torch.equal(a, b) for a, b in zip(p1, p2))


def _layer_grads(module, x, mask, dy):
    """(output, dx, {name: grad}) of one bf16-autocast forward + backward."""
    module.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.dtype != torch.float64):
        y = module(x, mask)
    y.backward(dy.to(y.dtype))
    return (
        y.detach().double(),
        x.grad.double(),
        {n: p.grad.double() for n, p in module.named_parameters()},
    )


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@requires_gpu
@pytest.mark.parametrize("starting", [True, False])
@pytest.mark.parametrize("N", [1, 7, 100])
def test_fused_layer_on_gpu_is_as_accurate_as_the_composed_ops(starting, N, monkeypatch):
    """The one-node layer (layers.triangle_attention_layer) against the FP64 OpenFold3 module, next
    to the composed ops it replaces in eager mode: output, dx and every parameter gradient, with
    padded tokens (their rows fully masked) and the loss over valid pairs; repeated bitwise."""
    torch.manual_seed(N)
    ref = OpenFold3TriangleAttention(64, 32, 4, starting=starting).cuda().double()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ours = tpf.TriangleAttention(64, 32, 4, starting=starting).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(1, N, N, 64, device="cuda")
    tokens = torch.ones(N, device="cuda")
    tokens[N - N // 7 :] = 0  # padded tokens: their rows and columns masked
    mask = (tokens[:, None] * tokens[None, :])[None]
    dy = torch.randn(1, N, N, 64, device="cuda", dtype=torch.float64) * mask[..., None]
    want = _layer_grads(ref, x.double(), mask, dy)
    fused = _layer_grads(ours, x, mask, dy)
    again = _layer_grads(ours, x, mask, dy)
    assert torch.equal(fused[1], again[1]) and all(
        torch.equal(fused[2][n], again[2][n]) for n in fused[2]
    )
    monkeypatch.setattr(tpf.TriangleAttention, "_fused", lambda self, x: False)
    composed = _layer_grads(ours, x, mask, dy)
    valid = mask[..., None].double()
    pairs = [
        ("out", fused[0] * valid, composed[0] * valid, want[0] * valid),
        ("dx", fused[1], composed[1], want[1]),
    ]
    pairs += [(n, fused[2][n], composed[2][n], want[2][n]) for n in want[2]]
    for name, f, c, w in pairs:
        assert torch.isfinite(f).all(), name
        if w.norm() < 1e-12:  # at N = 1 the bias gradient is 0 (one key, P = 1): rounding only
            assert f.norm() <= 1.25 * c.norm() + 1e-6, (name, f.norm(), c.norm())
            continue
        ef, ec = _rel(f, w), _rel(c, w)
        print(f"{name}: fused {ef:.2e} composed {ec:.2e}")
        assert ef <= 1.25 * ec + 2.0**-10, (name, ef, ec)  # no worse than the ops it replaces
        assert ef < 2e-2, (name, ef)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: tpf.TriangleAttention(8, 8, 2), (1, 5, 5, 6)),  # channels
        (lambda: tpf.TriangleAttention(8, 8, 2), (5, 8)),  # rank
        (lambda: tpf.TriangleMultiplicativeUpdate(8, 8), (1, 5, 5, 6)),  # channels
        (lambda: tpf.TriangleMultiplicativeUpdate(8, 8), (1, 5, 4, 8)),  # not square
    ],
)
def test_modules_name_a_wrong_input_shape_and_their_channels(make, shape):
    m = make()
    with pytest.raises(ValueError, match=r"expected \[\*, .*8\] \(the module's channels: 8\)"):
        m(torch.randn(*shape))
    if isinstance(m, tpf.TriangleMultiplicativeUpdate):
        with pytest.raises(ValueError, match="the module's channels: 8"):
            m.residual_update(torch.randn(*shape))
