"""The library's SwiGLU activation (turbopairformer/swiglu.h) for the transition's autograd
node: y = silu(a) * b over x = [a | b]. CUDA tensors run the kernels (one pass each way); other
tensors the same math in PyTorch ops."""

from __future__ import annotations

import torch

from . import _calls, _native


def _on_kernel(x: torch.Tensor) -> bool:
    H = x.shape[-1] // 2
    return (
        x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and x.shape[-1] % 2 == 0
        and H % 8 == 0
        and x.is_contiguous()
        and x.data_ptr() % 16 == 0
    )


def forward(x: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for x = [a | b] ([*, 2H] -> [*, H]), in x's dtype."""
    if not _on_kernel(x):
        a, b = (t.to(torch.promote_types(x.dtype, torch.float32)) for t in x.chunk(2, -1))
        return (a * torch.sigmoid(a) * b).to(x.dtype)
    y = torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)
    _calls.run(_native.LIB.tpf_swiglu_forward, _calls.struct(_native.TpfSwigluArgs, x=x, y=y), x)
    return y


def backward(x: torch.Tensor, dy: torch.Tensor):
    """(dx, y): dx = [da | db] in x's layout, and forward(x) again (bitwise)."""
    if not _on_kernel(x):
        ct = torch.promote_types(x.dtype, torch.float32)
        a, b = (t.to(ct) for t in x.chunk(2, -1))
        g, s = dy.to(ct), torch.sigmoid(a)
        da = g * b * s * (1 + a * (1 - s))
        dx = torch.cat([da, g * a * s], -1).to(x.dtype)
        return dx, (a * s * b).to(x.dtype)
    dy = dy.to(x.dtype).contiguous()
    if dy.data_ptr() % 16:  # a contiguous view at an odd offset: the kernels read 16 bytes
        dy = dy.clone()
    dx = torch.empty_like(x)
    y = torch.empty_like(dy)
    a = _calls.struct(_native.TpfSwigluArgs, x=x, y=y, dy=dy, dx=dx)
    _calls.run(_native.LIB.tpf_swiglu_backward, a, x)
    return dx, y
