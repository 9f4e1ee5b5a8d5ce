"""On the CPU: the host work of one eager Pairformer block step as the GPU path does it, counted.

The library's C calls are stubbed and counted, and the predicates that pick the CUDA kernels
(`_norm.gpu_supported`, `_transition.supported`, `_gated_linear.supported`, the gate's,
residual's and SwiGLU's `_on_kernel`, the multiplicative update's cast and fused residual) are
forced true, so the Python of each node runs as it does on an sm_90 GPU; the tensors are the
CPU's and small (N = 16), so the time is mostly the host's. Prints, for ours and the plain-PyTorch
block: host ms a step, aten ops a step (torch.profiler, nested ops included) and C calls a step;
--ops adds our most frequent aten ops. On the H200 an eager block step at N = 256 took ~11 ms for
3.5 ms of kernels (bench/results/h200/compiled_step.txt): at ~5-8 us an aten op and ~50 us a C
call, these counts account for it, so a change to the nodes' host work can be counted here
before any device time.
Usage: TPF_LIBRARY=... PYTHONPATH=python python dev/scripts/cpu_host_proxy.py [--n 16] [--ops]"""

import argparse
import collections
import time

import torch
from torch.profiler import ProfilerActivity, profile
from turbopairformer import (
    _calls,
    _gate,
    _gated_linear,
    _norm,
    _residual,
    _swiglu,
    _transition,
    trimul,
)
from turbopairformer.pairformer import PairformerBlock
from turbopairformer.reference import OpenFold3PairFormerBlock

CALLS = collections.Counter()


def _gpu_path():
    """The stubs and forced predicates (see the module's docstring)."""

    def always(*args, **kw):
        return True

    _calls.check_call = lambda fn, a, *args: CALLS.update([fn.__name__])
    _gate._on_kernel = _gated_linear.supported = _norm.gpu_supported = always
    _residual._on_kernel = _swiglu._on_kernel = _transition.supported = always
    trimul._casts = lambda z: z.dtype != torch.bfloat16 and torch.is_autocast_enabled("cpu")
    trimul._fuses_residual = always


def _stepper(block, N):
    torch.manual_seed(0)
    s = torch.randn(1, N, 384, requires_grad=True)
    z = torch.randn(1, N, N, 128, requires_grad=True)
    sm = torch.ones(1, N)
    pm = sm[:, :, None] * sm[:, None, :]

    def step():
        block.zero_grad(set_to_none=True)
        s.grad = z.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            so, zo = block(s, z, sm, pm)
        (so.float().square().mean() + zo.float().square().mean()).backward()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--ops", action="store_true", help="our most frequent aten ops")
    a = ap.parse_args()
    _gpu_path()
    for name, cls in (("ours", PairformerBlock), ("plain PyTorch", OpenFold3PairFormerBlock)):
        step = _stepper(cls().train(), a.n)
        for _ in range(3):
            step()
        CALLS.clear()
        reps = 20
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        ms = (time.perf_counter() - t0) / reps * 1e3
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        aten = [(e.count, e.key) for e in prof.key_averages() if e.key.startswith("aten::")]
        calls = sum(CALLS.values()) // reps
        print(
            f"{name:14s} {ms:6.1f} ms a step (CPU), {sum(c for c, _ in aten):5d} aten ops, "
            f"{calls:3d} C calls"
        )
        if a.ops and name == "ours":
            for count, key in sorted(aten, reverse=True)[:25]:
                print(f"    {count:5d} {key}")


if __name__ == "__main__":
    main()
