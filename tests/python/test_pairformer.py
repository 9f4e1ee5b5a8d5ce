"""PairformerBlock / PairformerStack: OpenFold3's parameter names (a PairFormerStack state_dict
loads unchanged), equivalence with a plain-PyTorch OpenFold3 block (outputs and every parameter
gradient over valid pairs and tokens, with padded tokens), dropout structure, checkpointing."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

import turbopairformer as tpf
from conftest import requires_gpu
from reference import OpenFold3PairFormerBlock
from turbopairformer.reference import OpenFold3PairFormerStack

SMALL = dict(
    c_s=16,
    c_z=16,
    c_hidden_pair_bias=8,
    no_heads_pair_bias=2,
    c_hidden_mul=16,
    c_hidden_pair_att=8,
    no_heads_pair=2,
    transition_n=2,
)


def reference_stack(no_blocks, **kw):
    return OpenFold3PairFormerStack(no_blocks=no_blocks, blocks_per_ckpt=None, **kw)


def inputs(N, n_pad, dtype=torch.float64, device="cpu", seed=0, c_s=16, c_z=16):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(1, N, c_s, generator=g, dtype=torch.float64)
    z = torch.randn(1, N, N, c_z, generator=g, dtype=torch.float64)
    single_mask = torch.ones(1, N, dtype=torch.float64)
    single_mask[:, N - n_pad :] = 0  # padded tokens at the end, as a cropped batch has them
    pair_mask = single_mask[:, :, None] * single_mask[:, None, :]
    return [t.to(device, dtype) for t in (s, z, single_mask, pair_mask)]


def randomise(module, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():  # non-trivial LayerNorm gains and biases too
            p.copy_(
                torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3 + (p.dim() == 1) * 1.0
            )


def valid_loss(s, z, single_mask, pair_mask, gs, gz):
    """A loss over valid tokens and pairs only (what training takes)."""
    return (s * gs * single_mask[..., None]).sum() + (z * gz * pair_mask[..., None]).sum()


def test_state_dict_matches_openfold3_pairformer_stack():
    ours = tpf.PairformerStack(no_blocks=2, **SMALL)
    ref = reference_stack(2, **SMALL)
    assert set(ours.state_dict()) == set(ref.state_dict())
    for (n, a), b in zip(
        sorted(ours.state_dict().items()), [ref.state_dict()[n] for n in sorted(ours.state_dict())]
    ):
        assert a.shape == b.shape, n
    ours.load_state_dict(ref.state_dict())  # strict


def test_default_sizes_are_openfold3s():
    block = tpf.PairformerBlock()
    ref = OpenFold3PairFormerBlock()
    assert {n: p.shape for n, p in block.state_dict().items()} == {
        n: p.shape for n, p in ref.state_dict().items()
    }


@pytest.mark.parametrize("N, n_pad", [(1, 0), (7, 2), (100, 9), (256, 20)])
def test_block_matches_openfold3_on_cpu(N, n_pad):
    ref = reference_stack(2, **SMALL).double().eval()
    randomise(ref, seed=N)
    ours = tpf.PairformerStack(no_blocks=2, blocks_per_ckpt=1, **SMALL).double().eval()
    ours.load_state_dict(ref.state_dict())
    s, z, sm, pm = inputs(N, n_pad, seed=N)
    g = torch.Generator().manual_seed(5)
    gs, gz = (
        torch.randn(s.shape, generator=g, dtype=torch.float64),
        torch.randn(z.shape, generator=g, dtype=torch.float64),
    )
    outs = []
    for model, fn in ((ref, ref), (ours, ours)):
        ss, zz = s.clone().requires_grad_(True), z.clone().requires_grad_(True)
        so, zo = fn(ss, zz, sm, pm)
        valid_loss(so, zo, sm, pm, gs, gz).backward()
        outs.append(
            (
                so.detach(),
                zo.detach(),
                ss.grad,
                zz.grad,
                {n: p.grad for n, p in model.named_parameters()},
            )
        )
    (rs, rz, rgs, rgz, rgrad), (os_, oz, ogs, ogz, ograd) = outs
    v = sm.bool()[0]
    assert torch.allclose(os_[:, v], rs[:, v], atol=1e-9)
    assert torch.allclose(oz[:, v][:, :, v], rz[:, v][:, :, v], atol=1e-9)
    assert torch.allclose(ogs, rgs, atol=1e-8) and torch.allclose(ogz, rgz, atol=1e-8)
    for n, gref in rgrad.items():
        assert torch.allclose(ograd[n], gref, atol=1e-8, rtol=1e-7), n


def test_pair_dropout_is_shared_along_rows_and_columns_as_openfold3():
    from turbopairformer.pairformer import _shared_dropout

    x = torch.ones(2, 6, 6, 4, dtype=torch.float64)
    rows = _shared_dropout(x, 0.5, True, -3)
    assert torch.equal(rows, rows[:, :1].expand_as(rows))  # one mask for every row i
    cols = _shared_dropout(x, 0.5, True, -2)
    assert torch.equal(cols, cols[:, :, :1].expand_as(cols))  # one mask for every column j
    assert torch.equal(_shared_dropout(x, 0.5, False, -3), x)  # eval: identity
    assert set(rows.unique().tolist()) <= {0.0, 2.0}


def test_fused_residual_dropout_is_the_residual_plus_the_shared_dropout():
    from turbopairformer.layers import residual_add
    from turbopairformer.pairformer import _dropout_scale, _shared_dropout

    z, x = (
        torch.randn(2, 6, 6, 4, dtype=torch.float64),
        torch.randn(2, 6, 6, 4, dtype=torch.float64),
    )
    for dim in (-3, -2):
        torch.manual_seed(3)
        a = residual_add(z, x, _dropout_scale(z, 0.25, True, dim))
        torch.manual_seed(3)
        torch.testing.assert_close(a, z + _shared_dropout(x, 0.25, True, dim))  # (an FMA)
    assert _dropout_scale(z, 0.25, False, -3) is None
    assert torch.equal(residual_add(z, x, None), z + x)


def test_residual_nodes_match_the_composed_residual_update():
    """Every pair module's residual_update (one node; the pass-through gradient added in the
    LayerNorm backward or in one sum) against x + scale * module(x): output, dx and every
    parameter gradient."""
    torch.manual_seed(4)
    x = torch.randn(1, 7, 7, 16, dtype=torch.float64)
    mask = (torch.rand(1, 7, 7) < 0.8).double()
    mask[..., 0] = 1.0
    scale = (torch.rand(1, 1, 7, 16) < 0.7).double() / 0.7
    mods = [
        tpf.TriangleAttention(16, 8, 2, starting=True).double(),
        tpf.TriangleAttentionEndingNode(16, 8, 2).double(),
        tpf.TriangleMultiplicativeUpdate(16, 8).double(),
        tpf.TriangleMultiplicativeUpdateIncoming(16, 8, bias=False).double(),
        tpf.pairformer.SwiGLUTransition(16, 2).double(),
    ]
    scaled = (tpf.TriangleAttention, tpf.TriangleMultiplicativeUpdate)
    for m in mods:
        for p in m.parameters():
            torch.nn.init.normal_(p, std=0.5)
        grads = []
        for fused in (True, False):
            m.zero_grad()
            xi = x.clone().requires_grad_(True)
            if fused:
                if isinstance(m, scaled):
                    y = m.residual_update(xi, mask, scale)
                else:
                    y = m.residual_update(xi, mask)
            else:
                y = xi + (scale if isinstance(m, scaled) else 1.0) * m(xi, mask)
            dy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(9))
            y.backward(dy)
            grads.append([y.detach(), xi.grad] + [p.grad.clone() for p in m.parameters()])
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_training_mode_applies_dropout_and_eval_does_not():
    torch.manual_seed(0)
    block = tpf.PairformerBlock(**SMALL).double()
    s, z, sm, pm = inputs(6, 1)
    block.eval()
    a = block(s, z, sm, pm)
    b = block(s, z, sm, pm)
    assert torch.equal(a[1], b[1])
    block.train()
    c = block(s, z, sm, pm)
    assert not torch.equal(a[1], c[1])


def test_checkpointed_stack_matches_plain_and_rejects_bad_setting():
    torch.manual_seed(0)
    plain = tpf.PairformerStack(no_blocks=3, blocks_per_ckpt=None, **SMALL).double().eval()
    ckpt = tpf.PairformerStack(no_blocks=3, blocks_per_ckpt=2, **SMALL).double().eval()
    ckpt.load_state_dict(plain.state_dict())
    s, z, sm, pm = inputs(5, 1)
    grads = []
    for m in (plain, ckpt):
        m.zero_grad()
        so, zo = m(s, z, sm, pm)
        (so.sum() + zo.sum()).backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="blocks_per_ckpt"):
        tpf.PairformerStack(no_blocks=2, blocks_per_ckpt=0, **SMALL)


@requires_gpu
@pytest.mark.parametrize("N, n_pad", [(1, 0), (7, 2), (100, 9), (256, 20)])
def test_gpu_block_matches_fp64_within_bf16_error(N, n_pad):
    """OpenFold3's training set-up (bf16 autocast, fp32 weights) against the FP64 reference."""
    ref = OpenFold3PairFormerBlock().double().cuda().eval()
    ours = tpf.PairformerBlock(pair_dropout=0.0).cuda().eval()
    ours.load_state_dict({n: p.float() for n, p in ref.state_dict().items()})
    s, z, sm, pm = inputs(N, n_pad, device="cuda", seed=N, c_s=384, c_z=128)
    with torch.no_grad():
        rs, rz = ref(s, z, sm, pm)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            os_, oz = ours(s.float(), z.float(), sm.float(), pm.float())
    v = sm.bool()[0]
    err = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
    # the block's bf16 error against FP64 (several bf16 GEMMs deep): a few times the 2^-8 floor
    assert err(oz[:, v][:, :, v], rz[:, v][:, :, v]) < 0.03
    assert err(os_[:, v], rs[:, v]) < 0.03


@requires_gpu
def test_gpu_parameter_gradients_are_bitwise_repeatable():
    torch.manual_seed(0)
    block = tpf.PairformerBlock(pair_dropout=0.0).cuda()
    s, z, sm, pm = inputs(64, 5, dtype=torch.float32, device="cuda", c_s=384, c_z=128)
    runs = []
    for _ in range(2):
        block.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            so, zo = block(s, z, sm, pm)
        (so.float().square().mean() + zo.float().square().mean()).backward()
        runs.append([p.grad.clone() for p in block.parameters()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_non_contiguous_pair_tensor_gives_the_same_block_output():
    torch.manual_seed(2)
    block = tpf.PairformerBlock(**SMALL).double().eval()
    s, z, sm, pm = inputs(7, 2)
    zt = z.transpose(1, 2).contiguous().transpose(1, 2)  # same values, column-major pairs
    assert not zt.is_contiguous()
    a, b = block(s, z, sm, pm), block(s, zt, sm, pm)
    assert torch.allclose(a[0], b[0], atol=1e-12) and torch.allclose(a[1], b[1], atol=1e-12)


def test_nan_in_a_valid_pair_is_not_hidden_by_the_block():
    block = tpf.PairformerBlock(**SMALL).double().eval()
    s, z, sm, pm = inputs(7, 2)
    z[0, 1, 2, 3] = float("nan")
    so, zo = block(s, z, sm, pm)
    assert torch.isnan(zo).any() and torch.isnan(so).any()


def _saved_storages(fn):
    """(dtype, number of elements) of each distinct storage autograd saves for fn()'s backward."""
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = (t.dtype, st.nbytes() // t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return list(seen.values())


def test_transition_saves_one_low_precision_copy_of_its_layer_norm_output():
    """Under autocast each nn.Linear would cast (and save) its own bf16 copy of the LayerNorm
    output; the transition saves one [N, N, C] bf16 copy (151 MB at N = 768) and the stacked up
    projection [N, N, 8C], and neither silu(a) nor the activation [N, N, 4C] (the backward
    recomputes them)."""
    N, C = 12, 32
    x = torch.randn(1, N, N, C, requires_grad=True)
    m = tpf.SwiGLUTransition(C, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        saved = _saved_storages(lambda: m(x, torch.ones(1, N, N)))
    assert saved.count((torch.bfloat16, N * N * C)) == 1, saved
    assert saved.count((torch.bfloat16, N * N * 8 * C)) == 1, saved
    assert not [s for s in saved if s[1] == N * N * 4 * C], saved


@pytest.mark.parametrize(
    "name, shape",
    [
        ("s", (1, 5, 15)),
        ("z", (1, 5, 5, 7)),
        ("z", (1, 6, 6, 8)),
        ("single_mask", (1, 4)),
        ("pair_mask", (1, 5, 4)),
        ("s", (5, 16)),
    ],
)
def test_block_names_the_input_that_disagrees(name, shape):
    blk = tpf.PairformerBlock(
        c_s=16,
        c_z=8,
        c_hidden_pair_bias=8,
        no_heads_pair_bias=2,
        c_hidden_mul=8,
        c_hidden_pair_att=8,
        no_heads_pair=2,
    ).double()
    args = {
        "s": torch.randn(1, 5, 16),
        "z": torch.randn(1, 5, 5, 8),
        "single_mask": torch.ones(1, 5),
        "pair_mask": torch.ones(1, 5, 5),
    }
    args = {k: v.double() for k, v in args.items()}
    args[name] = torch.randn(*shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"PairformerBlock: argument '{name}'.*c_s = 16, c_z = 8"):
        blk(**args)
