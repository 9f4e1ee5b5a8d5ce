"""The library's fused SwiGLU transition (turbopairformer/transition.h). The forward: LayerNorm,
the stacked up projection, silu(a) * b and the down projection, plus the residual add, in one
kernel that keeps the [rows, 2H] hidden activation on chip. The backward's middle: the
activation recomputed on chip, SwiGLU's backward and the input-side product in one kernel. Built for C = 128 rows in bf16
compute on sm_90; other cases take the unfused path (layers.swiglu_transition)."""

from __future__ import annotations

import functools

import torch

from . import _calls, _native

C = 128


@functools.cache
def _sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def supported(x: torch.Tensor, wab: torch.Tensor, cd: torch.dtype, scale) -> bool:
    """Whether the fused kernel takes this call: x [*, 128] fp32 or bf16 on an sm_90 GPU, bf16
    compute, H a multiple of 64, and a scale (if any) of one value a row."""
    rows = x.numel() // C if x.shape[-1] == C else 0
    return (
        x.is_cuda
        and rows > 0
        and cd == torch.bfloat16
        and x.dtype in (torch.float32, torch.bfloat16)
        and wab.shape[0] % 128 == 0
        and (scale is None or scale.numel() == rows)
        and _sm90(x.device.index if x.device.index is not None else torch.cuda.current_device())
    )


def forward(x, ln_w, ln_b, eps, wab, wo, residual: bool, scale=None):
    """(out, xhat, mean, rstd): out = x + scale * transition(x) (residual) in x's dtype, or
    transition(x) in bf16; xhat = LayerNorm(x) in bf16 and its fp32 row statistics. x
    contiguous; wab [2H, C] and wo [C, H] bf16 contiguous."""
    rows = x.numel() // max(x.shape[-1], 1)
    out = (
        torch.empty_like(x)
        if residual
        else torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    )
    xhat = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    params = [None if t is None else t.float().contiguous() for t in (ln_w, ln_b)]
    s = None if scale is None else scale.reshape(-1).float().contiguous()  # checked: one a row
    a = _calls.struct(
        _native.TpfTransitionArgs,
        x=x,
        ln_w=params[0],
        ln_b=params[1],
        w_ab=wab,
        w_o=wo,
        scale=s,
        out=out,
        xhat=xhat,
        mean=mean,
        rstd=rstd,
    )
    a.eps, a.residual = eps, int(residual)
    _calls.run(_native.LIB.tpf_transition_forward, a, x)
    return out, xhat, mean, rstd


def backward(xhat, g, wab, wo):
    """(h, dab, dxhat) from xhat (the forward's) and g, the gradient of the down projection's
    output: h = silu(a) b, dab = [da | db] and dxhat = dab wab, with [a | b] = xhat wab^T and
    g wo recomputed on chip; all bf16. xhat, g [*, C] contiguous bf16."""
    H = wab.shape[0] // 2
    lead = xhat.shape[:-1]
    h = torch.empty((*lead, H), dtype=torch.bfloat16, device=xhat.device)
    dab = torch.empty((*lead, 2 * H), dtype=torch.bfloat16, device=xhat.device)
    dxhat = torch.empty_like(xhat)
    a = _calls.struct(
        _native.TpfTransitionBackwardArgs,
        xhat=xhat,
        g=g,
        w_ab=wab,
        w_o=wo,
        h=h,
        dab=dab,
        dxhat=dxhat,
    )
    _calls.run(_native.LIB.tpf_transition_backward, a, xhat)
    return h, dab, dxhat
