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


def blocked(wa: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """The up projection's weight as the fused forward takes it: wa's and wb's rows ([H, C]
    each) in alternating 64-row blocks ([2H, C]), so that one GEMM tile holds both halves of its
    channels (turbopairformer/swiglu.h)."""
    H, C = wa.shape
    pairs = torch.stack([wa.reshape(H // 64, 64, C), wb.reshape(H // 64, 64, C)], 1)
    return pairs.reshape(2 * H, C)


def _fused(u: torch.Tensor, w: torch.Tensor, H: int) -> bool:
    """Whether the fused projection kernels take u ([*, C]) and a weight w with half width H."""
    return (
        u.is_cuda
        and u.dtype in (torch.bfloat16, torch.float16)
        and w.dtype == u.dtype
        and H % 64 == 0
        and u.shape[-1] % 8 == 0
        and u.is_contiguous()
        and w.is_contiguous()
        and u.data_ptr() % 16 == 0
        and w.data_ptr() % 16 == 0
    )


def project(u: torch.Tensor, wa: torch.Tensor, wb: torch.Tensor, w_up=None):
    """(x, y): x = u [wa | wb]ᵀ ([*, C] -> [*, 2H], in u's dtype) and y = forward(x). On the
    kernel the activation runs in the GEMM's epilogue; w_up is blocked(wa, wb) where the caller
    has it already."""
    H = wa.shape[0]
    if not _fused(u, wa, H):
        x = torch.nn.functional.linear(u, torch.cat([wa, wb]))
        return x, forward(x)
    w_up = blocked(wa, wb) if w_up is None else w_up
    x = torch.empty((*u.shape[:-1], 2 * H), dtype=u.dtype, device=u.device)
    y = torch.empty((*u.shape[:-1], H), dtype=u.dtype, device=u.device)
    a = _calls.struct(_native.TpfSwigluArgs, x=x, y=y, u=u, w_up=w_up)
    _calls.run(_native.LIB.tpf_swiglu_forward, a, x)
    return x, y


def project_backward(x: torch.Tensor, g: torch.Tensor, w_down: torch.Tensor):
    """(dx, y) = backward(x, g w_down) for g [*, C] and w_down [C, H]; on the kernel g w_down
    is the GEMM's fp32 accumulator, never rounded or stored."""
    H = x.shape[-1] // 2
    g = g.to(x.dtype)
    if not (_fused(g, w_down, H) and _on_kernel(x)):
        return backward(x, g @ w_down)
    dx = torch.empty_like(x)
    y = torch.empty((*x.shape[:-1], H), dtype=x.dtype, device=x.device)
    a = _calls.struct(_native.TpfSwigluArgs, x=x, y=y, dx=dx, g=g, w_down=w_down)
    _calls.run(_native.LIB.tpf_swiglu_backward, a, x)
    return dx, y
