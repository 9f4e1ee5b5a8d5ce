"""Plain-PyTorch references used by the tests (float64, straight from docs/DESIGN.md); the OpenFold3
layer references live in the package (turbopairformer.reference), where the benchmark uses them."""

import math

import torch

from turbopairformer.reference import (
    OpenFold3AttentionPairBias,
    OpenFold3PairBlock,
    OpenFold3PairFormerBlock,
    OpenFold3SwiGLUTransition,
    OpenFold3TriangleAttention,
    OpenFold3TriangleMultiplicativeUpdate,
)

__all__ = [
    "OpenFold3AttentionPairBias",
    "OpenFold3PairBlock",
    "OpenFold3PairFormerBlock",
    "OpenFold3SwiGLUTransition",
    "OpenFold3TriangleAttention",
    "OpenFold3TriangleMultiplicativeUpdate",
    "assert_module_matches",
    "attention_reference",
]


def attention_reference(q, k, v, bias, mask=None, scale=None):
    """docs/DESIGN.md section 1 in float64: masked keys get -inf; rows whose keys are all masked
    give zeros. A masked (query, key) pair takes no part, in the output or in any gradient: every
    masked entry is selected away (torch.where), never multiplied by 0, so that a NaN elsewhere
    in its row or column does not reach it as 0 * NaN. Any other NaN propagates, as in PyTorch."""
    q, k, v, bias = (t.double() for t in (q, k, v, bias))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if mask is None:
        return torch.softmax(scale * q @ k.transpose(-1, -2) + bias, dim=-1) @ v
    mask = mask.bool()
    key_ok = mask.transpose(-1, -2)  # [B, S, 1, N, 1]
    k, v = torch.where(key_ok, k, 0.0), torch.where(key_ok, v, 0.0)
    s = torch.where(mask, scale * q @ k.transpose(-1, -2) + bias, float("-inf"))
    p = torch.where(mask & mask.any(-1, keepdim=True), torch.softmax(s, dim=-1), 0.0)
    return p @ v


def assert_module_matches(ref, ours, x, mask, atol=1e-9):
    """Randomises ref's parameters, loads them into ours, and compares output, input gradient and
    every parameter gradient (matched by name)."""
    for p in ref.parameters():  # non-trivial LayerNorm gains and biases
        torch.nn.init.normal_(p, std=0.5)
    ours.load_state_dict(ref.state_dict())
    xr, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    yr, yo = ref(xr, mask), ours(xo, mask)
    assert torch.allclose(yr, yo, atol=atol / 10)
    g = torch.randn_like(yr)
    yr.backward(g)
    yo.backward(g)
    assert torch.allclose(xr.grad, xo.grad, atol=atol)
    ref_grads = dict(ref.named_parameters())
    for n, p in ours.named_parameters():
        assert torch.allclose(p.grad, ref_grads[n].grad, atol=atol), n
