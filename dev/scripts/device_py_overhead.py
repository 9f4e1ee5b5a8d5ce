"""On the GPU machine: where the Python front end's time goes for one triangle attention call
(the comparison report times each call with a synchronize before it, so a call's CPU launch time
counts). Prints, per N: the GPU time of back-to-back calls, the report's per-call time, and the
CPU time of one call (no synchronize).
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 dev/scripts/device_py_overhead.py"""
import statistics
import time

import torch

import turbopairformer as tpf
from turbopairformer.bench import attention_inputs
from turbopairformer.bench_pairformer import _queued_ms as queued_ms


def per_call_ms(fn, iters):
    """Medians over calls each timed after a synchronize (the comparison report's timing): the
    call's GPU-event time and its CPU time."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, cpu = [], []
    for _ in range(iters):
        torch.cuda.synchronize()
        a.record()
        t0 = time.perf_counter()
        fn()
        cpu.append((time.perf_counter() - t0) * 1e3)
        b.record()
        b.synchronize()
        gpu.append(a.elapsed_time(b))
    return statistics.median(gpu), statistics.median(cpu)


def stats(N, D=32, iters=30):
    q, k, v, bias, mask, _ = attention_inputs(N, D, 0)
    call = lambda: tpf.triangle_attention(q, k, v, bias, mask)
    with torch.no_grad():
        queued = queued_ms(call, iters)
        per_call, cpu = per_call_ms(call, iters)
    print(f"N={N:5d} D={D}: queued {queued:.3f} ms/call, synchronized per call {per_call:.3f} ms, "
          f"CPU time of a call {cpu:.3f} ms")


if __name__ == "__main__":
    for N in (128, 384, 768):
        stats(N)
