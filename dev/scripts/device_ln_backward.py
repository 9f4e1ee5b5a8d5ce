#!/usr/bin/env python3
"""Times the library's LayerNorm backward as the pair track calls it: fp32 x [N*N, 128], bf16 dy,
an fp32 dx_in addend, weight and bias gradients; median of 20 CUDA-event-timed calls, the bytes it
moves over that time, and whether two calls give bitwise-identical results. The library is the one
TPF_LIBRARY names (else the installed one), so two builds compare in one call:

    TPF_LIBRARY=old/libturbopairformer_c.so python dev/scripts/device_ln_backward.py 768 old
    TPF_LIBRARY=new/libturbopairformer_c.so python dev/scripts/device_ln_backward.py 768 new
"""

import argparse

import torch

from turbopairformer import _norm
from turbopairformer.bench_pairformer import _median_ms


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("n", type=int, nargs="?", default=768, help="N (rows = N * N)")
    ap.add_argument("label", nargs="?", default="", help="a name for the output line")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("device_ln_backward: no CUDA GPU")
    x = torch.randn(args.n * args.n, 128, device="cuda")
    w = 1 + 0.1 * torch.randn(128, device="cuda")
    b = 0.1 * torch.randn(128, device="cuda")
    _, mean, rstd = _norm.forward(x, w, b, 1e-5, torch.bfloat16)
    dy = torch.randn(x.shape, device="cuda").bfloat16()
    dx_in = torch.randn_like(x)

    def run():
        return _norm.backward(dy, x, w, b, 1e-5, mean, rstd, True, True, dx_in=dx_in)

    first, second = run(), run()
    same = all(torch.equal(p, q) for p, q in zip(first, second))
    ms = _median_ms(run, 20)
    gb = (x.numel() * 4 * 3 + dy.numel() * 2) / 1e9  # x, dx_in, dx in fp32; dy in bf16
    print(
        f"{args.label} ln_bwd N={args.n} {ms:.3f} ms ({gb / ms:.2f} TB/s of {gb:.2f} GB) repeatable={same}"
    )


if __name__ == "__main__":
    main()
