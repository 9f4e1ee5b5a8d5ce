"""On the GPU machine: peak extra memory and time of one triangle multiplicative update forward +
backward through the Python op (outgoing, C = Ch = 128, bf16, the bench's inputs), with
low_memory off (the forward saves, the backward reads the saved set) and on (nothing saved, the
backward recomputes and runs its tail over pixel chunks). Peak: torch.cuda.max_memory_allocated
over one step, less what was allocated before it; time: CUDA events over back-to-back steps after
3 more warm-ups (device_py_overhead.queued_ms).
Usage: TPF_LIBRARY=... PYTHONPATH=python:dev/scripts python3 dev/scripts/device_trimul_memory.py
       [--n 768,2048,4096] [--label NAME]"""

import argparse

import torch
import turbopairformer as tpf
from device_py_overhead import queued_ms  # (scripts/ is on the path when run)
from turbopairformer.bench import TRIMUL_WEIGHTS, trimul_inputs


def measure(N, low):
    x, mask, w, dout = trimul_inputs(N, 128, 0)
    leaves = [x.requires_grad_(True)] + [w[k].requires_grad_(True) for k in TRIMUL_WEIGHTS]

    def step():
        out = tpf.triangle_multiplicative_update(x, "outgoing", mask, low_memory=low, **w)
        return torch.autograd.grad(out, leaves, dout)

    step()  # warm-up (its gradients are freed on return)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    grads = step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    del grads
    return peak, queued_ms(step, 3 if N >= 4096 else 10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="768,2048,4096")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    for N in (int(v) for v in args.n.split(",")):
        for low in (False, True):
            peak, ms = measure(N, low)
            print(
                f"{args.label} N={N} low_memory={low}: peak extra {peak:.2f} GiB "
                f"({peak * 1024:.0f} MiB), fwd+bwd {ms:.3f} ms"
            )
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
