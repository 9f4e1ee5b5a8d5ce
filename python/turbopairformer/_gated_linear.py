"""The library's fused gated output projection (turbopairformer/gated_linear.h) for the attention
layer's node: out = x + scale * (sigmoid(g) * o) W^T + b in one pass, the gated activation never
written. Built for 128 gate channels and 128 output channels in bf16 on sm_90; other cases take
the unfused path (_attention_layer._TriangleAttentionLayer), and the backward is always the
unfused one."""

from __future__ import annotations

import torch

from . import _calls, _gate, _native, _residual
from ._transition import _sm90

K = N = 128


def _rows_ok(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and _gate.rows_ok(t) and t.shape[1] == K


def supported(g, o, w, x, scale, shape) -> bool:
    """Whether the fused kernel takes this call: CUDA bf16 g, o [R, 128] (unit last stride,
    16-byte rows), w [128, 128], the pair shape [B, I, J, 128] with the residual x fp32 or bf16
    contiguous and 16-byte aligned, a bf16 scale broadcastable to it, on an sm_90 GPU. Without a
    residual the unfused path is as fast (bench/results/h200/gated_linear.md), so it runs that."""
    return (
        x is not None
        and g.is_cuda
        and g.shape[0] > 0
        and len(shape) == 4
        and shape[-1] == N
        and tuple(w.shape) == (N, K)
        and w.dtype == torch.bfloat16
        and _rows_ok(g)
        and _rows_ok(o)
        and x.dtype in (torch.float32, torch.bfloat16)
        and x.is_contiguous()
        and x.data_ptr() % 16 == 0
        and (scale is None or _residual._scale_ok(scale, x, torch.bfloat16))
        and _sm90(g.device.index if g.device.index is not None else torch.cuda.current_device())
    )


def forward(g, o, w, bias, x, scale, shape) -> torch.Tensor:
    """out [B, I, J, 128]: x + scale * (sigmoid(g) o) w^T + bias in x's dtype, or without x the
    projection alone in bf16. g, o [R, 128]; w [128, 128] and bias [128] (or None) bf16."""
    dtype = torch.bfloat16 if x is None else x.dtype
    out = torch.empty(shape, dtype=dtype, device=g.device)
    s = None if scale is None else scale.expand(shape)
    a = _calls.struct(_native.TpfGatedLinearArgs, g=g, o=o, w=w, bias=bias, x=x, scale=s, out=out)
    _calls.run(_native.LIB.tpf_gated_linear_forward, a, g)
    return out
