"""On the GPU machine: where the time of a training step's call through the Python front end goes
(fwd + bwd by autograd, the comparison report's inputs): the triangle multiplicative update at
N = 768, C = 128, to set against `tpf bench --op trimul` (C++), and triangle attention at N = 768,
D = 32. Prints queued and synchronized per-call times, and the profiler's CUDA kernel table of the
multiplicative update's training step (--profile).
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 dev/scripts/device_trimul_py_profile.py [--profile]"""
import sys

import torch

import turbopairformer as tpf
from device_py_overhead import per_call_ms, queued_ms  # (scripts/ is on the path when run)
from turbopairformer.bench import TRIMUL_WEIGHTS, attention_inputs, trimul_inputs


def timings(label, fwd, fb, iters=10):
    for name, fn in (("fwd (no_grad)", fwd), ("fwd+bwd", fb)):
        queued, per_call = queued_ms(fn, iters), per_call_ms(fn, iters)[0]
        print(f"{label} {name}: queued {queued:.3f} ms/call, synchronized per call {per_call:.3f} ms")


def main(profile, N=768, C=128, D=32):
    x, mask, w, dout = trimul_inputs(N, C, 0)
    leaves = [x.requires_grad_(True)] + [w[k].requires_grad_(True) for k in TRIMUL_WEIGHTS]

    def fb():
        out = tpf.triangle_multiplicative_update(x, "outgoing", mask, **w)
        torch.autograd.grad(out, leaves, dout)

    def fwd():
        with torch.no_grad():
            tpf.triangle_multiplicative_update(x, "outgoing", mask, **w)

    timings(f"trimul N={N} C={C}", fwd, fb)
    q, k, v, bias, amask, adout = attention_inputs(N, D, 0)
    aleaves = [t.requires_grad_(True) for t in (q, k, v, bias)]

    def afb():
        torch.autograd.grad(tpf.triangle_attention(q, k, v, bias, amask), aleaves, adout)

    def afwd():
        with torch.no_grad():
            tpf.triangle_attention(q, k, v, bias, amask)

    timings(f"attention N={N} D={D}", afwd, afb)
    if not profile:
        return
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fb()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main("--profile" in sys.argv)
