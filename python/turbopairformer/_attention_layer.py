"""The triangle attention layer (OpenFold3's TriangleAttention) as one node: LayerNorm, the
stacked q, k, v, gate and bias projection, the attention, the sigmoid gate and the output
projection, forward and backward.

    triangle_attention_layer(x, norm, projections, out, heads, mask, starting, ...)

In eager mode the node is an autograd.Function; under torch.compile (layers.compiled_nodes) the
same forward and backward run as the custom ops turbopairformer::triangle_attention_layer and
..._bwd. The attention reads q, k, v from the stacked projection through strides and writes its
output in the layer's row order; the backward's gate and attention write dg, dq, dk and dv
straight into the stacked projection's gradient.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from . import _calls, _gate, _gated_linear, _norm, attention
from .layers import (
    _bias_cols,
    _branch_grad,
    _compute_dtype,
    _norm_backward,
    _norm_forward,
    _rows,
    _stacked,
    _weight_grads,
    residual_add,
)

# The attention layers' stacked projection width is padded to a multiple of this. At 4 x 32
# heads that is 544 columns instead of the 8-aligned 520: rows of 1088 bytes, 64-byte aligned
# for the attention kernels' q, k, v reads, and tiles cuBLAS runs faster, for 4.6% more bytes
# (docs/perf-notes.md, 2026-12-04: the layer's forward + backward 6% faster at N = 768).
STACK_PAD = 32


def _slice_order(starting: bool):
    """The permutations between the layer's [B, I, J, H, c] and the kernel's [B, S, H, N, c]
    (slice s, key n = (i, j) at the starting node, (j, i) at the ending node): (to, back)."""
    return ((0, 1, 3, 2, 4), (0, 1, 3, 2, 4)) if starting else ((0, 2, 3, 1, 4), (0, 3, 1, 2, 4))


def _bias_order(starting: bool):
    """bias[b, 0, h, q, k] = zb[b, q, k, h] (starting) or zb[b, k, q, h] (ending)."""
    return (0, 3, 1, 2) if starting else (0, 3, 2, 1)


def _heads_block(t, block: int, heads, to):
    """Column block `block` (q, k, v, g: 0..3) of the stacked projection t [B, I, J, P] (or of
    its gradient) as the kernel's [B, S, H, N, c] view."""
    H, c = heads
    return t[..., block * H * c : (block + 1) * H * c].unflatten(-1, (H, c)).permute(to)


def _gate_rows(t, heads):
    """The gate's column block of the stacked projection t [B, I, J, P] as [R, H c] rows."""
    H, c = heads
    return _rows(t)[:, 3 * H * c : 4 * H * c]


def _attention_forward(
    x, ln_w, ln_b, eps, w, b, wo, bo, mask, heads, starting, compensate, residual, scale, cd
):
    """The attention layer's forward in the compute dtype cd (autocast off, x contiguous):
    (out, kept, on_kernel), kept = (mean, rstd, xn, y, bias, o, res, lse), what the backward
    reads beside the inputs (res None without compensate). Every tensor it returns is its own."""
    H, c = heads
    B, I, J, _ = x.shape
    to, _ = _slice_order(starting)
    xn, (mean, rstd), on_kernel = _norm_forward(x, ln_w, ln_b, eps, cd)  # [B, I, J, C]
    wc = w.to(cd)  # [P, C]: q, k, v, g (H c each), the bias (H), zero padding
    y = F.linear(xn, wc, None if b is None else b.to(cd))  # [B, I, J, P]
    q, k, v = (_heads_block(y, t, heads, to) for t in range(3))  # [B, S, H, N, c] views
    zb = y[..., 4 * H * c : 4 * H * c + H]  # [B, I, J, H]
    # [B, 1, H, N, N]; a copy even where the permuted view is contiguous (B = 1, N = 1)
    bias = (
        zb.permute(_bias_order(starting)).unsqueeze(1).clone(memory_format=torch.contiguous_format)
    )
    o = y.new_empty(B, I, J, H, c)  # the attention output, in the layer's row order
    res = torch.empty_like(o) if compensate else None
    lse = torch.empty(B, I if starting else J, H, J if starting else I, device=x.device)
    res_s = None if res is None else res.permute(to)
    attention.forward_into(
        q, k, v, bias, mask, 1.0 / math.sqrt(c), compensate, o.permute(to), res_s, lse
    )
    wo_c = wo.to(cd)  # [C, H c]
    bo_c = None if bo is None else bo.to(cd)
    g_rows, o_rows = _gate_rows(y, heads), o.view(-1, H * c)  # [R, H c]
    x_res = x if residual else None
    shape = (B, I, J, wo.shape[0])
    if _gated_linear.supported(g_rows, o_rows, wo_c, x_res, scale, shape):
        # the gate, the output projection and the residual add in one pass
        out = _gated_linear.forward(g_rows, o_rows, wo_c, bo_c, x_res, scale, shape)
    else:
        og = _gate.forward(g_rows, o_rows)  # [R, H c]
        out = F.linear(og, wo_c, bo_c).view(shape)
        if residual:
            out = residual_add(x, out, scale)
    return out, (mean, rstd, xn, y, bias, o, res, lse), on_kernel


def _attention_backward(
    ctx, dout, x, ln_w, ln_b, w, wo, mask, scale, kept, bias_cols, has_out_bias
):
    """The attention layer's gradients (dx, d ln_w, d ln_b, dw, db, dwo, dbo) from the
    gradient of its output (bias_cols: the stacked bias's columns, as _weight_grads takes them);
    ctx: on_kernel, eps, needs_input_grad (of ln_w, ln_b as inputs 1
    and 2), heads, starting, compensate, residual; x, kept: as _attention_forward had them."""
    mean, rstd, xn, y, bias, o, res, lse = kept
    heads = ctx.heads
    H, c = heads
    Hc = H * c
    to, _ = _slice_order(ctx.starting)
    wc, wo_c = w.to(y.dtype), wo.to(y.dtype)  # the forward's operands again (y: the compute dtype)
    dz = dout if ctx.residual else None
    dout = _branch_grad(dout, scale if ctx.residual else None, y.dtype)
    dog = _rows(dout) @ wo_c  # [R, H c]
    dy = torch.empty_like(y)  # the stacked projection's gradient, every block written in place
    g_rows = _gate_rows(y, heads)  # [R, H c]
    delta = delta_ijh = None  # the attention's Dlt [B, S, H, N], from the gate's kernel
    if y.is_cuda and _gate.delta_on_kernel(g_rows, H):
        B, I, J = y.shape[:3]
        S, N = (I, J) if ctx.starting else (J, I)
        delta = torch.empty(B, S, H, N, dtype=torch.float32, device=y.device)
        delta_ijh = delta.permute((0, 1, 3, 2) if ctx.starting else (0, 3, 1, 2))  # [B, I, J, H]
    _, d_o, og = _gate.backward(
        g_rows, o.view(-1, Hc), dog, _gate_rows(dy, heads),
        res=None if res is None or delta is None else res.view(-1, Hc), delta=delta_ijh,
    )  # fmt: skip  # dg lands in dy's gate block; d_o, og: [R, H c]
    dwo, dbo = _weight_grads(dout, og, wo.dtype, has_out_bias)
    dq, dk, dv = (_heads_block(dy, t, heads, to) for t in range(3))
    q, k, v = (_heads_block(y, t, heads, to) for t in range(3))
    dbias = torch.empty_like(bias)  # [B, 1, H, N, N]
    res_s = None if res is None else res.permute(to)
    attention.backward_into(
        d_o.view(o.shape).permute(to),
        q,
        k,
        v,
        bias,
        mask,
        o.permute(to),
        res_s,
        lse,
        1.0 / math.sqrt(c),
        ctx.compensate,
        dq,
        dk,
        dv,
        dbias,
        delta,
    )
    order = _bias_order(ctx.starting)
    inverse = sorted(range(4), key=order.__getitem__)
    dy[..., 4 * Hc : 4 * Hc + H].copy_(dbias[:, 0].permute(inverse))
    dy[..., 4 * Hc + H :].zero_()
    dxn = dy @ wc  # [B, I, J, C]
    dw, db = _weight_grads(dy, xn, w.dtype, bias_cols)
    dx, dln_w, dln_b = _norm_backward(ctx, dxn, x, ln_w, ln_b, (mean, rstd), dz)
    return dx, dln_w, dln_b, dw, db, dwo, dbo


class _TriangleAttentionLayer(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x, ln_w, ln_b, eps, w, b, bias_cols, wo, bo, mask, heads, starting, compensate,
        residual, scale,
    ):  # fmt: skip
        cd = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x = x.contiguous()
            out, kept, ctx.on_kernel = _attention_forward(
                x, ln_w, ln_b, eps, w, b, wo, bo, mask, heads, starting, compensate, residual,
                scale, cd
            )  # fmt: skip
        ctx.save_for_backward(x, ln_w, ln_b, w, wo, mask, scale, *kept)
        ctx.eps, ctx.heads, ctx.starting, ctx.compensate = eps, heads, starting, compensate
        ctx.residual, ctx.bias_cols, ctx.has_out_bias = residual, bias_cols, bo is not None
        return out

    @staticmethod
    def backward(ctx, dout):
        x, ln_w, ln_b, w, wo, mask, scale, *kept = ctx.saved_tensors
        dx, dln_w, dln_b, dw, db, dwo, dbo = _attention_backward(
            ctx, dout, x, ln_w, ln_b, w, wo, mask, scale, kept, ctx.bias_cols, ctx.has_out_bias
        )
        return dx, dln_w, dln_b, None, dw, db, None, dwo, dbo, None, None, None, None, None, None


# The same node as torch.library custom ops, for torch.compile (see compiled_nodes): dynamo
# cannot trace the node's calls into the library, and as custom ops they stay inside the graph
# (no graph break; inside an activation checkpoint the forward op is recomputed). The forward
# op returns the output and what the backward reads; the compute dtype is an argument, fixed
# when the graph is traced.
_LAYER_SCHEMA = (
    "(Tensor x, Tensor? ln_w, Tensor? ln_b, Tensor w, Tensor? b, int[] bias_cols, Tensor wo, "
    "Tensor? bo, "
    "Tensor? mask, Tensor? scale, float eps, int heads, int head_dim, bool starting, "
    "bool compensate, bool residual, ScalarType compute_dtype) -> "
    "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_LAYER_BWD_SCHEMA = (
    "(Tensor dout, Tensor x, Tensor? ln_w, Tensor? ln_b, Tensor w, Tensor wo, Tensor? mask, "
    "Tensor? scale, Tensor mean, Tensor rstd, Tensor xn, Tensor y, Tensor bias, Tensor o, "
    "Tensor res, Tensor lse, float eps, int heads, int head_dim, bool starting, "
    "bool compensate, bool residual, int[] bias_cols, bool has_out_bias, bool need_ln_w, "
    "bool need_ln_b) -> Tensor[]"
)


class _OpCtx:
    """What _attention_backward reads from an autograd ctx, for the backward op."""

    def __init__(
        self, x, ln_w, xn, eps, H, c, starting, compensate, residual, need_ln_w, need_ln_b
    ):
        self.on_kernel = _norm.gpu_supported(x, ln_w, xn.dtype)  # as _norm_forward chose
        self.eps, self.heads, self.starting = eps, (H, c), starting
        self.compensate, self.residual = compensate, residual
        self.needs_input_grad = (True, need_ln_w, need_ln_b)


def _layer_op(
    x, ln_w, ln_b, w, b, _bias_cols, wo, bo, mask, scale, eps, H, c, starting, compensate,
    residual, cd,
):  # fmt: skip
    with torch.autocast(x.device.type, enabled=False):
        out, kept, _ = _attention_forward(
            x.contiguous(), ln_w, ln_b, eps, w, b, wo, bo, mask, (H, c), starting, compensate,
            residual, scale, cd
        )  # fmt: skip
    mean, rstd, xn, y, bias, o, res, lse = kept
    return out, mean, rstd, xn, y, bias, o, (x.new_empty(0) if res is None else res), lse


def _layer_op_fake(
    x, ln_w, ln_b, w, b, _bias_cols, wo, bo, mask, scale, eps, H, c, starting, compensate,
    residual, cd,
):  # fmt: skip
    B, I, J, C = x.shape
    if _norm.gpu_supported(x, ln_w, cd):
        mean = x.new_empty(x.numel() // C, dtype=torch.float32)
    else:
        _, mean, _ = torch.native_layer_norm(x, [C], ln_w, ln_b, eps)
    S, N = (I, J) if starting else (J, I)
    o = x.new_empty(B, I, J, H, c, dtype=cd)
    return (
        x.new_empty(B, I, J, wo.shape[0], dtype=x.dtype if residual else cd),
        torch.empty_like(mean),
        torch.empty_like(mean),
        x.new_empty(x.shape, dtype=cd),
        x.new_empty(B, I, J, w.shape[0], dtype=cd),
        x.new_empty(B, 1, H, N, N, dtype=cd),
        o,
        torch.empty_like(o) if compensate else x.new_empty(0),
        x.new_empty(B, S, H, N, dtype=torch.float32),
    )


def _ranges(flat):
    """A flat [start0, end0, start1, end1, ...] list as _weight_grads's ranges (False: empty)."""
    return tuple(zip(flat[::2], flat[1::2])) or False


def _bwd_args(rest):
    """(kept, eps, H, c, starting, compensate, residual, bias_cols, has_out_bias, need_ln_w,
    need_ln_b) from a backward op's arguments after dout, x, ln_w, ln_b, w, wo, mask, scale."""
    return (tuple(rest[:8]), *rest[8:])


def _layer_bwd_op(dout, x, ln_w, ln_b, w, wo, mask, scale, *rest):
    kept, eps, H, c, starting, compensate, residual, cols, has_out_bias, nw, nb = _bwd_args(rest)
    ctx = _OpCtx(x, ln_w, kept[2], eps, H, c, starting, compensate, residual, nw, nb)
    kept = kept[:6] + (kept[6] if compensate else None, kept[7])  # res: empty without compensate
    with torch.autocast(x.device.type, enabled=False):
        dx, dln_w, dln_b, dw, db, dwo, dbo = _attention_backward(
            ctx, dout, x.contiguous(), ln_w, ln_b, w, wo, mask, scale, kept, _ranges(cols),
            has_out_bias,
        )  # fmt: skip
    wanted = (dx, dln_w if nw else None, dln_b if nb else None, dw, db, dwo, dbo)
    return [g if g is not None else x.new_empty(0) for g in wanted]  # as _layer_bwd_op_fake


def _layer_bwd_op_fake(dout, x, ln_w, ln_b, w, wo, mask, scale, *rest):
    *_, bias_cols, has_out_bias, need_ln_w, need_ln_b = _bwd_args(rest)

    def like(t, want=True):
        return torch.empty_like(t) if want and t is not None else x.new_empty(0)

    return [
        torch.empty_like(x, memory_format=torch.contiguous_format),
        like(ln_w, need_ln_w),
        like(ln_b, need_ln_b),
        like(w),
        x.new_empty(w.shape[0], dtype=w.dtype) if bias_cols else x.new_empty(0),
        like(wo),
        x.new_empty(wo.shape[0], dtype=wo.dtype) if has_out_bias else x.new_empty(0),
    ]


_layer_fwd_op, _layer_bwd = _calls.node_ops(
    ("triangle_attention_layer", _layer_op, _layer_op_fake, _LAYER_SCHEMA),
    ("triangle_attention_layer_bwd", _layer_bwd_op, _layer_bwd_op_fake, _LAYER_BWD_SCHEMA),
)


def _layer_setup(ctx, inputs, output):
    x, ln_w, ln_b, w, b, bias_cols, wo, bo, mask, scale, eps, H, c, starting, compensate = inputs[
        :15
    ]
    residual = inputs[15]
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, ln_w, ln_b, w, wo, mask, scale, *output[1:])
    ctx.args = (eps, H, c, starting, compensate, residual, bias_cols, bo is not None)


def _layer_autograd(ctx, dout, *_kept):
    need = ctx.needs_input_grad
    if dout is None:  # (grads are not materialized) out took no part in what is differentiated
        return (None,) * len(need)
    x, ln_w, ln_b, w, wo, mask, scale, *kept = ctx.saved_tensors
    need_ln_w, need_ln_b = need[1] and ln_w is not None, need[2] and ln_b is not None
    dx, dln_w, dln_b, dw, db, dwo, dbo = _layer_bwd(
        dout, x, ln_w, ln_b, w, wo, mask, scale, *kept, *ctx.args, need_ln_w, need_ln_b
    )
    bias_cols, has_out_bias = ctx.args[-2:]
    return (
        dx,
        dln_w if need_ln_w else None,
        dln_b if need_ln_b else None,
        dw,
        db if bias_cols else None,
        None,
        dwo,
        dbo if has_out_bias else None,
    ) + (None,) * 9


_layer_fwd_op.register_autograd(_layer_autograd, setup_context=_layer_setup)


def triangle_attention_layer(
    x: torch.Tensor,
    norm: nn.LayerNorm,
    projections,
    out: nn.Linear,
    heads,
    mask,
    starting: bool,
    compensate: bool = True,
    residual: bool = False,
    scale=None,
) -> torch.Tensor:
    """OpenFold3's TriangleAttention around one node as one autograd node: x [B, I, J, C] ->
    out(sigmoid(g) * attention(q, k, v, bias)) [B, I, J, C]. projections: the q, k, v, gate and
    bias nn.Linear layers (stacked into one GEMM); heads: (H, c) with c a head dim the kernels
    run natively; mask: [B, S, 1, 1, N] bool in the kernel's slice order, or None.

    The attention reads q, k, v from the stacked projection through strides and writes its
    output in the layer's row order; in the backward the gate and the attention write dg, dq,
    dk and dv straight into the stacked projection's gradient, so no gradient is copied but the
    bias's (H values a pair). The saved set is x, norm(x), the projection, the attention output
    (with its rounding residual) and the contiguous bias. residual=True returns
    residual_add(x, that, scale), and the backward adds x's pass-through gradient in the
    LayerNorm backward's pass. Under torch.compile the node runs as its custom ops."""
    w, b = _stacked(projections, STACK_PAD)
    bias_cols = _bias_cols(projections)
    if torch.compiler.is_compiling():
        H, c = heads
        flat = [i for r in bias_cols for i in r] if bias_cols else []
        return _layer_fwd_op(
            x, norm.weight, norm.bias, w, b, flat, out.weight, out.bias, mask, scale, norm.eps,
            H, c, starting, compensate, residual, _compute_dtype(x),
        )[0]  # fmt: skip
    return _TriangleAttentionLayer.apply(
        x,
        norm.weight,
        norm.bias,
        norm.eps,
        w,
        b,
        bias_cols,
        out.weight,
        out.bias,
        mask,
        tuple(heads),
        starting,
        compensate,
        residual,
        scale,
    )
