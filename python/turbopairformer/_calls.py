"""What every op's call into the C ABI needs: tensors as its structs, the device workspace from
PyTorch's caching allocator, the current stream, and the device guard."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Optional

import torch

from . import _native

DTYPES = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2, torch.float64: 3, torch.bool: 4}


def tensor(x: Optional[torch.Tensor], name: str) -> _native.TpfTensor:
    t = _native.TpfTensor()
    if x is None:
        return t
    if x.dtype not in DTYPES:
        raise TypeError(f"turbopairformer: argument '{name}': unsupported dtype {x.dtype}")
    if x.dim() > 6:
        raise ValueError(f"turbopairformer: argument '{name}': rank {x.dim()} is above 6")
    t.data = x.data_ptr()
    t.dtype = DTYPES[x.dtype]
    rank = x.dim()
    t.rank = rank
    t.shape[:rank] = x.shape  # slice assignment: half the time of an element loop (a call builds 8)
    t.stride[:rank] = x.stride()
    return t


def struct(cls, **tensors):
    """An args struct of the C ABI with the named tensors filled in (the rest absent). A name
    the loaded library's struct lacks (a library older than this package) raises."""
    a = cls()
    for name, t in tensors.items():
        try:
            setattr(a, name, tensor(t, name))
        except AttributeError:
            raise RuntimeError(
                f"turbopairformer: the loaded library ({_native.LIBRARY_PATH}) has no argument "
                f"'{name}' in {cls.__name__}: it is older than this Python package; rebuild or "
                "reinstall it"
            ) from None
    return a


def workspace(query, a, x, err, *flags):
    """The device workspace a CUDA call needs (query(args, *flags, &bytes, err, len)), from
    PyTorch's caching allocator: (tensor to keep alive, pointer, bytes); none on the CPU."""
    if not x.is_cuda:
        return None, None, 0
    size = ctypes.c_size_t(0)
    _native.check(query(ctypes.byref(a), *flags, ctypes.byref(size), err, len(err)), err)
    workspace = torch.empty(size.value, dtype=torch.uint8, device=x.device)
    return workspace, ctypes.c_void_p(workspace.data_ptr()), size.value


def stream(x: torch.Tensor):
    return ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream) if x.is_cuda else None


def check_call(fn, a, *args) -> None:
    """fn(&a, *args, err, len): one call of the C ABI; a failure raises with the core's message."""
    err = _native.error_buffer()
    _native.check(fn(ctypes.byref(a), *args, err, len(err)), err)


def run(fn, a, x: torch.Tensor) -> None:
    """fn(&a, on_gpu, stream, err, len) on x's device: the CUDA kernels for a CUDA x, the FP64
    reference otherwise."""
    with device_of(x):
        check_call(fn, a, int(x.is_cuda), stream(x))


def call_with_workspace(fn, query, a, x: torch.Tensor, *flags) -> None:
    """fn(&a, on_gpu, workspace, bytes, stream, err, len) on x's device, with the workspace
    that query(&a, *flags, &bytes, err, len) asks for."""
    err = _native.error_buffer()
    with device_of(x):
        _ws, ptr, nbytes = workspace(query, a, x, err, *flags)
        check_call(fn, a, int(x.is_cuda), ptr, nbytes, stream(x))


def device_of(x: torch.Tensor):
    """The device guard of a call: x's CUDA device, or nothing on the CPU."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def vector_friendly(x: torch.Tensor) -> bool:
    """Head-dim stride 1 and 16-byte aligned rows: what the CUDA kernels read directly."""
    step = 16 // x.element_size()
    return (
        x.stride(-1) == 1
        and x.data_ptr() % 16 == 0
        and all(s % step == 0 for n, s in zip(x.shape[:-1], x.stride()[:-1]) if n > 1)
    )


def node_ops(forward, backward):
    """A node's forward and backward as torch.library custom ops of the turbopairformer
    namespace, with their fake implementations: forward, backward = (name, function, fake,
    schema). Neither mutates its arguments; the caller joins them with register_autograd."""
    ops = []
    for name, fn, fake, schema in (forward, backward):
        op = torch.library.custom_op(f"turbopairformer::{name}", fn, mutates_args=(), schema=schema)
        op.register_fake(fake)
        ops.append(op)
    return tuple(ops)
