"""The library's fused SwiGLU transition (turbopairformer/transition.h). The forward: LayerNorm,
the stacked up projection, silu(a) * b and the down projection, plus the residual add, in one
kernel that keeps the [rows, 2H] hidden activation on chip. The backward's middle: the
activation recomputed on chip, SwiGLU's backward and the input-side product in one kernel.
Built for C = 128 rows in bf16 compute on sm_90; other cases take the unfused path
(layers.swiglu_transition)."""

from __future__ import annotations

import functools

import torch

from . import _calls, _native, _norm, _residual

C = 128


@torch.compiler.assume_constant_result
@functools.cache
def _sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] == 9


def supported(x: torch.Tensor, hidden: int, cd: torch.dtype, scale) -> bool:
    """Whether the fused kernels take this call (eager mode): x [*, 128] fp32 or bf16 on an sm_90
    GPU, 16-byte aligned once contiguous, bf16 compute, a hidden width H a multiple of 64, and a
    scale (if any) of one value a row."""
    rows = x.numel() // C if x.shape[-1] == C else 0
    return (
        x.is_cuda
        and rows > 0
        and cd == torch.bfloat16
        and x.dtype in (torch.float32, torch.bfloat16)
        and hidden % 64 == 0
        and (scale is None or scale.numel() == rows)
        # a copy is aligned; a view may not be (a compiled graph's custom op copies it itself)
        and (torch.compiler.is_compiling() or not x.is_contiguous() or x.data_ptr() % 16 == 0)
        and _sm90(x.device.index if x.device.index is not None else torch.cuda.current_device())
    )


def forward(x, ln_w, ln_b, eps, wab, wo, residual: bool, scale=None):
    """(out, xhat, mean, rstd): out = x + scale * transition(x) (residual) in x's dtype, or
    transition(x) in bf16; xhat = LayerNorm(x) in bf16 and its fp32 row statistics. x
    contiguous; wab [2H, C] and wo [C, H] bf16 contiguous."""
    rows = x.numel() // max(x.shape[-1], 1)
    out = (
        torch.empty_like(x)
        if residual
        else torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    )
    xhat = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    params = [None if t is None else t.float().contiguous() for t in (ln_w, ln_b)]
    s = None if scale is None else scale.reshape(-1).float().contiguous()  # checked: one a row
    a = _calls.struct(
        _native.TpfTransitionArgs,
        x=x,
        ln_w=params[0],
        ln_b=params[1],
        w_ab=wab,
        w_o=wo,
        scale=s,
        out=out,
        xhat=xhat,
        mean=mean,
        rstd=rstd,
    )
    a.eps, a.residual = eps, int(residual)
    _calls.run(_native.LIB.tpf_transition_forward, a, x)
    return out, xhat, mean, rstd


def backward(xhat, g, wab, wo):
    """(h, dab, dxhat) from xhat (the forward's) and g, the gradient of the down projection's
    output: h = silu(a) b, dab = [da | db] and dxhat = dab wab, with [a | b] = xhat wab^T and
    g wo recomputed on chip; all bf16. xhat, g [*, C] contiguous bf16."""
    H = wab.shape[0] // 2
    lead = xhat.shape[:-1]
    h = torch.empty((*lead, H), dtype=torch.bfloat16, device=xhat.device)
    dab = torch.empty((*lead, 2 * H), dtype=torch.bfloat16, device=xhat.device)
    dxhat = torch.empty_like(xhat)
    a = _calls.struct(
        _native.TpfTransitionBackwardArgs,
        xhat=xhat,
        g=g,
        w_ab=wab,
        w_o=wo,
        h=h,
        dab=dab,
        dxhat=dxhat,
    )
    _calls.run(_native.LIB.tpf_transition_backward, a, xhat)
    return h, dab, dxhat


# The fused node as torch.library custom ops, so that eager mode and torch.compile run the same
# kernels: the forward keeps xhat (bf16) and its statistics; the backward recomputes the
# activation on chip, then the weight gradients (fp32 from GEMMs over h and [da | db]) and the
# LayerNorm backward with the residual's pass-through gradient.
_NODE_SCHEMA = (
    "(Tensor x, Tensor? ln_w, Tensor? ln_b, Tensor wa, Tensor wb, Tensor wo, Tensor? scale, "
    "float eps, bool residual) -> (Tensor, Tensor, Tensor, Tensor)"
)
_NODE_BWD_SCHEMA = (
    "(Tensor dout, Tensor x, Tensor mean, Tensor rstd, Tensor? ln_w, Tensor? ln_b, Tensor xhat, "
    "Tensor wa, Tensor wb, Tensor wo, Tensor? scale, float eps, bool residual, bool need_ln_w, "
    "bool need_ln_b) -> Tensor[]"
)


def _bf16_weights(wa, wb, wo):
    return torch.cat([wa, wb]).to(torch.bfloat16), wo.to(torch.bfloat16)  # [2H, C], [C, H]


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x contiguous and 16-byte aligned, as the kernels read it (a copy where it is not)."""
    x = x.contiguous()
    return x.clone() if x.is_cuda and x.data_ptr() % 16 else x


def _node_fwd(x, ln_w, ln_b, wa, wb, wo, scale, eps, residual):
    wab, wo_c = _bf16_weights(wa, wb, wo)
    return forward(_aligned(x), ln_w, ln_b, eps, wab, wo_c, residual, scale)


def _node_fwd_fake(x, ln_w, ln_b, wa, wb, wo, scale, eps, residual):
    rows = x.numel() // x.shape[-1]
    out = x.new_empty(x.shape) if residual else x.new_empty(x.shape, dtype=torch.bfloat16)
    stats = x.new_empty(rows, dtype=torch.float32)
    return out, x.new_empty(x.shape, dtype=torch.bfloat16), stats, torch.empty_like(stats)


def _node_bwd(dout, x, mean, rstd, ln_w, ln_b, xhat, wa, wb, wo, scale, eps, residual, nw, nb):
    from .layers import _weight_grads  # layers imports this module

    wab, wo_c = _bf16_weights(wa, wb, wo)
    g = _residual.backward(dout, scale if residual else None, torch.bfloat16).contiguous()
    h, dab, dxhat = backward(xhat, g, wab, wo_c)
    dwo, _ = _weight_grads(g, h, wo.dtype, False)
    dwab, _ = _weight_grads(dab, xhat, wa.dtype, False)
    dz = dout.to(x.dtype).contiguous() if residual else None
    dx, dln_w, dln_b = _norm.backward(
        dxhat, x.contiguous(), ln_w, ln_b, eps, mean, rstd, nw, nb, dz
    )
    empty = x.new_empty(0)
    H = wa.shape[0]
    return [
        dx,
        dln_w if dln_w is not None else empty,
        dln_b if dln_b is not None else empty,
        dwab[:H],
        dwab[H:].clone(),  # a custom op's outputs may not share storage
        dwo,
    ]


def _node_bwd_fake(dout, x, mean, rstd, ln_w, ln_b, xhat, wa, wb, wo, scale, eps, residual, nw, nb):
    empty = x.new_empty(0)
    return [
        torch.empty_like(x, memory_format=torch.contiguous_format),
        torch.empty_like(ln_w) if nw and ln_w is not None else empty,
        torch.empty_like(ln_b) if nb and ln_b is not None else empty,
        torch.empty_like(wa),
        torch.empty_like(wb),
        torch.empty_like(wo),
    ]


node, _node_backward = _calls.node_ops(
    ("swiglu_transition", _node_fwd, _node_fwd_fake, _NODE_SCHEMA),
    ("swiglu_transition_bwd", _node_bwd, _node_bwd_fake, _NODE_BWD_SCHEMA),
)


def _setup(ctx, inputs, output):
    x, ln_w, ln_b, wa, wb, wo, scale, eps, residual = inputs
    _, xhat, mean, rstd = output
    ctx.mark_non_differentiable(xhat, mean, rstd)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, mean, rstd, ln_w, ln_b, xhat, wa, wb, wo, scale)
    ctx.eps, ctx.residual = eps, residual


def _node_autograd(ctx, dout, *_unused):
    need = ctx.needs_input_grad
    if dout is None:
        return (None,) * len(need)
    x, mean, rstd, ln_w, ln_b, xhat, wa, wb, wo, scale = ctx.saved_tensors
    dx, dln_w, dln_b, dwa, dwb, dwo = _node_backward(
        dout, x, mean, rstd, ln_w, ln_b, xhat, wa, wb, wo, scale, ctx.eps, ctx.residual,
        need[1] and ln_w is not None, need[2] and ln_b is not None,
    )  # fmt: skip
    dln_w = dln_w if need[1] and ln_w is not None else None
    dln_b = dln_b if need[2] and ln_b is not None else None
    return dx, dln_w, dln_b, dwa, dwb, dwo, None, None, None


node.register_autograd(_node_autograd, setup_context=_setup)
