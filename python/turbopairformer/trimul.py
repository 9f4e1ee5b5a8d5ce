"""The triangle multiplicative update (AF3 Algorithms 12 and 13) as torch.library custom ops,
argument-compatible with cuequivariance_torch.triangle_multiplicative_update.

CPU tensors run the FP64 reference (exact, slow); CUDA tensors (bf16 x, bf16 or fp32 weights)
the fused kernels, with their workspace from PyTorch's caching allocator.
"""
from __future__ import annotations

import contextlib
import ctypes
from typing import Optional

import torch

from . import _native
from .attention import _stream, _tensor, _workspace

_DIRECTIONS = {"outgoing": 0, "incoming": 1}


def _args(x, mask, weights, direction, eps, **extra) -> _native.TpfTrimulArgs:
    a = _native.TpfTrimulArgs()
    a.z = _tensor(x, "z")  # the pair tensor: named z in the core's messages
    a.mask = _tensor(mask, "mask")
    for name, t in extra.items():
        if name == "dw":
            for i, g in enumerate(t):
                a.dw[i] = _tensor(g, "d_" + _native.TRIMUL_WEIGHTS[i])
        else:
            setattr(a, name, _tensor(t, name))
    for i, w in enumerate(weights):
        a.w[i] = _tensor(w, _native.TRIMUL_WEIGHTS[i])
    a.direction = direction
    a.eps = eps
    return a


def _saved_bytes(x, p_in_weight) -> int:
    """Bytes of the saved set a CUDA training forward keeps for the backward (shapes only)."""
    return int(_native.LIB.tpf_trimul_saved_size(int(x.shape[0]), int(x.shape[1]), int(x.shape[3]),
                                                  int(p_in_weight.shape[0]) // 2))


def _saved_buffer(x, p_in_weight, save: bool) -> torch.Tensor:
    """The saved set's buffer (empty where nothing is saved: CPU, inference, bad shapes)."""
    n = _saved_bytes(x, p_in_weight) if save and x.is_cuda and p_in_weight is not None and x.dim() == 4 else 0
    return torch.empty(n, dtype=torch.uint8, device=x.device)


def _call(fn, a, x, backward: bool):
    err = _native.error_buffer()
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        workspace, ptr, ws_bytes = _workspace(_native.LIB.tpf_trimul_workspace_size, a, x, err,
                                              int(backward))
        _native.check(fn(ctypes.byref(a), int(x.is_cuda), ptr, ws_bytes, _stream(x), err, len(err)), err)


# The twelve weights are separate optional arguments (not a list): the schema then says exactly
# which gradient belongs to which input. Order: norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias.
def _with_saved(a, saved: torch.Tensor):
    if saved.numel():
        a.saved = saved.data_ptr()
        a.saved_bytes = saved.numel()
    return a


# save: also return the saved set (what the backward needs from the forward) for autograd; an
# empty tensor where nothing is saved (CPU, save=False).
@torch.library.custom_op("turbopairformer::trimul_fwd", mutates_args=())
def _trimul_fwd(x: torch.Tensor, mask: Optional[torch.Tensor], norm_in_weight: Optional[torch.Tensor], norm_in_bias: Optional[torch.Tensor], p_in_weight: Optional[torch.Tensor], p_in_bias: Optional[torch.Tensor], g_in_weight: Optional[torch.Tensor], g_in_bias: Optional[torch.Tensor], norm_out_weight: Optional[torch.Tensor], norm_out_bias: Optional[torch.Tensor], p_out_weight: Optional[torch.Tensor], p_out_bias: Optional[torch.Tensor], g_out_weight: Optional[torch.Tensor], g_out_bias: Optional[torch.Tensor],
                direction: int, eps: float, save: bool) -> tuple[torch.Tensor, torch.Tensor]:
    weights = [norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    saved = _saved_buffer(x, p_in_weight, save)
    _call(_native.LIB.tpf_trimul_forward,
          _with_saved(_args(x, mask, weights, direction, eps, out=out), saved), x, False)
    return out, saved


@_trimul_fwd.register_fake
def _(x, mask, norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias, direction, eps, save):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _saved_buffer(x, p_in_weight, save)


# saved: the forward's saved set, or empty (the backward then recomputes the forward).
@torch.library.custom_op("turbopairformer::trimul_bwd", mutates_args=())
def _trimul_bwd(dout: torch.Tensor, saved: torch.Tensor, x: torch.Tensor, mask: Optional[torch.Tensor], norm_in_weight: Optional[torch.Tensor], norm_in_bias: Optional[torch.Tensor], p_in_weight: Optional[torch.Tensor], p_in_bias: Optional[torch.Tensor], g_in_weight: Optional[torch.Tensor], g_in_bias: Optional[torch.Tensor], norm_out_weight: Optional[torch.Tensor], norm_out_bias: Optional[torch.Tensor], p_out_weight: Optional[torch.Tensor], p_out_bias: Optional[torch.Tensor], g_out_weight: Optional[torch.Tensor], g_out_bias: Optional[torch.Tensor],
                direction: int, eps: float) -> list[torch.Tensor]:
    weights = [norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias]
    dout = dout.contiguous()
    dz = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = [torch.empty_like(w) if w is not None else None for w in weights]
    _call(_native.LIB.tpf_trimul_backward,
          _with_saved(_args(x, mask, weights, direction, eps, dout=dout, dz=dz, dw=dw), saved), x, True)
    # absent weights get an empty placeholder (a custom op returns tensors only)
    return [dz] + [g if g is not None else x.new_empty(0) for g in dw]


@_trimul_bwd.register_fake
def _(dout, saved, x, mask, norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias, direction, eps):
    weights = [norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias, norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias]
    return [torch.empty_like(x, memory_format=torch.contiguous_format)] + [
        torch.empty_like(w) if w is not None else x.new_empty(0) for w in weights]


def _setup_context(ctx, inputs, output):
    x, mask, *weights, direction, eps, _save = inputs
    # The saved set is the backward's input, not a result: without set_materialize_grads(False)
    # autograd would fill a zero gradient of its size (1.3 GB at N = 768) on every backward,
    # 0.40 ms of a 5.6 ms training step (dev/scripts/device_trimul_py_profile.py).
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1], x, mask, *weights)
    ctx.direction, ctx.eps = direction, eps


def _backward(ctx, dout, _dsaved):
    if dout is None:  # (grads are not materialized) out took no part in what is differentiated
        return (None,) * len(ctx.needs_input_grad)
    saved, x, mask, *weights = ctx.saved_tensors
    dz, *dw = _trimul_bwd(dout, saved, x, mask, *weights, ctx.direction, ctx.eps)
    grads = [g if w is not None else None for g, w in zip(dw, weights)]
    return (dz, None, *grads, None, None, None)


torch.library.register_autograd("turbopairformer::trimul_fwd", _backward,
                                setup_context=_setup_context)


def _plain_trimul(x, direction, mask, weights, eps):
    """docs/DESIGN.md section 2 in plain PyTorch, for empty problems (B = 0 or N = 0), where it is exact
    and free: an empty output, zero weight gradients."""
    ln_w, ln_b, p_w, p_b, g_w, g_b, lo_w, lo_b, po_w, po_b, go_w, go_b = weights
    F = torch.nn.functional
    zn = F.layer_norm(x, x.shape[-1:], ln_w, ln_b, eps)
    ab = torch.sigmoid(F.linear(zn, g_w, g_b)) * F.linear(zn, p_w, p_b)
    if mask is not None:
        ab = ab * mask.unsqueeze(-1).to(ab.dtype)
    a, b = ab.chunk(2, dim=-1)
    eq = "bikc,bjkc->bijc" if direction == "outgoing" else "bkic,bkjc->bijc"
    y = F.layer_norm(torch.einsum(eq, a, b), a.shape[-1:], lo_w, lo_b, eps)
    return torch.sigmoid(F.linear(zn, go_w, go_b)) * F.linear(y, po_w, po_b)


def triangle_multiplicative_update(
        x: torch.Tensor, direction: str = "outgoing", mask: Optional[torch.Tensor] = None,
        norm_in_weight: Optional[torch.Tensor] = None, norm_in_bias: Optional[torch.Tensor] = None,
        p_in_weight: Optional[torch.Tensor] = None, p_in_bias: Optional[torch.Tensor] = None,
        g_in_weight: Optional[torch.Tensor] = None, g_in_bias: Optional[torch.Tensor] = None,
        norm_out_weight: Optional[torch.Tensor] = None, norm_out_bias: Optional[torch.Tensor] = None,
        p_out_weight: Optional[torch.Tensor] = None, p_out_bias: Optional[torch.Tensor] = None,
        g_out_weight: Optional[torch.Tensor] = None, g_out_bias: Optional[torch.Tensor] = None,
        eps: float = 1e-5) -> torch.Tensor:
    """Triangle multiplicative update (docs/DESIGN.md section 2), cuEquivariance's weight packing:
    p_in_weight = [Wap; Wbp] (2Ch x C), g_in_weight = [Wag; Wbg], p_out_weight = Wz (C x Ch),
    g_out_weight = Wg (C x C); biases optional. x: [B, N, N, C] or [N, N, C]; mask: [B, N, N].

    When autograd will differentiate the call, the CUDA forward also keeps the intermediates its
    backward needs (~2.3 KB per pair at C = Ch = 128) so that the backward does not recompute
    the forward; under torch.no_grad() (or with nothing requiring grad) it keeps nothing."""
    if direction not in _DIRECTIONS:
        raise ValueError(f"turbopairformer: argument 'direction': expected 'outgoing' or "
                         f"'incoming', got {direction!r}")
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
        mask = mask.unsqueeze(0) if mask is not None else None
    weights = [norm_in_weight, norm_in_bias, p_in_weight, p_in_bias, g_in_weight, g_in_bias,
               norm_out_weight, norm_out_bias, p_out_weight, p_out_bias, g_out_weight, g_out_bias]
    # Training keeps the forward's intermediates for the backward (it then skips recomputing
    # the forward); inference keeps nothing.
    if x.dim() == 4 and x.numel() == 0:
        out = _plain_trimul(x, direction, mask, weights, eps)
    else:
        save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in [x] + weights)
        out, _ = _trimul_fwd(x, mask, *weights, _DIRECTIONS[direction], float(eps), save)
    return out.squeeze(0) if unbatched else out
