"""Triangle attention as torch.library custom ops (autograd, fake/meta implementations), so it
works under torch.compile, CUDA graphs and torch.library.opcheck.

    triangle_attention(q, k, v, bias, mask=None, scale=None, *, compensate=True)

q, k, v: [B, S, H, N, D] (or more leading batch dims); bias: [B, 1, H, N, N], finite (a bias
in q's dtype is added by the tensor cores, where an infinity gives NaN: express -inf with the
mask); mask: [B, S, 1, 1, N] bool, True = attend. CUDA tensors run the sm_90a kernels on the
current stream;
CPU tensors run the FP64 reference (slow, exact), so models can be debugged anywhere.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import _calls, _native


def _args(scale: float, compensate: bool, **tensors) -> _native.TpfAttentionArgs:
    a = _calls.struct(_native.TpfAttentionArgs, **tensors)
    a.scale = scale
    a.compensate = int(compensate)
    return a


def _forward_tensors(q, k, v, bias, mask, out, res, lse, compensate) -> dict:
    """The forward's tensors of the C struct (the backward reads them too)."""
    residual = res if compensate else None
    return dict(q=q, k=k, v=v, bias=bias, mask=mask, out=out, out_residual=residual, lse=lse)


def forward_into(q, k, v, bias, mask, scale, compensate, out, res, lse) -> None:
    """The forward kernel (the reference on the CPU) writing the given out, res (used when
    compensate) and lse, any strides the core takes: what the custom op and the fused layer
    (turbopairformer.layers) share."""
    a = _args(scale, compensate, **_forward_tensors(q, k, v, bias, mask, out, res, lse, compensate))
    _calls.run(_native.LIB.tpf_attention_forward, a, q)


def backward_into(
    dout, q, k, v, bias, mask, out, res, lse, scale, compensate, dq, dk, dv, dbias, delta=None
):
    """The backward writing the given dq, dk, dv and dbias (None: not computed), any strides
    the core takes, e.g. views of one stacked projection's gradient. delta: the rows' Dlt =
    <dout, out (+ res)>, fp32 [B, S, H, N] contiguous, where the caller has it (the gate's
    backward gives it); None: the backward computes it."""
    a = _args(
        scale,
        compensate,
        **_forward_tensors(q, k, v, bias, mask, out, res, lse, compensate),
        dout=dout,
        dq=dq,
        dk=dk,
        dv=dv,
        dbias=dbias,
        delta=delta,
    )
    lib = _native.LIB
    _calls.call_with_workspace(
        lib.tpf_attention_backward, lib.tpf_attention_backward_workspace_size, a, q
    )


@torch.library.custom_op("turbopairformer::triangle_attention_fwd", mutates_args=())
def _attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    mask: Optional[torch.Tensor],
    scale: float,
    compensate: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = torch.empty_like(q)
    res = torch.empty_like(q) if compensate else q.new_empty(0)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    forward_into(q, k, v, bias, mask, scale, compensate, out, res, lse)
    return out, res, lse


@_attention_fwd.register_fake
def _(q, k, v, bias, mask, scale, compensate):
    res = torch.empty_like(q) if compensate else q.new_empty(0)
    return torch.empty_like(q), res, q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("turbopairformer::triangle_attention_bwd", mutates_args=())
def _attention_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    mask: Optional[torch.Tensor],
    out: torch.Tensor,
    res: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    compensate: bool,
    need_dbias: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if not _calls.vector_friendly(dout):  # e.g. the expanded gradient of a sum
        dout = dout.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = torch.empty_like(bias) if need_dbias else bias.new_empty(0)
    grads = (dq, dk, dv, dbias if need_dbias else None)
    backward_into(dout, q, k, v, bias, mask, out, res, lse, scale, compensate, *grads)
    return dq, dk, dv, dbias


@_attention_bwd.register_fake
def _(dout, q, k, v, bias, mask, out, res, lse, scale, compensate, need_dbias):
    dbias = torch.empty_like(bias) if need_dbias else bias.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dbias


def _setup_context(ctx, inputs, output):
    q, k, v, bias, mask, scale, compensate = inputs
    out, res, lse = output
    # The residual and the LSE are the backward's inputs, not results: without these two lines
    # autograd would fill a zero gradient for each on every backward (a tensor of out's size).
    ctx.mark_non_differentiable(res, lse)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, bias, mask, out, res, lse)
    ctx.scale, ctx.compensate = scale, compensate


def _backward(ctx, dout, _dres, _dlse):
    if dout is None:  # (grads are not materialized) out took no part in what is differentiated
        return (None,) * len(ctx.needs_input_grad)
    q, k, v, bias, mask, out, res, lse = ctx.saved_tensors
    dq, dk, dv, dbias = _attention_bwd(
        dout, q, k, v, bias, mask, out, res, lse, ctx.scale, ctx.compensate, ctx.needs_input_grad[3]
    )
    return dq, dk, dv, (dbias if ctx.needs_input_grad[3] else None), None, None, None


torch.library.register_autograd(
    "turbopairformer::triangle_attention_fwd", _backward, setup_context=_setup_context
)


def _flatten_batch(x: Optional[torch.Tensor], keep: int) -> Optional[torch.Tensor]:
    """Leading batch dims beyond the first are folded into it (a view where possible)."""
    if x is None or x.dim() <= keep:
        return x
    return x.flatten(0, x.dim() - keep)


# Head dims the CUDA kernels are built for; any other D <= 128 with D % 8 == 0 runs on the next
# one up, zero-padded (a zero column adds nothing to Q K^T and gives a zero output column).
NATIVE_HEAD_DIMS = (16, 32, 64, 128)


def _check_head_dim(q: torch.Tensor) -> int:
    D = q.shape[-1] if q.dim() else 0
    if not (8 <= D <= 128 and D % 8 == 0):
        raise ValueError(
            f"turbopairformer: argument 'q': head dim D={D} is not supported; D must "
            f"be a multiple of 8 from 8 to 128 ({', '.join(map(str, NATIVE_HEAD_DIMS))} "
            "run natively, the others zero-padded to the next of those)"
        )
    return D


def _padded_head_dim(D: int) -> int:
    return next(d for d in NATIVE_HEAD_DIMS if d >= D)


def _plain_attention(q, k, v, bias, mask, scale):
    """docs/DESIGN.md section 1 in plain PyTorch, for empty problems (N = 0 or S = 0), where it is
    exact and free: empty outputs, and a zero bias gradient when there are no slices."""
    s = scale * (q @ k.transpose(-1, -2)) + bias.to(q.dtype)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def triangle_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    *,
    compensate: bool = True,
) -> torch.Tensor:
    """Triangle attention (argument-compatible with cuequivariance_torch.triangle_attention).

    Args:
        q, k, v: [B, S, H, N, D] (extra leading batch dims allowed), bf16/fp16 on CUDA, any float
            dtype on CPU; head-dim stride 1. D is a multiple of 8 up to 128: 16, 32, 64 and 128
            run natively, the others on the next of those with zero padding (same results).
        bias: [B, 1, H, N, N], q's dtype or fp32; its gradient comes back in its dtype.
        mask: optional [B, S, 1, 1, N] bool, True = attend. A row with every key masked gives
            zeros and zero gradients. A NaN in an attended input gives NaN, never zeros.
        scale: defaults to 1 / sqrt(D) of the caller's D.
        compensate: keep the forward's rounding residual for a more exact backward.

    Returns:
        [B, S, H, N, D] (with q's leading dims). N = 0 or S = 0 gives an empty result.
    """
    D = _check_head_dim(q)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    lead = q.shape[:-4]
    q, k, v, bias, mask = (_flatten_batch(t, 5) for t in (q, k, v, bias, mask))
    if q.numel() == 0:
        out = _plain_attention(q, k, v, bias, mask, scale)
    else:
        Dp = _padded_head_dim(D) if q.is_cuda else D
        if Dp != D:
            q, k, v = (torch.nn.functional.pad(t, (0, Dp - D)) for t in (q, k, v))
        out, _, _ = _attention_fwd(q, k, v, bias, mask, scale, bool(compensate))
        if Dp != D:
            out = out[..., :D]
    return out.view(*lead, *out.shape[1:]) if len(lead) != 1 else out
