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


@pytest.mark.parametrize("starting", [True, False])
def test_matches_openfold3_module_on_cpu(starting):
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
