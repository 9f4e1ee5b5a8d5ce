"""Non-finite inputs are never hidden: a NaN or an infinity in any input of either op shows up
as a non-finite value wherever plain PyTorch (FP64) shows one, in the output and in every
gradient. Only the mask makes a row zero. On the CPU the pattern of non-finite values must equal
PyTorch's exactly; on the GPU (bf16 operands) it must cover it."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable here")

import turbopairformer as tpf
from conftest import requires_gpu
from reference import OpenFold3TriangleMultiplicativeUpdate, attention_reference

DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]
VALUES = [float("nan"), float("inf"), float("-inf")]


def check_pattern(name, ours, ref, exact):
    """Returns whether the reference has a non-finite value."""
    bad_ref, bad_ours = ~torch.isfinite(ref), ~torch.isfinite(ours)
    assert not (bad_ref & ~bad_ours).any(), f"{name}: a non-finite value was hidden"
    if exact:
        assert torch.equal(bad_ref, bad_ours), f"{name}: non-finite where PyTorch is finite"
        both = ~bad_ref
        assert torch.allclose(ours[both].double(), ref[both], atol=1e-9), name
    return bool(bad_ref.any())


def run(fn, inputs, dout):
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


# ------------------------------------------------------------------ triangle attention
def attention_case(device, seed):
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    g = torch.Generator().manual_seed(seed)
    B, S, H, N, D = 1, 3, 2, 9, 16
    q, k, v, dout = (torch.randn(B, S, H, N, D, generator=g, dtype=torch.float64) for _ in range(4))
    bias = torch.randn(B, 1, H, N, N, generator=g, dtype=torch.float64)
    mask = torch.rand(B, S, 1, 1, N, generator=g) < 0.7
    mask[..., 3] = True  # the poisoned key is attended in every slice
    tensors = dict(q=q, k=k, v=v, bias=bias, dout=dout)
    return {n: t.to(device, dtype) for n, t in tensors.items()}, mask.to(device)


# (input, index): query row 2 of slice 0, key 3, the bias entry between them, one dout element.
ATTN_SITES = [
    ("q", (0, 0, 0, 2, 5)),
    ("k", (0, 0, 1, 3, 0)),
    ("v", (0, 1, 0, 3, 7)),
    ("bias", (0, 0, 1, 2, 3)),
    ("dout", (0, 2, 0, 4, 1)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", VALUES, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("site, index", ATTN_SITES, ids=[s for s, _ in ATTN_SITES])
def test_attention_never_hides_a_non_finite_input(device, value, site, index):
    t, mask = attention_case(device, seed=hash((site, value)) % 1000)
    t[site][index] = value
    inputs = [t[n] for n in ("q", "k", "v", "bias")]
    ours = run(lambda a, b, c, d: tpf.triangle_attention(a, b, c, d, mask), inputs, t["dout"])
    ref = run(
        lambda a, b, c, d: attention_reference(a, b, c, d, mask),
        [x.double() for x in inputs],
        t["dout"].double(),
    )
    seen = [
        check_pattern(n, x, y, device == "cpu")
        for n, x, y in zip(("out", "dq", "dk", "dv", "dbias"), ours, ref)
    ]
    # one -inf bias entry only removes a key from one row: everything stays finite
    assert any(seen) or (site == "bias" and value == float("-inf"))


@pytest.mark.parametrize("device", DEVICES)
def test_a_nan_query_in_a_fully_masked_slice_still_gives_zeros_on_cpu_and_no_hidden_nan(device):
    """The mask alone decides zero rows: slice 1 has every key masked and gives zeros; a NaN in
    slice 0 gives NaN there and nowhere the mask zeroes."""
    t, mask = attention_case(device, seed=5)
    mask[:, 1] = False
    t["q"][0, 0, 0, 2, 0] = float("nan")
    out = tpf.triangle_attention(t["q"], t["k"], t["v"], t["bias"], mask)
    assert torch.isnan(out[0, 0, 0, 2]).all()
    assert torch.all(out[0, 1] == 0)


# ------------------------------------------------------- triangle multiplicative update
def trimul_case(device, seed, C=32, N=12):
    g = torch.Generator().manual_seed(seed)
    wdtype = torch.float64 if device == "cpu" else torch.float32

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(device, wdtype)

    w = dict(
        norm_in_weight=1 + rnd(C, scale=0.1),
        norm_in_bias=rnd(C, scale=0.1),
        p_in_weight=rnd(2 * C, C, scale=C**-0.5),
        p_in_bias=rnd(2 * C, scale=0.1),
        g_in_weight=rnd(2 * C, C, scale=C**-0.5),
        g_in_bias=rnd(2 * C, scale=0.1),
        norm_out_weight=1 + rnd(C, scale=0.1),
        norm_out_bias=rnd(C, scale=0.1),
        p_out_weight=rnd(C, C, scale=C**-0.5),
        p_out_bias=rnd(C, scale=0.1),
        g_out_weight=rnd(C, C, scale=C**-0.5),
        g_out_bias=rnd(C, scale=0.1),
    )
    z = torch.randn(1, N, N, C, generator=g, dtype=torch.float64)
    mask = (torch.rand(1, N, N, generator=g) < 0.8).double()
    mask[0, 2, 3] = 1.0
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    return (
        z.to(device, dtype),
        mask.to(device, wdtype),
        w,
        torch.randn(z.shape, generator=g).to(device, dtype),
    )


def trimul_reference(z, direction, mask, w):
    """OpenFold3's module in plain PyTorch (FP64), loaded with the op's packed weights."""
    Ch = w["p_in_weight"].shape[0] // 2
    ref = OpenFold3TriangleMultiplicativeUpdate(z.shape[-1], Ch, outgoing=direction == "outgoing")
    ref = ref.double().to(z.device)
    params = {
        "layer_norm_in.weight": w["norm_in_weight"],
        "layer_norm_in.bias": w["norm_in_bias"],
        "layer_norm_out.weight": w["norm_out_weight"],
        "layer_norm_out.bias": w["norm_out_bias"],
        "linear_z.weight": w["p_out_weight"],
        "linear_z.bias": w["p_out_bias"],
        "linear_g.weight": w["g_out_weight"],
        "linear_g.bias": w["g_out_bias"],
    }
    for key, half in (("p", 0), ("g", 1)):
        for part, rows in (("a", slice(0, Ch)), ("b", slice(Ch, 2 * Ch))):
            params[f"linear_{part}_{key}.weight"] = w[f"{key}_in_weight"][rows]
            params[f"linear_{part}_{key}.bias"] = w[f"{key}_in_bias"][rows]
    # functional_call keeps the given tensors (and their autograd graph) as the parameters
    params = {n: p.double() for n, p in params.items()}
    return torch.func.functional_call(ref, params, (z.double(), mask.double()))


TRIMUL_SITES = [
    ("z", (0, 2, 3, 1)),
    ("mask", (0, 2, 3)),
    ("norm_in_weight", (4,)),
    ("p_in_weight", (3, 5)),
    ("g_in_weight", (40, 2)),
    ("p_out_weight", (6, 1)),
    ("g_out_weight", (0, 9)),
    ("dout", (0, 5, 1, 2)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
@pytest.mark.parametrize("value", VALUES, ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("site, index", TRIMUL_SITES, ids=[s for s, _ in TRIMUL_SITES])
def test_trimul_never_hides_a_non_finite_input(device, direction, value, site, index):
    z, mask, w, dout = trimul_case(device, seed=hash((site, value, direction)) % 1000)
    {"z": z, "mask": mask, "dout": dout, **w}[site][index] = value
    names = list(w)
    inputs = [z] + [w[n] for n in names]

    def ours_fn(x, *ws):
        return tpf.triangle_multiplicative_update(x, direction, mask, **dict(zip(names, ws)))

    def ref_fn(x, *ws):
        return trimul_reference(x, direction, mask, dict(zip(names, ws)))

    ours = run(ours_fn, inputs, dout)
    ref = run(ref_fn, [t.double() for t in inputs], dout.double())
    seen = [
        check_pattern(n, x, y, device == "cpu")
        for n, x, y in zip(["out", "dz"] + ["d_" + n for n in names], ours, ref)
    ]
    assert any(seen), "the poison reached nothing (test set-up)"
