#!/usr/bin/env python3
"""Planned memory from the library's own size queries, on a machine without a GPU.

    dev/scripts/memory_plan.py [--op trimul|attention] [--n 256,384,768,1024,2048,4096]
        [--lib PATH] [--peer-mib N=MIB,...]

--op trimul (default): the multiplicative update's bytes a pair, B = 1, C = Ch = 128: the saved
set plus the backward's workspace (saving mode) and the backward's workspace alone (low-memory
mode), with the predicted peak of a forward + backward (as the bench measures it: above the
inputs), which adds the op's output and dz (bf16: 512 bytes a pair). Its predictions have
matched every measured peak to the MiB: at N = 768, 3710 MiB saving against 3712 measured
(trimul_compare/report.md), and 1694 MiB low-memory against 1.65 GiB
(trimul_low_memory_overlays.txt, library ab4780b).
--op attention: the triangle attention backward's workspace (MiB) at the Pairformer's shape,
B = 1, H = 4, D = 32, S = N, bf16 with a bf16 bias.

--lib (default: $TPF_LIBRARY, else the package's search) names the libturbopairformer_c.so to
ask, e.g. a build of a branch from dev/scripts/build_revs.sh. --peer-mib prints a measured peak
(MiB, e.g. cuEquivariance's from bench/results/h200/trimul_compare/report.md) beside it. No
tensor is allocated: the queries read shapes and strides only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

C = CH = 128
OUTPUTS = 2 * 2 * C  # the op's output and dz, bf16, bytes a pair


class _Shape:
    """What the C ABI's size query reads of a tensor: dtype, shape, contiguous strides and a
    (never dereferenced) data pointer."""

    def __init__(self, shape, dtype):
        import torch

        self.shape, self.dtype = torch.Size(shape), dtype
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        self._strides = tuple(reversed(strides))

    def data_ptr(self):
        return 1 << 24

    def dim(self):
        return len(self.shape)

    def stride(self):
        return self._strides


def plan(N: int):
    """(saving, low-memory) bytes a pair at N."""
    import torch

    from turbopairformer import _native, trimul
    from turbopairformer.modules import TriangleMultiplicativeUpdate, packed_weights

    weights = packed_weights(TriangleMultiplicativeUpdate(C, CH).bfloat16())
    w = [weights[n] for n in trimul.WEIGHTS]
    z = _Shape((1, N, N, C), torch.bfloat16)
    mask = _Shape((1, N, N), torch.float32)
    out = []
    for low in (False, True):
        a = trimul._args(z, mask, w, 0, 1e-5, dw=w, dout=z, dz=z)
        saved = 0 if low else int(_native.LIB.tpf_trimul_saved_size(1, N, C, CH))
        if saved:
            a.saved, a.saved_bytes = 1 << 20, saved
        size, err = ctypes.c_size_t(0), _native.error_buffer()
        _native.check(
            _native.LIB.tpf_trimul_workspace_size(
                ctypes.byref(a), 1, ctypes.byref(size), err, len(err)
            ),
            err,
        )
        out.append((size.value + saved) / (N * N))
    return out


def attention_workspace(N: int, H: int = 4, D: int = 32) -> float:
    """The attention backward's workspace in MiB at [1, N, H, N, D], bf16, bf16 bias."""
    import torch

    from turbopairformer import _native, attention

    q = _Shape((1, N, H, N, D), torch.bfloat16)
    bias = _Shape((1, 1, H, N, N), torch.bfloat16)
    mask = _Shape((1, N, 1, 1, N), torch.bool)
    lse = _Shape((1, N, H, N), torch.float32)
    a = attention._args(D**-0.5, True, q=q, k=q, v=q, bias=bias, mask=mask, out=q,
                        out_residual=q, lse=lse, dout=q, dq=q, dk=q, dv=q, dbias=bias)  # fmt: skip
    size, err = ctypes.c_size_t(0), _native.error_buffer()
    query = _native.LIB.tpf_attention_backward_workspace_size
    _native.check(query(ctypes.byref(a), ctypes.byref(size), err, len(err)), err)
    return size.value / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--op", choices=("trimul", "attention"), default="trimul")
    ap.add_argument("--n", default="256,384,768,1024,2048,4096")
    ap.add_argument("--lib", default=None, help="the C library to ask (default: $TPF_LIBRARY)")
    ap.add_argument("--peer-mib", default="", help="N=MIB,... measured peaks to print beside")
    args = ap.parse_args(argv)
    if args.lib:
        os.environ["TPF_LIBRARY"] = str(Path(args.lib).resolve())
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    peers = dict(kv.split("=") for kv in args.peer_mib.split(",") if kv)
    if args.op == "attention":
        print("| N | attention backward workspace, MiB |\n|---|---|")
        for N in (int(n) for n in args.n.split(",")):
            print(f"| {N} | {attention_workspace(N):.1f} |")
        return 0
    head = "| N | saving: plan, B/pair | peak, MiB | low-memory: plan, B/pair | peak, MiB "
    head += "| peer, MiB |"
    print(head + "\n" + "|---" * 6 + "|")
    for N in (int(n) for n in args.n.split(",")):
        saving, low = plan(N)
        mib = [(b + OUTPUTS) * N * N / 2**20 for b in (saving, low)]
        peer = peers.get(str(N), "")
        print(f"| {N} | {saving:.0f} | {mib[0]:.0f} | {low:.0f} | {mib[1]:.0f} | {peer} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
