"""On the GPU machine: where the Python front end's time goes for one triangle attention call
(the comparison report times each call with a synchronize before it, so a call's CPU launch time
counts). Prints, per N: the GPU time of back-to-back calls, the report's per-call time, and the
CPU time of one call (no synchronize).
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 scripts/device_py_overhead.py"""
import statistics
import time

import torch

import turbopairformer as tpf
from turbopairformer.bench import attention_inputs


def stats(N, D=32, iters=30):
    q, k, v, bias, mask, _ = attention_inputs(N, D, 0)
    call = lambda: tpf.triangle_attention(q, k, v, bias, mask)
    with torch.no_grad():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            call()
        b.record()
        b.synchronize()
        queued = a.elapsed_time(b) / iters
        per_call, cpu = [], []
        for _ in range(iters):
            a.record()
            t0 = time.perf_counter()
            call()
            cpu.append((time.perf_counter() - t0) * 1e3)
            b.record()
            b.synchronize()
            per_call.append(a.elapsed_time(b))
    print(f"N={N:5d} D={D}: queued {queued:.3f} ms/call, synchronized per call {statistics.median(per_call):.3f} ms, "
          f"CPU time of a call {statistics.median(cpu):.3f} ms")


if __name__ == "__main__":
    for N in (128, 384, 768):
        stats(N)
