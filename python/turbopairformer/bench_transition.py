"""The pair transition (OpenFold3's SwiGLUTransition, n = 4, c_z = 128) as the Pairformer runs it:
the residual update x + mask * transition(x) under bf16 autocast with fp32 weights, B = 1,
5% padded tokens. The fused node (the forward kernel and the backward's middle kernel,
turbopairformer/transition.h) against the same node with the fused kernels off (LayerNorm,
cuBLAS projections and the stand-alone SwiGLU kernels, the hidden activation written out).

Columns: the node's forward and forward + backward (median CUDA-event time of back-to-back
steps), the two fused kernels alone with their TFLOP/s (196,608 and 327,680 multiply-adds a
row), and the peak extra memory of a forward + backward."""

from __future__ import annotations

from pathlib import Path

import torch

from . import _transition
from ._results import doc_table, write_tables
from .bench_pairformer import _median_ms


def node_case(m, x, update, g, owner, fused: bool):
    """One node's residual update (update(): its output for x) under bf16 autocast, with the fused
    kernels of `owner` (a module with supported()) on or off: forward and forward + backward
    (median CUDA-event ms) and the peak extra GiB of a forward + backward."""
    supported = owner.supported
    owner.supported = supported if fused else (lambda *a: False)
    try:

        def step(bwd):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = update()
            if bwd:
                y.backward(g)

        fwd, fb = _median_ms(lambda: step(False), 20), _median_ms(lambda: step(True), 20)
        x.grad = None
        m.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(True)
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    finally:
        owner.supported = supported
    return {"fwd_ms": fwd, "fwd_bwd_ms": fb, "peak_gib": peak}


def _case(N, fused: bool):
    from .pairformer import SwiGLUTransition

    torch.manual_seed(N)
    m = SwiGLUTransition(128, 4).cuda()
    x = torch.randn(1, N, N, 128, device="cuda", requires_grad=True)
    keep = torch.ones(N, device="cuda")
    keep[int(0.95 * N) :] = 0
    mask = (keep[:, None] * keep[None, :])[None]
    update = lambda: m.residual_update(x, mask)  # noqa: E731
    return node_case(m, x, update, torch.randn_like(x), _transition, fused)


def _kernels(N):
    """The two fused kernels alone: (forward ms, backward-middle ms)."""
    rows = N * N
    x = torch.randn(rows, 128, device="cuda")
    wab = (torch.randn(1024, 128, device="cuda") / 11).bfloat16()
    wo = (torch.randn(128, 512, device="cuda") / 22).bfloat16()
    w, b, s = (
        torch.ones(128, device="cuda"),
        torch.zeros(128, device="cuda"),
        torch.ones(rows, device="cuda"),
    )
    g = torch.randn(rows, 128, device="cuda").bfloat16()
    xhat = _transition.forward(x, w, b, 1e-5, wab, wo, True, s)[1]
    fwd = _median_ms(lambda: _transition.forward(x, w, b, 1e-5, wab, wo, True, s), 20)
    bwd = _median_ms(lambda: _transition.backward(xhat, g, wab, wo), 20)
    return fwd, bwd


def table(Ns):
    rows = []
    for N in Ns:
        fused, unfused = _case(N, True), _case(N, False)
        kf, kb = _kernels(N)
        rows.append(
            {
                "N": N,
                "fused": fused,
                "unfused": unfused,
                "kernel_fwd_ms": kf,
                "kernel_bwd_ms": kb,
                "kernel_fwd_tflops": 2 * N * N * 196608 / kf / 1e9,
                "kernel_bwd_tflops": 2 * N * N * 327680 / kb / 1e9,
            }
        )
        print(f"transition N={N}: {rows[-1]}")
    return rows


def write(rows, out_dir: Path, gpu: str, command: str):
    header = (
        "N", "fused fwd ms", "unfused fwd ms", "fused fwd+bwd ms", "unfused fwd+bwd ms",
        "fused / unfused peak GiB", "forward kernel ms (TFLOP/s)",
        "backward-middle kernel ms (TFLOP/s)",
    )  # fmt: skip
    cells = [
        (
            str(r["N"]),
            f"{r['fused']['fwd_ms']:.3f}",
            f"{r['unfused']['fwd_ms']:.3f}",
            f"{r['fused']['fwd_bwd_ms']:.3f}",
            f"{r['unfused']['fwd_bwd_ms']:.3f}",
            f"{r['fused']['peak_gib']:.2f} / {r['unfused']['peak_gib']:.2f}",
            f"{r['kernel_fwd_ms']:.3f} ({r['kernel_fwd_tflops']:.0f})",
            f"{r['kernel_bwd_ms']:.3f} ({r['kernel_bwd_tflops']:.0f})",
        )
        for r in rows
    ]
    lines = doc_table(__doc__, header, cells)
    write_tables(out_dir, "transition", gpu, command, rows, "Fused pair transition", lines)
