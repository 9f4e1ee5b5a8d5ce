"""turbopairformer.triangle_multiplicative_update and the TriangleMultiplicativeUpdate module:
OpenFold3 names, equivalence with a plain-PyTorch OpenFold3-style module, errors, opcheck."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

import turbopairformer as tpf
from conftest import requires_gpu, zero_fills_during
from reference import OpenFold3TriangleMultiplicativeUpdate, assert_module_matches

OPENFOLD3_KEYS = {
    f"{n}.{p}"
    for n in (
        "linear_a_p",
        "linear_a_g",
        "linear_b_p",
        "linear_b_g",
        "linear_g",
        "linear_z",
        "layer_norm_in",
        "layer_norm_out",
    )
    for p in ("weight", "bias")
}


def inputs(B=2, N=6, C=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, N, N, C, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, N, N, generator=g) < 0.8).double()
    return z, mask


def test_state_dict_keys_match_openfold3():
    assert set(tpf.TriangleMultiplicativeUpdate(8, 4).state_dict()) == OPENFOLD3_KEYS
    af3 = {k for k in OPENFOLD3_KEYS if k.startswith("layer_norm") or k.endswith("weight")}
    assert set(tpf.TriangleMultiplicativeUpdate(8, 4, bias=False).state_dict()) == af3


@pytest.mark.parametrize("outgoing", [True, False])
def test_without_biases_matches_openfold3_af3_module(outgoing):
    torch.manual_seed(4)
    z, mask = inputs()
    assert_module_matches(
        OpenFold3TriangleMultiplicativeUpdate(5, 3, outgoing=outgoing, bias=False).double(),
        tpf.TriangleMultiplicativeUpdate(5, 3, outgoing=outgoing, bias=False).double(),
        z,
        mask,
    )


@pytest.mark.parametrize("outgoing", [True, False])
def test_matches_openfold3_module_on_cpu(outgoing):
    torch.manual_seed(3)
    z, mask = inputs()
    assert_module_matches(
        OpenFold3TriangleMultiplicativeUpdate(5, 3, outgoing=outgoing).double(),
        tpf.TriangleMultiplicativeUpdate(5, 3, outgoing=outgoing).double(),
        z,
        mask,
    )


def test_backward_fills_no_gradient_for_the_saved_set():
    # The saved set (uint8) is the backward's input: a zero gradient of its size (1.3 GB at
    # N = 768 on the GPU) was filled on every backward.
    z, mask = inputs()
    zz = z.requires_grad_(True)
    out = tpf.TriangleMultiplicativeUpdate(5, 3).double()(zz, mask)
    fills = zero_fills_during(lambda: out.sum().backward())
    assert not [f for f in fills if f[0] == torch.uint8]
    assert zz.grad is not None and torch.isfinite(zz.grad).all()


def test_unbatched_input_and_absent_biases():
    z, mask = inputs(B=1)
    C, Ch = 5, 3
    g = torch.Generator().manual_seed(1)
    w = dict(
        norm_in_weight=torch.ones(C, dtype=torch.float64),
        norm_in_bias=torch.zeros(C, dtype=torch.float64),
        p_in_weight=torch.randn(2 * Ch, C, generator=g, dtype=torch.float64),
        g_in_weight=torch.randn(2 * Ch, C, generator=g, dtype=torch.float64),
        norm_out_weight=torch.ones(Ch, dtype=torch.float64),
        norm_out_bias=torch.zeros(Ch, dtype=torch.float64),
        p_out_weight=torch.randn(C, Ch, generator=g, dtype=torch.float64),
        g_out_weight=torch.randn(C, C, generator=g, dtype=torch.float64),
    )
    batched = tpf.triangle_multiplicative_update(z, "incoming", mask, **w)
    single = tpf.triangle_multiplicative_update(z[0], "incoming", mask[0], **w)
    zero_bias = tpf.triangle_multiplicative_update(
        z, "incoming", mask, p_in_bias=torch.zeros(2 * Ch, dtype=torch.float64), **w
    )
    assert torch.equal(batched[0], single)
    assert torch.equal(batched, zero_bias)


@pytest.mark.parametrize(
    "case, exc, word",
    [
        ("direction", ValueError, "'direction'"),
        ("missing_p_in", ValueError, "'p_in_weight'"),
        ("odd_p_in", ValueError, "'p_in_weight'"),
        ("int_input", TypeError, "'z'"),
        ("not_square", ValueError, "'z'"),
    ],
)
def test_bad_input_names_the_argument(case, exc, word):
    m = tpf.TriangleMultiplicativeUpdate(5, 3).double()
    z, mask = inputs()
    w = dict(
        norm_in_weight=m.layer_norm_in.weight,
        norm_in_bias=m.layer_norm_in.bias,
        p_in_weight=torch.cat([m.linear_a_p.weight, m.linear_b_p.weight]),
        g_in_weight=torch.cat([m.linear_a_g.weight, m.linear_b_g.weight]),
        norm_out_weight=m.layer_norm_out.weight,
        norm_out_bias=m.layer_norm_out.bias,
        p_out_weight=m.linear_z.weight,
        g_out_weight=m.linear_g.weight,
    )
    direction = "outgoing"
    if case == "direction":
        direction = "sideways"
    elif case == "missing_p_in":
        del w["p_in_weight"]
    elif case == "odd_p_in":
        w["p_in_weight"] = w["p_in_weight"][:5]
    elif case == "int_input":
        z = z.to(torch.int32)
    elif case == "not_square":
        z = z[:, :, :4]
        mask = mask[:, :, :4]
    with pytest.raises(exc, match=word):
        tpf.triangle_multiplicative_update(z, direction, mask, **w)


def packed_weights(m):
    """The op's twelve weights from a module, in the library's order (some biases absent)."""
    return [
        m.layer_norm_in.weight,
        m.layer_norm_in.bias,
        torch.cat([m.linear_a_p.weight, m.linear_b_p.weight]).detach().requires_grad_(True),
        None,
        torch.cat([m.linear_a_g.weight, m.linear_b_g.weight]).detach().requires_grad_(True),
        None,
        m.layer_norm_out.weight,
        m.layer_norm_out.bias,
        m.linear_z.weight,
        m.linear_z.bias,
        m.linear_g.weight,
        None,
    ]


def test_opcheck_cpu():
    m = tpf.TriangleMultiplicativeUpdate(4, 3).double()
    z, mask = inputs(B=1, N=4, C=4)
    weights = packed_weights(m)
    torch.library.opcheck(
        torch.ops.turbopairformer.trimul_fwd.default,
        (z.requires_grad_(True), mask, *weights, 0, 1e-5, True),
    )


def test_opcheck_cpu_residual_update():
    """The op with its residual update (out = residual + scale * update): the residual takes
    the output's gradient, the scale none."""
    m = tpf.TriangleMultiplicativeUpdate(4, 3).double()
    z, mask = inputs(B=1, N=4, C=4)
    residual = torch.randn(1, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    scale = (torch.rand(1, 1, 4, 4, generator=torch.Generator().manual_seed(1)) < 0.75).double() / 0.75
    torch.library.opcheck(
        torch.ops.turbopairformer.trimul_fwd.default,
        (z.requires_grad_(True), mask, *packed_weights(m), 0, 1e-5, True, residual, scale),
    )


@requires_gpu
@pytest.mark.parametrize("outgoing", [True, False])
def test_cuda_fused_residual_update_is_bitwise_the_unfused_one(monkeypatch, outgoing):
    """z + dropout * update(z) with the residual added in the op's output stage: the same bits
    as the update written out and added by the residual kernel, and the same gradients (fp32 z,
    bf16 autocast, a row-shared dropout mask, odd N)."""
    from turbopairformer import trimul as trimul_mod

    torch.manual_seed(7)
    m = tpf.TriangleMultiplicativeUpdate(128, 128, outgoing=outgoing, bias=False).cuda()
    N = 37
    z0 = torch.randn(1, N, N, 128, device="cuda")
    mask = (torch.rand(1, N, N, device="cuda") < 0.9).float()
    scale = ((torch.rand(1, 1, N, 128, device="cuda") < 0.75) / 0.75).to(torch.bfloat16)
    dy = torch.randn(1, N, N, 128, device="cuda")
    results = []
    for fused in (True, False):
        monkeypatch.setattr(trimul_mod, "_fuses_residual", lambda z, x, s, f=fused: f)
        m.zero_grad()
        z = z0.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m.residual_update(z, mask, scale)
        assert y.dtype == torch.float32
        y.backward(dy)
        results.append([y.detach(), z.grad] + [p.grad.clone() for p in m.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@requires_gpu
@pytest.mark.parametrize("outgoing", [True, False])
def test_cuda_matches_fp64_openfold3_module(outgoing):
    torch.manual_seed(5)
    ref = OpenFold3TriangleMultiplicativeUpdate(64, 32, outgoing=outgoing).cuda().double()
    ours = tpf.TriangleMultiplicativeUpdate(64, 32, outgoing=outgoing).cuda()
    ours = ours.bfloat16()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})  # same bf16 values
    z = torch.randn(2, 45, 45, 64, device="cuda").bfloat16()
    mask = (torch.rand(2, 45, 45, device="cuda") < 0.8).bfloat16()
    zr = z.double().requires_grad_(True)
    zo = z.clone().requires_grad_(True)
    y_ref = ref(zr, mask.double())
    y = ours(zo, mask)
    dout = torch.randn_like(y_ref)
    y_ref.backward(dout)
    y.backward(dout.bfloat16())
    floor = 1.7e-3  # relative RMSE of a bf16 rounding
    assert _rel(y, y_ref) < 2 * floor
    assert _rel(zo.grad, zr.grad) < 3.5 * floor
    for (name, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        assert _rel(p.grad, q.grad) < 4 * floor, name


@requires_gpu
def test_cuda_compile_autocast_and_bitwise_determinism():
    torch.manual_seed(6)
    m = tpf.TriangleMultiplicativeUpdate(32, 32).cuda()
    compiled = torch.compile(m, fullgraph=True)
    z = torch.randn(1, 37, 37, 32, device="cuda")
    mask = (torch.rand(1, 37, 37, device="cuda") < 0.9).float()
    grads = []
    for _ in range(2):
        m.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = compiled(z, mask)
        assert y.dtype == torch.bfloat16
        y.float().square().sum().backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert all(torch.isfinite(g).all() for g in grads[0])


@requires_gpu
def test_cuda_saved_and_recomputing_backward_agree_and_repeat():
    """Training saves the forward's intermediates; the backward reads them (twice with
    retain_graph: bitwise the same) and is close to the backward that recomputes the forward."""
    torch.manual_seed(8)
    m = tpf.TriangleMultiplicativeUpdate(64, 64).cuda().bfloat16()
    z = torch.randn(1, 50, 50, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mask = (torch.rand(1, 50, 50, device="cuda") < 0.8).bfloat16()
    y = m(z, mask)
    dout = torch.randn_like(y)
    g1 = torch.autograd.grad(y, [z] + list(m.parameters()), dout, retain_graph=True)
    g2 = torch.autograd.grad(y, [z] + list(m.parameters()), dout)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    with torch.no_grad():
        y_inf = m(z, mask)  # inference keeps nothing; same output
    assert torch.equal(y, y_inf)
    # low_memory: the graph keeps no saved set, and the backward recomputes the forward
    from turbopairformer import _native

    saved_bytes = _native.LIB.tpf_trimul_saved_size(1, 50, 64, 64)
    held = {}
    outs = {}
    for low in (True, False):
        m.low_memory = low
        zz = z.detach().clone().requires_grad_(True)
        before = torch.cuda.memory_allocated()
        outs[low] = (zz, m(zz, mask))
        held[low] = torch.cuda.memory_allocated() - before
    assert held[False] - held[True] >= saved_bytes
    zr, yr = outs[True]
    assert torch.equal(yr, y)
    (dz_r,) = torch.autograd.grad(yr, [zr], dout)
    assert _rel(dz_r, g1[0]) < 0.02


@requires_gpu
@pytest.mark.parametrize("save", [True, False])
def test_opcheck_cuda(save):
    m = tpf.TriangleMultiplicativeUpdate(32, 32).cuda().bfloat16()
    z = torch.randn(1, 9, 9, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weights = packed_weights(m)
    torch.library.opcheck(
        torch.ops.turbopairformer.trimul_fwd.default, (z, None, *weights, 1, 1e-5, save)
    )


@requires_gpu
def test_cuda_graph_capture_of_a_training_step():
    """Forward (saving) and backward captured in a CUDA graph (the backward forks work onto a
    second stream, which the capture must record and join): replay equals eager, bitwise."""
    torch.manual_seed(9)
    m = tpf.TriangleMultiplicativeUpdate(64, 64).cuda().bfloat16()
    z = torch.randn(1, 48, 48, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mask = (torch.rand(1, 48, 48, device="cuda") < 0.8).bfloat16()
    dout = torch.randn(1, 48, 48, 64, device="cuda", dtype=torch.bfloat16)

    def step():
        m.zero_grad(set_to_none=False)
        z.grad = None
        y = m(z, mask)
        y.backward(dout)
        return y

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()  # warm-up on a side stream (allocations, grads created)
    torch.cuda.current_stream().wait_stream(s)
    eager = [p.grad.clone() for p in m.parameters()]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for p in m.parameters():
        p.grad.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, p.grad) for a, p in zip(eager, m.parameters()))


def test_low_memory_mode_gives_the_same_results_on_cpu():
    torch.manual_seed(5)
    z, mask = inputs()
    ref = tpf.TriangleMultiplicativeUpdate(5, 3).double()
    low = tpf.TriangleMultiplicativeUpdate(5, 3, low_memory=True).double()
    low.load_state_dict(ref.state_dict())
    za, zb = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    ya, yb = ref(za, mask), low(zb, mask)
    ya.sum().backward()
    yb.sum().backward()
    assert torch.equal(ya, yb) and torch.equal(za.grad, zb.grad)
