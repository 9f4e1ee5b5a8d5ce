"""The library's residual update (turbopairformer/residual.h) for the pair modules' nodes:
out = z + scale * u and du = dout * scale, one pass each, for [B, I, J, C] tensors with a scale
broadcast through strides (a shared dropout mask, a row mask). CUDA tensors run the kernels
where they are built for the case; everything else the same math in PyTorch ops."""

from __future__ import annotations

from typing import Optional

import torch

from . import _calls, _native

_PAIRS = {
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
}


def _on_kernel(lead: torch.Tensor, u_dtype: torch.dtype, scale: Optional[torch.Tensor]) -> bool:
    return (
        lead.is_cuda
        and lead.dim() == 4
        and lead.numel() > 0
        and lead.shape[-1] % 8 == 0
        and (lead.dtype, u_dtype) in _PAIRS
        and lead.is_contiguous()
        and lead.data_ptr() % 16 == 0
        and (scale is None or _scale_ok(scale, lead, u_dtype))
    )


def _scale_ok(scale: torch.Tensor, lead: torch.Tensor, u_dtype: torch.dtype) -> bool:
    if scale.dtype != u_dtype or scale.device != lead.device:
        return False
    try:
        s = scale.expand(lead.shape)
    except RuntimeError:
        return False
    if s.stride(-1) == 0:
        return True
    step = 16 // s.element_size()
    return (
        s.stride(-1) == 1 and s.data_ptr() % 16 == 0 and all(x % step == 0 for x in s.stride()[:-1])
    )


def _call(fn, lead, **tensors) -> None:
    _calls.run(fn, _calls.struct(_native.TpfResidualArgs, **tensors), lead)


def forward(z: torch.Tensor, u: torch.Tensor, scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """z + scale * u in z's dtype (scale None: 1; else broadcastable to z, in u's dtype)."""
    if not (_on_kernel(z, u.dtype, scale) and u.is_contiguous() and u.data_ptr() % 16 == 0):
        return z + u if scale is None else torch.addcmul(z, u, scale)
    out = torch.empty_like(z)
    s = None if scale is None else scale.expand(z.shape)
    _call(_native.LIB.tpf_residual_forward, z, z=z, u=u, scale=s, out=out)
    return out


def backward(dout: torch.Tensor, scale: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """dout * scale in dtype (the update's), one pass."""
    if not _on_kernel(dout, dtype, scale):
        if scale is None:
            return dout.to(dtype)
        return torch.mul(dout, scale, out=torch.empty(dout.shape, dtype=dtype, device=dout.device))
    du = torch.empty(dout.shape, dtype=dtype, device=dout.device)
    s = None if scale is None else scale.expand(dout.shape)
    _call(_native.LIB.tpf_residual_backward, dout, dout=dout, scale=s, du=du)
    return du
