"""The projections around the triangle kernels, each one autograd node with a hand-written
backward, so that a layer's forward + backward makes one pass per GEMM operand instead of
PyTorch's per-op temporaries:

    norm_linear(x, norm, layers, pad_to)  LayerNorm, then several nn.Linear on its output as one
                                          GEMM; returns each layer's output as a view of one
                                          tensor, and takes their gradients back as one
    layer_norm(x, norm)                   norm(x) in the compute dtype (autocast's, else x's)
    swiglu_transition(x, norm, a, b, out) out(silu(a(norm(x))) * b(norm(x))): at c = 128 on
                                          sm_90 the fused kernels (_transition.py), the
                                          activation on chip and a saved set of norm(x);
                                          elsewhere one stacked up GEMM, the activation in one
                                          pass each way, a saved set of norm(x) and the up
                                          projection
    gated_linear(g, o, layer)             layer(sigmoid(g) * o)
    residual_add(z, out, scale)           z + scale * out in one pass (the library's kernel)

(The whole TriangleAttention layer as one node is _attention_layer.py, on these parts.)
swiglu_transition takes residual=True to return residual_add(x, update, scale) from the same
node, whose backward adds x's pass-through gradient inside the LayerNorm backward's pass (the
modules' residual_update).

On CUDA the LayerNorm runs on the library's kernel (_norm.py) where it is built for the width
and dtypes: it writes its output straight in the GEMM's dtype and takes the gradient in it, so
neither direction has a cast pass, and its weight gradients are bitwise repeatable.

These are for eager mode. Under torch.compile the pair modules' nodes (the transition, the
attention layer, the multiplicative update's residual update) run as their custom ops (the same
kernels, no graph break) for pair tensors of at least COMPILED_NODE_MIN_PAIRS pairs, and as the
plain ops below it, which inductor fuses into its own kernels (compiled_nodes: each node's host
work loses where the GPU time is short).

Each runs in the autocast dtype when autocast is on (the LayerNorm in x's dtype, as PyTorch's
autocast runs it), rounds where PyTorch's autocast rounds (except that the gate and SwiGLU
kernels round once, after the product, where autocast also rounds the activation), and returns
fp32 weight gradients for fp32 weights. cuBLAS GEMMs and both LayerNorm backwards are run-to-run deterministic, so the gradients are
bitwise repeatable.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from . import _norm, _residual, _swiglu, _transition


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return x.dtype


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


# Under torch.compile the pair modules' nodes run as their custom ops (the same kernels and
# saved sets as in eager mode) from this many pairs (the whole batch's) up, and below it as the
# composed ops, which inductor fuses. Each node's host work (the Python between its kernels: ~1 ms
# for the attention layer's backward) is what decides: with the nodes the compiled block measured
# slower at N = 384 and 512 and faster at 768 (docs/perf-notes.md, fourteenth and fifteenth
# sessions); 640^2 lies between the measured sizes.
COMPILED_NODE_MIN_PAIRS = 640 * 640

# Set by PairformerStack while dynamo traces its checkpointed blocks: there the composed ops run.
# With the nodes inside its compiled checkpoints every block's saved sets live at once (a 4-block
# stack at N = 768 peaked at 27.5 GiB on the H200 against 11.0 with the composed ops): a block
# ends in a getitem of the transition op's tuple, which the min-cut partitioner recomputes
# rather than saves, so each block's recompute chains back to the stack's input and the backward
# recomputes every block first (docs/perf-notes.md, eighteenth session;
# dev/scripts/cpu_checkpoint_order.py shows it on the CPU). A copying op at each checkpoint's end
# fixes the order there; until its cost is measured on a GPU the composed ops stay.
_IN_COMPILED_CHECKPOINT = False


def compiled_nodes(x: torch.Tensor) -> bool:
    """Whether a pair module on x [*, I, J, C] runs its fused node under torch.compile: by the
    pairs of the whole batch, since the GPU time grows with them and the host work does not;
    never inside PairformerStack's checkpoints."""
    if _IN_COMPILED_CHECKPOINT:
        return False
    return x.dim() >= 3 and x.numel() // x.shape[-1] >= COMPILED_NODE_MIN_PAIRS


def _weight_grads(dy: torch.Tensor, a: torch.Tensor, dtype: torch.dtype, bias):
    """dW = dyᵀ a in the weight's dtype, and db = colsum(dy) in at least fp32, then that dtype.
    dy: [*, O], a: [*, K]. bias: False (db None), True (every column), or the (start, end)
    column ranges of the stacked layers that have one (_bias_cols): only those are summed, the
    rest of db is zero (a stack's bias-free layers hold most of its columns)."""
    dw = (_rows(dy).t() @ _rows(a)).to(dtype)  # [O, K]
    if bias is False:
        return dw, None
    acc = torch.promote_types(dy.dtype, torch.float32)
    rows = _rows(dy)  # [R, O]
    if bias is True:
        return dw, rows.sum(0, dtype=acc).to(dtype)
    db = rows.new_zeros(rows.shape[1], dtype=acc)  # [O]
    for start, end in bias:
        db[start:end] = rows[:, start:end].sum(0, dtype=acc)
    return dw, db.to(dtype)


def _joined(grads, widths, shape, like: torch.Tensor) -> torch.Tensor:
    """The gradients of consecutive column blocks as one tensor of `shape` ([*, P], P >= the sum
    of widths; like's dtype and device): one copy each, zeros for None and for the padding."""
    dy = torch.empty(shape, dtype=like.dtype, device=like.device)
    offset = 0
    for g, w in zip(grads, widths):
        part = dy[..., offset : offset + w]
        if g is not None and g.dim() > part.dim():  # a split output: [*, h, c] for width h c
            part = part.unflatten(-1, g.shape[part.dim() - 1 :])
        if g is None:
            part.zero_()
        else:
            part.copy_(g)
        offset += w
    if offset < shape[-1]:
        dy[..., offset:].zero_()
    return dy


def _norm_forward(x, ln_w, ln_b, eps, cd):
    """(LayerNorm(x) in cd, stats, on_kernel) for the nodes; x contiguous, autocast off."""
    if _norm.gpu_supported(x, ln_w, cd):
        y, mean, rstd = _norm.forward(x, ln_w, ln_b, eps, cd)
        return y, (mean, rstd), True
    xn, mean, rstd = torch.native_layer_norm(x, [x.shape[-1]], ln_w, ln_b, eps)
    return xn.to(cd), (mean, rstd), False


def _norm_backward(ctx, dxn, x, ln_w, ln_b, stats, dx_in=None):
    """(dx, d ln_w, d ln_b) from the gradient of _norm_forward's output, plus dx_in (a
    residual's gradient, added in the kernel's pass) where given; ln_w, ln_b are the node's
    inputs 1 and 2 (their gradients computed only where autograd asks). ctx: the node's
    on_kernel, eps and needs_input_grad."""
    need = ctx.needs_input_grad
    if ctx.on_kernel:
        if dx_in is not None:
            dx_in = dx_in.to(x.dtype).contiguous()
        return _norm.backward(
            dxn.contiguous(), x, ln_w, ln_b, ctx.eps, *stats, need[1], need[2], dx_in
        )
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        dxn.to(x.dtype),
        x,
        [x.shape[-1]],
        *stats,
        ln_w,
        ln_b,
        [True, ln_w is not None, ln_b is not None],
    )
    return (dx if dx_in is None else dx + dx_in), dw, db


def residual_add(z: torch.Tensor, out: torch.Tensor, scale=None) -> torch.Tensor:
    """z + scale * out (scale None: 1; else broadcastable to out, e.g. a shared dropout mask or
    a row mask) as one kernel in z's precision, so that the scaled update is never written: the
    library's (_residual.py) on CUDA, addcmul under torch.compile and elsewhere."""
    if torch.compiler.is_compiling():
        return z + out if scale is None else torch.addcmul(z, out, scale)
    return _residual.forward(z, out, scale)


def _branch_grad(dz: torch.Tensor, scale, dtype: torch.dtype) -> torch.Tensor:
    """The gradient of a residual branch from the residual's: dz * scale in dtype, one pass."""
    return _residual.backward(dz, scale, dtype)


class _NormLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ln_w, ln_b, eps, w, b, widths, splits, bias_cols):
        cd = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x = x.contiguous()  # the backward's LayerNorm reads x in the stats' row order
            a, stats, ctx.on_kernel = _norm_forward(x, ln_w, ln_b, eps, cd)  # [*, C]
            wc = w.to(cd)  # [P, C], the backward's operand too (no second cast)
            y = F.linear(a, wc, None if b is None else b.to(cd))  # [*, P]
        ctx.save_for_backward(x, *stats, ln_w, ln_b, a, wc)
        ctx.widths, ctx.bias_cols, ctx.y_shape, ctx.w_dtype = widths, bias_cols, y.shape, w.dtype
        ctx.eps = eps
        return _column_blocks(y, widths, splits)

    @staticmethod
    def backward(ctx, *grads):
        x, mean, rstd, ln_w, ln_b, a, wc = ctx.saved_tensors
        dy = _joined(grads, ctx.widths, ctx.y_shape, a)  # [*, P]
        da = dy @ wc  # [*, C]
        dw, db = _weight_grads(dy, a, ctx.w_dtype, ctx.bias_cols)
        dx, dln_w, dln_b = _norm_backward(ctx, da, x, ln_w, ln_b, (mean, rstd))
        return dx, dln_w, dln_b, None, dw, db, None, None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ln_w, ln_b, eps):
        cd = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x = x.contiguous()
            y, stats, ctx.on_kernel = _norm_forward(x, ln_w, ln_b, eps, cd)
        ctx.save_for_backward(x, *stats, ln_w, ln_b)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy):
        x, mean, rstd, ln_w, ln_b = ctx.saved_tensors
        dx, dln_w, dln_b = _norm_backward(ctx, dy, x, ln_w, ln_b, (mean, rstd))
        return dx, dln_w, dln_b, None


class _SwiGLUTransition(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ln_w, ln_b, eps, wa, wb, wo, residual, scale):
        cd = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            x = x.contiguous()
            xn, stats, ctx.on_kernel = _norm_forward(x, ln_w, ln_b, eps, cd)  # [*, C]
            wab = torch.cat([wa, wb]).to(cd)  # [2H, C]
            wo_c = wo.to(cd)  # [C, H]
            ab = F.linear(xn, wab)  # [*, 2H]
            out = F.linear(_swiglu.forward(ab), wo_c)  # [*, C]; the activation is not kept
            if residual:
                out = residual_add(x, out, scale)
        ctx.save_for_backward(x, *stats, ln_w, ln_b, xn, ab, wab, wo_c, scale)
        ctx.eps, ctx.w_dtype, ctx.residual = eps, wa.dtype, residual
        return out

    @staticmethod
    def backward(ctx, dout):
        x, mean, rstd, ln_w, ln_b, xn, ab, wab, wo_c, scale = ctx.saved_tensors
        dz = dout if ctx.residual else None
        dout = _branch_grad(dout, scale if ctx.residual else None, ab.dtype)
        dab, h = _swiglu.backward(ab, dout @ wo_c)  # [*, 2H]; h = the forward's activation
        dwo, _ = _weight_grads(dout, h, ctx.w_dtype, False)
        dwab, _ = _weight_grads(dab, xn, ctx.w_dtype, False)
        dx, dln_w, dln_b = _norm_backward(ctx, dab @ wab, x, ln_w, ln_b, (mean, rstd), dz)
        H = wab.shape[0] // 2
        return dx, dln_w, dln_b, None, dwab[:H], dwab[H:], dwo, None, None


def swiglu_transition(
    x: torch.Tensor,
    norm: nn.LayerNorm,
    a: nn.Linear,
    b: nn.Linear,
    out: nn.Linear,
    residual: bool = False,
    scale=None,
) -> torch.Tensor:
    """out(silu(a(norm(x))) * b(norm(x))) for bias-free a, b and out (OpenFold3's
    SwiGLUTransition); with residual=True, residual_add(x, that, scale) from the same node, whose
    backward adds x's pass-through gradient in the LayerNorm backward's pass. In eager mode,
    where the fused kernels apply (c = 128, bf16 compute, sm_90), the node is their custom op;
    elsewhere the unfused node. Under torch.compile the custom op where compiled_nodes(x), else
    the plain ops, which inductor fuses."""
    cd = _compute_dtype(x)
    fused = _norm.gpu_supported(x, norm.weight, cd) and _transition.supported(
        x, a.out_features, cd, scale if residual else None
    )
    if torch.compiler.is_compiling() and not (fused and compiled_nodes(x)):
        y = norm(x)
        t = out(F.silu(a(y)) * b(y))
        return residual_add(x, t, scale) if residual else t
    if fused:
        return _transition.node(
            x, norm.weight, norm.bias, a.weight, b.weight, out.weight, scale, norm.eps, residual
        )[0]
    return _SwiGLUTransition.apply(
        x, norm.weight, norm.bias, norm.eps, a.weight, b.weight, out.weight, residual, scale
    )


def layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """norm(x) in the compute dtype: autocast's when it is on (the dtype the GEMMs after it
    cast to), else x's."""
    if torch.compiler.is_compiling():
        y = norm(x)
        return y.to(_compute_dtype(x))
    return _LayerNorm.apply(x, norm.weight, norm.bias, norm.eps)


def _bias_cols(layers):
    """The (start, end) output columns of each stacked layer that has a bias, or False when none
    has one: what _weight_grads sums for the stacked bias's gradient."""
    cols, start = [], 0
    for l in layers:
        if l.bias is not None:
            cols.append((start, start + l.out_features))
        start += l.out_features
    return tuple(cols) or False


def _stacked(layers, pad_to: int):
    """The layers' weights stacked [sum(out) (+ pad), in] and biases (None when none has one;
    zeros for those without), the output width zero-padded to a multiple of pad_to."""
    w = torch.cat([l.weight for l in layers])
    b = None
    if any(l.bias is not None for l in layers):
        b = torch.cat(
            [l.bias if l.bias is not None else w.new_zeros(l.out_features) for l in layers]
        )
    extra = -w.shape[0] % pad_to
    if extra:
        w = torch.cat([w, w.new_zeros(extra, w.shape[1])])
        b = None if b is None else torch.cat([b, b.new_zeros(extra)])
    return w, b


def _column_blocks(y, widths, splits):
    """Consecutive column blocks of y as views, each [*, width] or, with a split (h, c) for it,
    [*, h, c]."""
    outs, offset = [], 0
    for width, split in zip(widths, splits):
        block = y[..., offset : offset + width]
        outs.append(block if split is None else block.unflatten(-1, split))
        offset += width
    return tuple(outs)


def norm_linear(
    x: torch.Tensor, norm: nn.LayerNorm, layers, pad_to: int = 1, splits=None
) -> tuple[torch.Tensor, ...]:
    """layer(norm(x)) for each layer, as views of one [*, sum of widths (+ pad)] result whose
    rows start 16-byte aligned when pad_to makes them so. splits: per layer None or (h, c), to
    get that output as [*, h, c] (a gradient that arrives strided in that shape is then copied
    once, where a split of the output outside would first materialise it)."""
    w, b = _stacked(layers, pad_to)
    widths = tuple(l.out_features for l in layers)
    splits = tuple(splits) if splits is not None else (None,) * len(layers)
    if torch.compiler.is_compiling():  # inductor fuses the plain ops and chooses what to save
        return _column_blocks(F.linear(norm(x), w, b), widths, splits)
    return _NormLinear.apply(
        x, norm.weight, norm.bias, norm.eps, w, b, widths, splits, _bias_cols(layers)
    )


class _GatedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, o, w, b):
        cd = _compute_dtype(g)
        with torch.autocast(g.device.type, enabled=False):
            g, o = g.to(cd), o.to(cd)
            gs = torch.sigmoid(g)  # [*, H, c]
            og = (gs * o).contiguous().flatten(-2)  # [*, H c]
            wc = w.to(cd)  # [C, H c]
            out = F.linear(og, wc, None if b is None else b.to(cd))  # [*, C]
        ctx.save_for_backward(gs, o, og, wc)
        ctx.has_bias, ctx.w_dtype = b is not None, w.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        gs, o, og, wc = ctx.saved_tensors
        dout = dout.to(og.dtype)
        dog = (dout @ wc).view(gs.shape)  # [*, H, c]
        dw, db = _weight_grads(dout, og, ctx.w_dtype, ctx.has_bias)
        dg = torch.ops.aten.sigmoid_backward(dog * o, gs)
        return dg, dog * gs, dw, db


def gated_linear(g: torch.Tensor, o: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """layer(sigmoid(g) * o) over the last two dims flattened; g, o: [*, H, c], any strides."""
    if torch.compiler.is_compiling():
        return layer((torch.sigmoid(g) * o).flatten(-2))
    return _GatedLinear.apply(g, o, layer.weight, layer.bias)
