"""On the GPU machine: the CUDA kernels of one training call (forward + backward) of the triangle
multiplicative update through the Python front end, in launch order, with the TFLOP/s (2 N^3 Ch)
beside each triangle product (the TMA loop's kernels with a TMA store epilogue).
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 dev/scripts/device_trimul_kernels.py
       [--n 768,2048] [--c 128] [--direction outgoing|incoming] [--label NAME] [--inference]
--inference: the kernels of one forward under torch.no_grad() (nothing saved) instead."""

import argparse
import re

import torch
import turbopairformer as tpf
from turbopairformer.bench import TRIMUL_WEIGHTS, trimul_inputs
from turbopairformer.bench_pairformer import profiled


def short(name):
    name = re.sub(r"tpf::(trimul::)?", "", name)
    name = re.sub(r"\(Major\)", "M", name)
    return name[:88]


def _us(e):
    return getattr(e, "device_time", None) or e.cuda_time


def kernels(N, C, direction, reps=3, inference=False):
    x, mask, w, dout = trimul_inputs(N, C, 0)
    leaves = [x.requires_grad_(True)] + [w[k].requires_grad_(True) for k in TRIMUL_WEIGHTS]

    def step():
        if inference:
            with torch.no_grad():
                tpf.triangle_multiplicative_update(x, direction, mask, **w)
            return
        out = tpf.triangle_multiplicative_update(x, direction, mask, **w)
        torch.autograd.grad(out, leaves, dout)

    prof = profiled(step, reps, warmups=3)
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = len(evs) // reps
    rows = []
    for i in range(per):  # the median over the repetitions of the i-th kernel of a call
        ts = sorted(_us(evs[r * per + i]) for r in range(reps))
        rows.append((evs[i].name, ts[reps // 2]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="768,2048")
    ap.add_argument("--c", type=int, default=128)
    ap.add_argument("--direction", default="outgoing")
    ap.add_argument("--label", default="")
    ap.add_argument("--inference", action="store_true")
    a = ap.parse_args()
    for N in (int(v) for v in a.n.split(",")):
        rows = kernels(N, a.c, a.direction, inference=a.inference)
        flop = 2.0 * N**3 * a.c
        total = sum(t for _, t in rows)
        print(
            f"== {a.label} N={N} {a.direction}: {len(rows)} kernels, {total / 1e3:.3f} ms of kernel time"
        )
        for name, t in rows:
            tag = ""
            if "gemm_tma_kernel" in name and "TmaStoreEpilogue" in name:
                tag = f"  {flop / (t * 1e-6) / 1e12:6.0f} TFLOP/s"
            print(f"  {t:9.1f} us  {short(name)}{tag}")


if __name__ == "__main__":
    main()
