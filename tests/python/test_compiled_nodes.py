"""The pair modules' nodes under torch.compile (layers.compiled_nodes): from the size threshold
up they run as custom ops, the same kernels and saved sets as eager mode, inside one graph
(fullgraph=True) and recomputed inside activation checkpoints; below it the composed ops. On the
CPU the nodes run the FP64 reference, so the compiled step must match the eager one to rounding.
Schemas, fake tensors and autograd registrations by opcheck."""

import collections

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

from conftest import requires_gpu  # noqa: E402

import turbopairformer as tpf  # noqa: E402
from turbopairformer import _attention_layer, _norm, _transition, layers, pairformer  # noqa: E402
from turbopairformer.modules import packed_weights  # noqa: E402

C, CS = 32, 16
SMALL = dict(c_hidden_mul=16, c_hidden_pair_att=8, no_heads_pair=2, pair_dropout=0.0)


@pytest.fixture
def nodes_always(monkeypatch):
    """Compiled graphs take the nodes at every size (the threshold is for the GPU's host work)."""
    monkeypatch.setattr(layers, "COMPILED_NODE_MIN_PAIRS", 0)


def _ops_called(fn) -> collections.Counter:
    """How often each of our custom ops ran during fn()."""
    from torch.profiler import profile

    with profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return collections.Counter(
        e.name.split("::")[1] for e in prof.events() if e.name.startswith("turbopairformer::")
    )


def _pair(N, seed, padded=2):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(1, N, N, C, generator=g, dtype=torch.float64, requires_grad=True)
    sm = torch.ones(1, N, dtype=torch.float64)
    sm[:, N - padded :] = 0
    return z, sm, sm[:, :, None] * sm[:, None, :]


def _step(module, fn, z, pm):
    module.zero_grad(set_to_none=True)
    z.grad = None
    out = fn(z, pm)
    (out.square() * torch.linspace(0.5, 1.5, out.shape[-1], dtype=out.dtype)).sum().backward()
    return out.detach(), z.grad.clone(), [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("N", [1, 7])
def test_compiled_pair_block_runs_the_nodes_and_matches_eager(N, nodes_always):
    torch.manual_seed(N)
    block = pairformer.PairBlock(c_z=C, **SMALL).double()
    z, _, pm = _pair(N, seed=N, padded=min(2, N - 1))
    eager = _step(block, block, z, pm)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    _step(block, compiled, z, pm)  # traces
    ops = _ops_called(lambda: _step(block, compiled, z, pm))
    got = _step(block, compiled, z, pm)
    for name in ("triangle_attention_layer", "triangle_attention_layer_bwd"):
        assert ops[name] == 2, ops  # both attention layers as one node each way
    for name in ("trimul_residual_update", "trimul_residual_update_bwd"):
        assert ops[name] == 2, ops
    assert ops["triangle_attention_fwd"] == 0, ops  # no composed attention layer left
    tol = dict(rtol=1e-12, atol=1e-12)  # FP64 reference kernels; only the glue's order differs
    torch.testing.assert_close(got[0], eager[0], **tol)
    torch.testing.assert_close(got[1], eager[1], **tol)
    for a, b in zip(got[2], eager[2]):
        torch.testing.assert_close(a, b, **tol)


def test_below_the_threshold_compiled_graphs_take_the_composed_ops():
    block = pairformer.PairBlock(c_z=C, **SMALL).double()
    z, _, pm = _pair(7, seed=3)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    _step(block, compiled, z, pm)
    ops = _ops_called(lambda: _step(block, compiled, z, pm))
    assert ops["triangle_attention_layer"] == 0 and ops["trimul_residual_update"] == 0, ops
    assert ops["triangle_attention_fwd"] == 2 and ops["trimul_fwd"] == 2, ops


def test_compiled_nodes_threshold():
    n = int(layers.COMPILED_NODE_MIN_PAIRS**0.5)
    assert layers.compiled_nodes(torch.empty(1, n, n, 1, device="meta"))
    assert not layers.compiled_nodes(torch.empty(1, n - 1, n, 1, device="meta"))
    assert layers.compiled_nodes(torch.empty(2, n - 1, n, 1, device="meta"))  # the batch's pairs


@pytest.mark.parametrize("blocks_per_ckpt", [1, None])
def test_compiled_stack_runs_the_nodes_outside_checkpoints_only(nodes_always, blocks_per_ckpt):
    """Inside the stack's compiled activation checkpoints the composed ops run (with the nodes
    there the compiled stack held every block's saved sets at once on the H200). Without
    checkpoints the nodes run; either way the gradients match eager's."""
    torch.manual_seed(0)
    N = 7
    stack = pairformer.PairformerStack(
        no_blocks=2, blocks_per_ckpt=blocks_per_ckpt, c_s=CS, c_z=C, c_hidden_pair_bias=8,
        no_heads_pair_bias=2, **SMALL,
    ).double()  # fmt: skip
    z, sm, pm = _pair(N, seed=5)
    s = torch.randn(1, N, CS, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(stack, fullgraph=True, backend="aot_eager")

    def step(fn):
        stack.zero_grad(set_to_none=True)
        s.grad = z.grad = None
        so, zo = fn(s, z, sm, pm)
        (so.square().sum() + zo.square().sum()).backward()
        return [z.grad.clone(), s.grad.clone()] + [p.grad.clone() for p in stack.parameters()]

    eager = step(stack)
    step(compiled)  # traces
    got = []
    ops = _ops_called(lambda: got.extend(step(compiled)))
    assert not layers._IN_COMPILED_CHECKPOINT
    nodes = ("triangle_attention_layer", "trimul_residual_update")
    if blocks_per_ckpt is None:
        assert all(ops[n] == 4 and ops[n + "_bwd"] == 4 for n in nodes), ops
    else:
        assert not any(ops[n] or ops[n + "_bwd"] for n in nodes), ops
        assert ops["trimul_fwd"] == 8, ops  # the composed op, recomputed
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_transition_node_under_compile(nodes_always, monkeypatch):
    """The transition's custom op inside a compiled graph (its kernels' CPU reference here): no
    graph break, the eager node's results."""
    monkeypatch.setattr(layers._norm, "gpu_supported", lambda x, w, dtype: True)
    monkeypatch.setattr(_transition, "supported", lambda x, hidden, cd, scale: True)
    torch.manual_seed(0)
    m = pairformer.SwiGLUTransition(128, 2)
    x = torch.randn(1, 5, 5, 128, requires_grad=True)
    mask = (torch.rand(1, 5, 5) > 0.2).float()

    def step(fn):
        m.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(x, mask)
        y.float().square().sum().backward()
        return y.detach(), x.grad.clone(), [p.grad.clone() for p in m.parameters()]

    eager = step(m.residual_update)
    compiled = torch.compile(m.residual_update, fullgraph=True, backend="aot_eager")
    step(compiled)
    ops = _ops_called(lambda: step(compiled))
    got = step(compiled)
    assert ops["swiglu_transition"] == 1 and ops["swiglu_transition_bwd"] == 1, ops
    torch.testing.assert_close(got[0], eager[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)
    for a, b in zip(got[2], eager[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("starting", [True, False])
@pytest.mark.parametrize("residual", [True, False])
def test_opcheck_attention_layer_node(starting, residual):
    torch.manual_seed(1)
    m = tpf.TriangleAttention(C, 8, 2, starting=starting).double()
    x = torch.randn(1, 5, 5, C, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(1, 5, 5) > 0.2
    mask = (mask if starting else mask.transpose(-1, -2))[:, :, None, None, :]
    mh = m.mha
    projections = (mh.linear_q, mh.linear_k, mh.linear_v, mh.linear_g, m.linear_z)
    w, b = layers._stacked(projections, _attention_layer.STACK_PAD)
    cols = [i for r in layers._bias_cols(projections) for i in r]  # the gate's columns
    scale = (torch.rand(1, 1, 5, 1) > 0.3).double() if residual else None
    args = (
        x, m.layer_norm.weight, m.layer_norm.bias, w, b, cols, mh.linear_o.weight, mh.linear_o.bias,
        mask, scale, 1e-5, 2, 8, starting, True, residual, torch.float64,
    )  # fmt: skip
    torch.library.opcheck(torch.ops.turbopairformer.triangle_attention_layer.default, args)


def test_opcheck_trimul_residual_update_node():
    m = tpf.TriangleMultiplicativeUpdate(4, 3).double()
    g = torch.Generator().manual_seed(2)
    z = torch.randn(1, 4, 4, 4, generator=g, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(1, 4, 4, generator=g) > 0.2).double()
    scale = (torch.rand(1, 1, 4, 4, generator=g) < 0.75).double() / 0.75
    args = (z, scale, mask, *packed_weights(m).values(), 0, 1e-5, True, False)
    torch.library.opcheck(torch.ops.turbopairformer.trimul_residual_update.default, args)


def test_norm_probe_is_shape_only():
    """The backward op re-derives the forward's LayerNorm path from shapes and dtypes alone."""
    x = torch.empty(2, 3, 3, 128, device="meta")
    assert not _norm.gpu_supported(x, None, torch.bfloat16)  # not CUDA: PyTorch's LayerNorm


def _gpu_step(model, N):
    """A training step of a block or stack (run as fn: itself or compiled) on fresh inputs at N
    with three padded tokens, bf16 autocast: [z out, dz, every parameter gradient but the single
    track's layer_norm_z.bias], each a copy. That bias's gradient is zero in exact arithmetic (a
    constant across keys, which the softmax removes): every run gives rounding noise there
    (H200: norm 6e-7, eager and compiled 1.1-1.3 apart, on main too)."""
    g = torch.Generator(device="cuda").manual_seed(N)
    s = torch.randn(1, N, 384, device="cuda", generator=g, requires_grad=True)
    z = torch.randn(1, N, N, 128, device="cuda", generator=g, requires_grad=True)
    sm = torch.ones(1, N, device="cuda")
    sm[:, N - 3 :] = 0
    pm = sm[:, :, None] * sm[:, None, :]

    def step(fn):
        model.zero_grad(set_to_none=True)
        s.grad = z.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            so, zo = fn(s, z, sm, pm)
        (so.float().square().mean() + zo.float().square().mean()).backward()
        grads = [
            p.grad.clone() for n, p in model.named_parameters() if "layer_norm_z.bias" not in n
        ]
        return [zo.detach().float().clone(), z.grad.clone()] + grads

    return step


def _assert_bf16_close(got_list, want_list):
    for got, want in zip(got_list, want_list):
        err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
        assert err < 2e-2, err  # two bf16 runs of the same math, in another order of the glue


@requires_gpu
@pytest.mark.parametrize("N", [48, 100])
def test_compiled_block_on_gpu_matches_eager_and_repeats(N, nodes_always):
    """The compiled block with its nodes against the eager block on the same kernels (bf16
    autocast): outputs and gradients to the bf16 floor, parameter gradients bitwise repeatable."""
    torch.manual_seed(0)
    block = pairformer.PairformerBlock().cuda().eval()
    step = _gpu_step(block, N)
    eager = step(block)
    compiled = torch.compile(block, fullgraph=True)
    step(compiled)
    ops = _ops_called(lambda: step(compiled))
    first, second = step(compiled), step(compiled)
    assert ops["triangle_attention_layer"] == 2 and ops["trimul_residual_update"] == 2, ops
    assert ops["swiglu_transition"] == 1, ops  # the pair transition (the single one: c_s = 384)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    _assert_bf16_close(first, eager)


@requires_gpu
def test_stack_under_cuda_graphs_matches_compiled_and_repeats():
    """torch.compile(mode="reduce-overhead") (inductor's CUDA graphs: warm-up, capture, then
    replays), the small-N configuration the bench measures as compile-ro: a 2-block stack with
    one block per checkpoint gives the output and gradients of the same stack compiled without
    graphs (the same kernels launched one by one) to the bf16 floor, and bitwise the same
    gradients on two replays (nothing the kernels read or write lives outside the captured
    memory). The compiled graphs' own agreement with eager mode is the test above's."""
    torch.manual_seed(0)
    stack = pairformer.PairformerStack(no_blocks=2, blocks_per_ckpt=1).cuda().eval()
    step = _gpu_step(stack, 100)
    compiled = torch.compile(stack)
    step(compiled)
    launched = step(compiled)
    torch._dynamo.reset()
    graphed = torch.compile(stack, mode="reduce-overhead")
    for _ in range(3):  # warm-up and capture
        step(graphed)
    first, second = step(graphed), step(graphed)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    _assert_bf16_close(first, launched)
