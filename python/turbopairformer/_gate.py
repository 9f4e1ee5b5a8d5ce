"""The library's sigmoid gate (turbopairformer/gate.h) for the attention layers' autograd node:
y = sigmoid(g) * o over [R, W] rows, each operand with its own row stride, so that g can be a
column block of the stacked projection and dg is written straight into its gradient. CUDA
tensors run the kernels (one pass each way); other tensors the same math in PyTorch ops."""

from __future__ import annotations

from typing import Optional

import torch

from . import _calls, _native


def rows_ok(t: torch.Tensor) -> bool:
    """[R, W] with a unit last stride and 16-byte aligned rows: what the kernels read directly."""
    e = t.element_size()
    return (
        t.dim() == 2 and t.stride(1) == 1 and (t.stride(0) * e) % 16 == 0 and t.data_ptr() % 16 == 0
    )


def _on_kernel(*ts: torch.Tensor) -> bool:
    g = ts[0]
    return (
        g.is_cuda
        and g.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and g.shape[0] > 0
        and g.shape[1] > 0
        and g.shape[1] % 8 == 0
        and all(t.dtype == g.dtype and rows_ok(t) for t in ts)
    )


def _call(fn, **tensors) -> None:
    _calls.run(fn, _calls.struct(_native.TpfSigmoidGateArgs, **tensors), tensors["g"])


def forward(g: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """sigmoid(g) * o: [R, W] each -> [R, W] contiguous, in g's dtype."""
    if not _on_kernel(g, o):
        ct = torch.promote_types(g.dtype, torch.float32)
        return (torch.sigmoid(g.to(ct)) * o.to(ct)).to(g.dtype)
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    _call(_native.LIB.tpf_sigmoid_gate_forward, g=g, o=o, y=y)
    return y


def delta_on_kernel(g: torch.Tensor, heads: int) -> bool:
    """Whether backward's kernel gives the heads' delta for this g (16-bit, D / 8 a power of
    two up to 32); callers compute it themselves otherwise."""
    D = g.shape[1] // heads if heads else 0
    lanes = D // 8
    return (
        g.dtype in (torch.bfloat16, torch.float16)
        and D * heads == g.shape[1]
        and D % 8 == 0
        and 0 < lanes <= 32
        and lanes & (lanes - 1) == 0
    )


def backward(
    g: torch.Tensor,
    o: torch.Tensor,
    dy: torch.Tensor,
    dg: Optional[torch.Tensor] = None,
    res: Optional[torch.Tensor] = None,
    delta: Optional[torch.Tensor] = None,
):
    """(dg, do, y) from the gradient dy of y: dg written into the given [R, W] view where one
    comes, do contiguous, and y = forward(g, o) again (bitwise). delta: an fp32 [B, I, J, H]
    view (B I J = R, W = H D) the kernel fills with each head's sum of do (o + res), the
    attention backward's Dlt (gate.h), in its order where delta_on_kernel (elsewhere by PyTorch
    ops)."""
    dy = dy.to(g.dtype)
    dg = torch.empty(g.shape, dtype=g.dtype, device=g.device) if dg is None else dg
    d_o = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    if not _on_kernel(g, o, dy, dg, *([] if res is None else [res])):
        ct = torch.promote_types(g.dtype, torch.float32)
        s, ov, dyv = torch.sigmoid(g.to(ct)), o.to(ct), dy.to(ct)
        dg.copy_(dyv * ov * s * (1 - s))
        d_o.copy_(dyv * s)
        if delta is not None:
            full = ov if res is None else ov + res.to(ct)
            delta.copy_((d_o.to(ct) * full).view(*delta.shape, -1).sum(-1))
        return dg, d_o, (s * ov).to(g.dtype)
    y = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    _call(
        _native.LIB.tpf_sigmoid_gate_backward,
        g=g, o=o, y=y, dy=dy, dg=dg, d_o=d_o, out_residual=res, delta=delta,
    )  # fmt: skip
    return dg, d_o, y
