"""The library's LayerNorm (turbopairformer/layer_norm.h) as two plain functions for the autograd
nodes of layers.py: CUDA tensors run the kernels, CPU tensors the FP64 reference.

The CUDA forward reads x in its own precision and writes y in the precision of the GEMM that
consumes it (bf16 from fp32 x under autocast, with no cast pass); the backward's weight and bias
gradients are bitwise repeatable (fixed-order partial sums)."""

from __future__ import annotations

from typing import Optional

import torch

from . import _calls, _native

# (x dtype, y dtype) pairs the CUDA kernels are built for (validate_layer_norm.cpp).
_GPU_PAIRS = {
    (torch.float32, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
}
_GPU_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gpu_supported(x: torch.Tensor, weight: Optional[torch.Tensor], out_dtype: torch.dtype) -> bool:
    """Whether the CUDA kernels take this case (else the caller uses PyTorch's LayerNorm)."""
    W = x.shape[-1] if x.dim() else 0
    return (
        x.is_cuda
        and W % 32 == 0
        and 0 < W <= 256
        and (x.dtype, out_dtype) in _GPU_PAIRS
        and (weight is None or weight.dtype in _GPU_PARAM_DTYPES)
    )


def _args(eps, **tensors) -> _native.TpfLayerNormArgs:
    a = _calls.struct(_native.TpfLayerNormArgs, **tensors)
    a.eps = eps
    return a


def forward(x, weight, bias, eps: float, out_dtype: torch.dtype):
    """(y, mean, rstd): y = LayerNorm(x) in out_dtype; mean, rstd fp32 per row. x contiguous."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    a = _args(eps, x=x, weight=weight, bias=bias, y=y, mean=mean, rstd=rstd)
    _calls.run(_native.LIB.tpf_layer_norm_forward, a, x)
    return y, mean, rstd


def backward(
    dy, x, weight, bias, eps: float, mean, rstd, need_weight: bool, need_bias: bool, dx_in=None
):
    """(dx, dweight, dbias) of forward's y = LayerNorm(x); dweight/dbias None unless asked.
    dx_in (x's shape and dtype, contiguous): added to dx in the same pass."""
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dw = torch.empty_like(weight) if need_weight and weight is not None else None
    db = torch.empty_like(bias) if need_bias and bias is not None else None
    a = _args(
        eps,
        x=x,
        weight=weight,
        bias=bias,
        mean=mean,
        rstd=rstd,
        dy=dy,
        dx=dx,
        dweight=dw,
        dbias=db,
        dx_in=dx_in,
    )
    lib = _native.LIB
    _calls.call_with_workspace(
        lib.tpf_layer_norm_backward, lib.tpf_layer_norm_backward_workspace_size, a, x
    )
    return dx, dw, db
