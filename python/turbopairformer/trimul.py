"""The triangle multiplicative update (AF3 Algorithms 12 and 13) as torch.library custom ops,
argument-compatible with cuequivariance_torch.triangle_multiplicative_update.

CPU tensors run the FP64 reference (exact, slow); CUDA tensors (bf16 x, bf16 or fp32 weights)
the fused kernels, with their workspace from PyTorch's caching allocator.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from . import _calls, _native, _residual
from .layers import _branch_grad, compiled_nodes, residual_add

_DIRECTIONS = {"outgoing": 0, "incoming": 1}
WEIGHTS = _native.TRIMUL_WEIGHTS  # the library's order: norm_in_weight, norm_in_bias, ...

# The twelve weights are separate optional arguments (not a list), so that the schema says
# exactly which gradient belongs to which input; the schemas are written from the one list.
_W = ", ".join(f"Tensor? {w}" for w in WEIGHTS)
# residual, scale: the residual update around the op, out = residual + scale * update
# (turbopairformer/trimul.h); the backward takes the update's gradient, as without them.
_FWD_SCHEMA = (
    f"(Tensor x, Tensor? mask, {_W}, int direction, float eps, bool save, "
    "Tensor? residual=None, Tensor? scale=None) -> (Tensor, Tensor)"
)
_BWD_SCHEMA = (
    f"(Tensor dout, Tensor saved, Tensor x, Tensor? mask, {_W}, int direction, "
    "float eps, Tensor? dz_in) -> Tensor[]"
)


def _args(x, mask, weights, direction, eps, dw=None, **outputs) -> _native.TpfTrimulArgs:
    a = _native.TpfTrimulArgs()
    a.z = _calls.tensor(x, "z")  # the pair tensor: named z in the core's messages
    a.mask = _calls.tensor(mask, "mask")
    for name, t in outputs.items():
        setattr(a, name, _calls.tensor(t, name))
    for i, (name, w) in enumerate(zip(WEIGHTS, weights)):
        a.w[i] = _calls.tensor(w, name)
        if dw is not None:
            a.dw[i] = _calls.tensor(dw[i], "d_" + name)
    a.direction = direction
    a.eps = eps
    return a


def _saved_buffer(x, p_in_weight, save: bool) -> torch.Tensor:
    """The buffer of the set a CUDA training forward keeps for the backward (empty where nothing
    is saved: CPU, inference, shapes the core will refuse)."""
    n = 0
    if save and x.is_cuda and p_in_weight is not None and x.dim() == 4:
        B, N, _, C = x.shape
        n = int(_native.LIB.tpf_trimul_saved_size(B, N, C, p_in_weight.shape[0] // 2))
    return torch.empty(n, dtype=torch.uint8, device=x.device)


def _call(fn, a, x, saved: torch.Tensor, backward: bool) -> None:
    if saved.numel():
        a.saved, a.saved_bytes = saved.data_ptr(), saved.numel()
    _calls.call_with_workspace(fn, _native.LIB.tpf_trimul_workspace_size, a, x, int(backward))


def _residual_args(x, residual, scale) -> dict:
    """The residual update's tensors for _args: the scale expanded to x's shape (a broadcast
    view), both absent where residual is None."""
    out = {} if residual is None else {"residual": residual}
    if scale is not None:
        out["scale"] = scale.expand(x.shape)
    return out


def _fwd_args(rest):
    """(weights, direction, eps, save, residual, scale) from a trimul_fwd call's arguments after
    x and mask (residual and scale default to None)."""
    n = len(WEIGHTS)
    residual, scale = (tuple(rest[n + 3 :]) + (None, None))[:2]
    return list(rest[:n]), *rest[n : n + 3], residual, scale


def _fwd(x, mask, *rest):
    weights, direction, eps, save, residual, scale = _fwd_args(rest)
    out = torch.empty_like(
        x if residual is None else residual, memory_format=torch.contiguous_format
    )
    saved = _saved_buffer(x, weights[2], save)
    extra = _residual_args(x, residual, scale)
    _call(
        _native.LIB.tpf_trimul_forward,
        _args(x, mask, weights, direction, eps, out=out, **extra),
        x,
        saved,
        False,
    )
    return out, saved


def _fwd_fake(x, mask, *rest):
    weights, _direction, _eps, save, residual, _scale = _fwd_args(rest)
    like = x if residual is None else residual
    return torch.empty_like(like, memory_format=torch.contiguous_format), _saved_buffer(
        x, weights[2], save
    )


def _bwd(dout, saved, x, mask, *rest):
    """saved: the forward's saved set, or empty (the backward then recomputes the forward).
    dz_in (optional, x's shape, x's dtype or fp32): added to dz, which then takes its dtype."""
    *weights, direction, eps, dz_in = rest
    dout = dout.contiguous()
    dz = torch.empty_like(x if dz_in is None else dz_in, memory_format=torch.contiguous_format)
    dw = [torch.empty_like(w) if w is not None else None for w in weights]
    grads = dict(dout=dout, dz=dz) if dz_in is None else dict(dout=dout, dz=dz, dz_in=dz_in)
    a = _args(x, mask, weights, direction, eps, dw=dw, **grads)
    _call(_native.LIB.tpf_trimul_backward, a, x, saved, True)
    # absent weights get an empty placeholder (a custom op returns tensors only)
    return [dz] + [g if g is not None else x.new_empty(0) for g in dw]


def _bwd_fake(dout, saved, x, mask, *rest):
    weights, dz_in = rest[:-3], rest[-1]
    like = x if dz_in is None else dz_in
    return [torch.empty_like(like, memory_format=torch.contiguous_format)] + [
        torch.empty_like(w) if w is not None else x.new_empty(0) for w in weights
    ]


_trimul_fwd, _trimul_bwd = _calls.node_ops(
    ("trimul_fwd", _fwd, _fwd_fake, _FWD_SCHEMA), ("trimul_bwd", _bwd, _bwd_fake, _BWD_SCHEMA)
)


def _setup_context(ctx, inputs, output):
    x, mask = inputs[:2]
    weights, direction, eps, _save, residual, scale = _fwd_args(inputs[2:])
    # The saved set is the backward's input, not a result: without set_materialize_grads(False)
    # autograd would fill a zero gradient of its size (1.3 GB at N = 768) on every backward.
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(output[1], x, mask, scale, *weights)
    ctx.direction, ctx.eps = direction, eps
    ctx.residual = residual is not None


def _backward(ctx, dout, _dsaved):
    if dout is None:  # (grads are not materialized) out took no part in what is differentiated
        return (None,) * len(ctx.needs_input_grad)
    saved, x, mask, scale, *weights = ctx.saved_tensors
    dres = dout if ctx.residual else None  # out = residual + scale * update (scale: no gradient)
    if ctx.residual:
        dout = _branch_grad(dout, scale, x.dtype)  # the update's gradient
    dz, *dw = _trimul_bwd(dout, saved, x, mask, *weights, ctx.direction, ctx.eps, None)
    grads = [g if w is not None else None for g, w in zip(dw, weights)]
    return (dz, None, *grads, None, None, None, dres, None)[: len(ctx.needs_input_grad)]


_trimul_fwd.register_autograd(_backward, setup_context=_setup_context)


def _plain_trimul(x, direction, mask, weights, eps):
    """docs/DESIGN.md section 2 in plain PyTorch, for empty problems (B = 0 or N = 0), where it
    is exact and free: an empty output, zero weight gradients."""
    w = dict(zip(WEIGHTS, weights))
    zn = F.layer_norm(x, x.shape[-1:], w["norm_in_weight"], w["norm_in_bias"], eps)
    ab = torch.sigmoid(F.linear(zn, w["g_in_weight"], w["g_in_bias"])) * F.linear(
        zn, w["p_in_weight"], w["p_in_bias"]
    )
    if mask is not None:
        ab = ab * mask.unsqueeze(-1).to(ab.dtype)
    a, b = ab.chunk(2, dim=-1)
    eq = "bikc,bjkc->bijc" if direction == "outgoing" else "bkic,bkjc->bijc"
    y = F.layer_norm(
        torch.einsum(eq, a, b), a.shape[-1:], w["norm_out_weight"], w["norm_out_bias"], eps
    )
    return torch.sigmoid(F.linear(zn, w["g_out_weight"], w["g_out_bias"])) * F.linear(
        y, w["p_out_weight"], w["p_out_bias"]
    )


def triangle_multiplicative_update(
    x: torch.Tensor,
    direction: str = "outgoing",
    mask: Optional[torch.Tensor] = None,
    eps: float = 1e-5,
    *,
    low_memory: bool = False,
    **weights: Optional[torch.Tensor],
) -> torch.Tensor:
    """Triangle multiplicative update (docs/DESIGN.md section 2), cuEquivariance's arguments and
    weight packing, every weight a keyword: norm_in_weight, norm_in_bias, p_in_weight = [Wap; Wbp]
    (2Ch x C), p_in_bias, g_in_weight = [Wag; Wbg], g_in_bias, norm_out_weight, norm_out_bias,
    p_out_weight = Wz (C x Ch), p_out_bias, g_out_weight = Wg (C x C), g_out_bias; biases
    optional. x: [B, N, N, C] or [N, N, C]; mask: [B, N, N].

    When autograd will differentiate the call, the CUDA forward also keeps the intermediates its
    backward needs (~2.3 KB per pair at C = Ch = 128) so that the backward does not recompute
    the forward; under torch.no_grad() (or with nothing requiring grad) it keeps nothing.
    low_memory=True keeps nothing in training too: the backward then recomputes the forward
    (its triangle product takes bf16 operands) and walks its last stages in pixel chunks, for
    crops where memory binds: on an H200 the peak of one forward + backward is 1.65 GiB at
    N = 768 and 45 GiB at N = 4096, against 3.6 and 101 GiB, for 32% / 27% more time (README)."""
    if direction not in _DIRECTIONS:
        raise ValueError(
            f"turbopairformer: argument 'direction': expected 'outgoing' or "
            f"'incoming', got {direction!r}"
        )
    unknown = set(weights) - set(WEIGHTS)
    if unknown:
        raise TypeError(
            f"turbopairformer: unexpected argument(s) {sorted(unknown)}; the weights "
            f"are {', '.join(WEIGHTS)}"
        )
    w = [weights.get(n) for n in WEIGHTS]
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
        mask = mask.unsqueeze(0) if mask is not None else None
    if x.dim() == 4 and x.numel() == 0:
        out = _plain_trimul(x, direction, mask, w, eps)
    else:
        grad = any(t is not None and t.requires_grad for t in [x] + w)
        save = torch.is_grad_enabled() and grad and not low_memory
        out, _ = _trimul_fwd(x, mask, *w, _DIRECTIONS[direction], float(eps), save)
    return out.squeeze(0) if unbatched else out


def _casts(z: torch.Tensor) -> bool:
    return z.is_cuda and z.dtype != torch.bfloat16 and torch.is_autocast_enabled("cuda")


def kernel_input(z: torch.Tensor) -> torch.Tensor:
    """The pair tensor as the CUDA kernels take it: bf16 under CUDA autocast (a copy of an fp32
    residual stream), else z itself."""
    return z.to(torch.bfloat16) if _casts(z) else z


def _fuses_residual(z: torch.Tensor, x: torch.Tensor, scale: Optional[torch.Tensor]) -> bool:
    """Whether the op adds the residual itself (out = z + scale * update in its output stage):
    on CUDA where the residual kernel would take z, the update x's dtype and the scale (the same
    rows and arithmetic); on the CPU (the FP64 reference) for a contiguous z. Elsewhere the node
    adds it with the residual kernel."""
    if not z.is_cuda:
        return z.is_contiguous()
    return _residual._on_kernel(z, x.dtype, scale)


# The residual node's forward and backward call the op's implementations (_fwd, _bwd) directly:
# they run inside an autograd node (eager) or a custom op (compiled) already, where another
# dispatch through the op's schema would only add host time before the first kernel.
def _residual_forward(z, x, scale, mask, weights, direction, eps, save):
    """(z + scale * update(x), saved set) with autocast off; x = kernel_input(z)."""
    if _fuses_residual(z, x, scale):
        return _fwd(x, mask, *weights, direction, eps, save, z, scale)
    out, saved = _fwd(x, mask, *weights, direction, eps, save)
    return residual_add(z, out, scale), saved


def _residual_backward(dres, saved, x, mask, scale, weights, direction, eps):
    """(dz, weight gradients, None for absent weights) from the residual's gradient dres."""
    dout = _branch_grad(dres, scale, x.dtype)
    # the pass-through gradient joins the update's in the kernel's last pass, in z's dtype
    if dres.dtype not in (x.dtype, torch.float32):  # e.g. an fp16 z under autocast
        dres = dres.float()
    dres = dres if dres.stride(-1) == 1 else dres.contiguous()
    dz, *dw = _bwd(dout, saved, x, mask, *weights, direction, eps, dres)
    return dz, [g if w is not None else None for g, w in zip(dw, weights)]


class _ResidualUpdate(torch.autograd.Function):
    """z + scale * update(z) for a [B, N, N, C] pair tensor z (fp32 under autocast: the update
    runs on its bf16 copy). Where it can (_fuses_residual) the op's output stage adds the
    residual, so the update is never written. The backward forms the update's gradient in one
    pass from the residual's (forming it inside the op's first backward stage measured slower:
    docs/perf-notes.md), and the update's LayerNorm backward adds the residual's
    gradient to dz in its own pass (dz_in), where autograd would take five (the product, its
    cast, the copy's cast back, the sum)."""

    @staticmethod
    def forward(ctx, z, scale, mask, direction, eps, low_memory, *weights):
        x = kernel_input(z)
        with torch.autocast(z.device.type, enabled=False):
            save = any(t is not None and t.requires_grad for t in [z, *weights]) and not low_memory
            result, saved = _residual_forward(z, x, scale, mask, weights, direction, eps, save)
        ctx.save_for_backward(saved, x, mask, scale, *weights)
        ctx.direction, ctx.eps = direction, eps
        return result

    @staticmethod
    def backward(ctx, dres):
        saved, x, mask, scale, *weights = ctx.saved_tensors
        dz, grads = _residual_backward(dres, saved, x, mask, scale, weights, ctx.direction, ctx.eps)
        return (dz, None, None, None, None, None, *grads)


# The same node as custom ops, for torch.compile (layers.compiled_nodes). `cast`: whether x is
# z's bf16 copy (kernel_input, decided when the graph is traced); the forward returns it
# (empty where x is z) for the backward.
_RES_SCHEMA = (
    f"(Tensor z, Tensor? scale, Tensor? mask, {_W}, int direction, float eps, bool save, "
    "bool cast) -> (Tensor, Tensor, Tensor)"
)
_RES_BWD_SCHEMA = (
    f"(Tensor dres, Tensor saved, Tensor x, Tensor? mask, Tensor? scale, {_W}, "
    "int direction, float eps) -> Tensor[]"
)


def _res_op(z, scale, mask, *rest):
    *weights, direction, eps, save, cast = rest
    x = z.to(torch.bfloat16) if cast else z
    with torch.autocast(z.device.type, enabled=False):
        result, saved = _residual_forward(z, x, scale, mask, weights, direction, eps, save)
    return result, saved, x if cast else z.new_empty(0)


def _res_op_fake(z, scale, mask, *rest):
    *weights, _direction, _eps, save, cast = rest
    x = z.new_empty(z.shape, dtype=torch.bfloat16) if cast else z
    return (
        torch.empty_like(z, memory_format=torch.contiguous_format),
        _saved_buffer(x, weights[2], save),
        (x if cast else z.new_empty(0)),
    )


def _dz_dtype(dres, x):
    return dres.dtype if dres.dtype in (x.dtype, torch.float32) else torch.float32


def _res_bwd_op(dres, saved, x, mask, scale, *rest):
    """x: the kernel's input (z's bf16 copy, or z)."""
    *weights, direction, eps = rest
    with torch.autocast(x.device.type, enabled=False):
        dz, grads = _residual_backward(dres, saved, x, mask, scale, weights, direction, eps)
    return [dz] + [g if g is not None else x.new_empty(0) for g in grads]


def _res_bwd_op_fake(dres, saved, x, mask, scale, *rest):
    weights = rest[:-2]
    return [x.new_empty(x.shape, dtype=_dz_dtype(dres, x))] + [
        torch.empty_like(w) if w is not None else x.new_empty(0) for w in weights
    ]


_residual_fwd_op, _residual_bwd_op = _calls.node_ops(
    ("trimul_residual_update", _res_op, _res_op_fake, _RES_SCHEMA),
    ("trimul_residual_update_bwd", _res_bwd_op, _res_bwd_op_fake, _RES_BWD_SCHEMA),
)


def _res_setup(ctx, inputs, output):
    z, scale, mask, *rest = inputs
    *weights, direction, eps, _save, cast = rest
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)
    # the kernel's input, as eager mode keeps it (not z as well, where x is its copy)
    ctx.save_for_backward(output[1], output[2] if cast else z, mask, scale, *weights)
    ctx.direction, ctx.eps = direction, eps


def _res_autograd(ctx, dres, *_unused):
    if dres is None:
        return (None,) * len(ctx.needs_input_grad)
    saved, x, mask, scale, *weights = ctx.saved_tensors
    dz, *dw = _residual_bwd_op(dres, saved, x, mask, scale, *weights, ctx.direction, ctx.eps)
    grads = [g if w is not None else None for g, w in zip(dw, weights)]
    return (dz, None, None, *grads, None, None, None, None)


_residual_fwd_op.register_autograd(_res_autograd, setup_context=_res_setup)


def residual_update(
    z: torch.Tensor,
    scale: Optional[torch.Tensor],
    direction: str,
    mask: Optional[torch.Tensor],
    eps: float,
    low_memory: bool,
    **weights: Optional[torch.Tensor],
) -> torch.Tensor:
    """z + scale * triangle_multiplicative_update(z, direction, mask, eps, ...) for a batched
    z [B, N, N, C] (scale: None or broadcastable to z, e.g. a shared dropout mask) as one
    autograd node in eager mode, and under torch.compile as its custom ops where
    layers.compiled_nodes(z); else (and for empty inputs) the composed ops."""
    compiling = torch.compiler.is_compiling()
    if z.numel() == 0 or (compiling and not compiled_nodes(z)):
        out = triangle_multiplicative_update(
            kernel_input(z), direction, mask, eps, low_memory=low_memory, **weights
        )
        return residual_add(z, out, scale)
    w = [weights.get(n) for n in WEIGHTS]
    if compiling:
        cast = _casts(z)
        grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in [z, *w])
        return _residual_fwd_op(
            z, scale, mask, *w, _DIRECTIONS[direction], float(eps), grad and not low_memory, cast
        )[0]
    return _ResidualUpdate.apply(z, scale, mask, _DIRECTIONS[direction], float(eps), low_memory, *w)
