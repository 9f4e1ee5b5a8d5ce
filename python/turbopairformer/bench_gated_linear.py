"""The attention layers' gated output projection as the Pairformer runs it: the residual update
x + dropout * linear_o(sigmoid(g) * o) of TriangleAttention (starting node, 4 heads x 32, c_z =
128) under bf16 autocast with fp32 weights, B = 1, a row-wise dropout mask (p = 0.25). The fused
forward kernel (turbopairformer/gated_linear.h) against the unfused path (the gate kernel, a
cuBLAS GEMM, the residual kernel); the backward is the unfused one in both.

Columns: the whole layer's forward and forward + backward with the fused kernel on and off
(median CUDA-event time of back-to-back steps), and the projection alone: the fused kernel's and
the unfused path's CUDA time (torch.profiler), with fp32 x and the mask, then without a residual
(bf16 out), with the fused kernel's bandwidth over the bytes it must move (g, o, x read, out
written)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from . import _gate, _gated_linear, _residual
from ._results import doc_table, write_tables
from .bench_pairformer import _kernel_ms
from .bench_transition import node_case

C = 128


def _layer(N, fused: bool):
    from .modules import TriangleAttention

    torch.manual_seed(N)
    m = TriangleAttention(C, 32, 4, bias=False).cuda()
    x = torch.randn(1, N, N, C, device="cuda", requires_grad=True)
    mask = F.dropout(torch.ones(1, 1, N, C, device="cuda"), 0.25, True).bfloat16()
    update = lambda: m.residual_update(x, scale=mask)  # noqa: E731
    return node_case(m, x, update, torch.randn_like(x), _gated_linear, fused)


def _cuda_ms(fn) -> float:
    ours, rest, _ = _kernel_ms(fn)
    return ours + rest


def _projection(N):
    """CUDA ms of (fused residual, unfused residual, fused without residual, unfused without)."""
    R, shape = N * N, (1, N, N, C)
    y = torch.randn(R, 520, device="cuda").bfloat16()  # the stacked projection; g its gate block
    g, o = y[:, 384:512], torch.randn(R, C, device="cuda").bfloat16()
    w = (torch.randn(C, C, device="cuda") / C**0.5).bfloat16()
    x = torch.randn(shape, device="cuda")
    mask = F.dropout(torch.ones(1, 1, N, C, device="cuda"), 0.25, True).bfloat16()

    def unfused(res):
        out = F.linear(_gate.forward(g, o), w).view(shape)
        return _residual.forward(x, out, mask) if res else out

    return (
        _cuda_ms(lambda: _gated_linear.forward(g, o, w, None, x, mask, shape)),
        _cuda_ms(lambda: unfused(True)),
        _cuda_ms(lambda: _gated_linear.forward(g, o, w, None, None, None, shape)),
        _cuda_ms(lambda: unfused(False)),
    )


def table(Ns):
    rows = []
    for N in Ns:
        fused, unfused = _layer(N, True), _layer(N, False)
        fr, ur, fn, un = _projection(N)
        moved = N * N * C * (2 + 2 + 4 + 4)  # bytes: g, o, x read; out (fp32) written
        rows.append(
            {
                "N": N,
                "fused": fused,
                "unfused": unfused,
                "kernel_residual_ms": fr,
                "unfused_residual_ms": ur,
                "kernel_plain_ms": fn,
                "unfused_plain_ms": un,
                "kernel_residual_tbs": moved / fr / 1e9,
            }
        )
        print(f"gated linear N={N}: {rows[-1]}")
    return rows


def write(rows, out_dir: Path, gpu: str, command: str):
    header = (
        "N", "layer fwd ms fused / unfused", "layer fwd+bwd ms fused / unfused",
        "projection with residual ms: kernel (TB/s) / unfused",
        "without residual ms: kernel / unfused",
    )  # fmt: skip
    cells = [
        (
            str(r["N"]),
            f"{r['fused']['fwd_ms']:.3f} / {r['unfused']['fwd_ms']:.3f}",
            f"{r['fused']['fwd_bwd_ms']:.3f} / {r['unfused']['fwd_bwd_ms']:.3f}",
            f"{r['kernel_residual_ms']:.3f} ({r['kernel_residual_tbs']:.2f}) / "
            f"{r['unfused_residual_ms']:.3f}",
            f"{r['kernel_plain_ms']:.3f} / {r['unfused_plain_ms']:.3f}",
        )
        for r in rows
    ]
    lines = doc_table(__doc__, header, cells)
    write_tables(
        out_dir, "gated_linear", gpu, command, rows, "Fused gated output projection", lines
    )
