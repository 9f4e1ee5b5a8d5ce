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
Usage: TPF_LIBRARY=... PYTHONPATH=python python dev/scripts/cpu_host_proxy.py [--n 16] [--ops]
       [--prologue [--compiled]] (the pair block's forward, eager or compiled, to its first C
       call, by piece; and one multiplicative-update call through its op against its
       implementation)"""

import argparse
import collections
import statistics
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
from turbopairformer.bench_pairformer import _grad_clearer
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

    clear = _grad_clearer(block)  # as the bench clears them

    def step():
        clear()
        s.grad = z.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            so, zo = block(s, z, sm, pm)
        (so.float().square().mean() + zo.float().square().mean()).backward()

    return step


def stamp_pieces(stamps, compiled):
    """Wraps the pieces of the pair block's forward before its first C call so that each appends
    (name + " >" / " <", time.perf_counter()) to stamps on entry and exit; compiled: only those
    inside the fused nodes' custom ops (stamps in traced code would break the graphs)."""
    from turbopairformer import modules, pairformer

    pieces = [(pairformer, "_dropout_scale"), (modules, "packed_weights"),
              (trimul, "kernel_input"), (trimul, "_fwd"), (trimul, "_args")]  # fmt: skip
    for mod, name in pieces[3:] if compiled else pieces:
        f = getattr(mod, name)

        def g(*args, _f=f, _name=name, **kw):
            stamps.append((_name + " >", time.perf_counter()))
            out = _f(*args, **kw)
            stamps.append((_name + " <", time.perf_counter()))
            return out

        setattr(mod, name, g)


class _FirstCall(Exception):
    """Raised by the stubbed C call to end a step at the library's first call."""


def prologue(N, compiled=False, reps=300):
    """--prologue: the pair block's forward up to its first C call (the part a step started from
    an idle GPU waits for), median us from the step's start to the entry and exit of each piece,
    then one multiplicative-update call through its op against its implementation (C call
    stubbed, median us a call). compiled: the block under torch.compile with its fused nodes, as
    from N = 640 on a GPU (the pieces traced into the graph no longer run, so only those inside
    the nodes' ops are stamped)."""
    from turbopairformer import layers
    from turbopairformer.pairformer import PairBlock

    stamps = []

    def first_call(fn, a, *args):
        stamps.append(("C call", time.perf_counter()))
        raise _FirstCall

    _calls.check_call = first_call
    stamp_pieces(stamps, compiled)
    block = PairBlock(c_z=128, c_hidden_mul=128, c_hidden_pair_att=32, no_heads_pair=4).train()
    run = block
    if compiled:
        layers.COMPILED_NODE_MIN_PAIRS = 0
        run = torch.compile(block)
    z = torch.randn(1, N, N, 128, requires_grad=True)
    pm = torch.ones(1, N, N)
    at = collections.defaultdict(list)
    clear = _grad_clearer(block)  # as the bench clears them
    for r in range(reps):
        stamps.clear()
        t0 = time.perf_counter()
        clear()
        stamps.append(("grads cleared", time.perf_counter()))
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                run(z, pm)
        except _FirstCall:
            pass
        if r >= reps // 5:
            for i, (label, t) in enumerate(stamps):
                at[(i, label)].append((t - t0) * 1e6)
    how = "compiled" if compiled else "eager"
    print(
        f"pair block forward ({how}) to its first C call, N = {N} (median us from the step's start):"
    )
    for (_, label), v in sorted(at.items()):
        print(f"  {label:18s} {statistics.median(v):8.1f}")
    _calls.check_call = lambda fn, a, *args: None
    x = torch.randn(1, N, N, 128).bfloat16()
    w = [None if n.endswith("bias") and "norm" not in n else torch.randn(s_)
         for n, s_ in zip(trimul.WEIGHTS, ([128], [128], [256, 128], None, [256, 128], None,
                                           [128], [128], [128, 128], None, [128, 128], None))]  # fmt: skip
    for label, call in (
        ("through the op", trimul._trimul_fwd),
        ("its implementation", trimul._fwd),
    ):
        times = []
        for _ in range(2000):
            t = time.perf_counter()
            call(x, pm, *w, 0, 1e-5, False)
            times.append((time.perf_counter() - t) * 1e6)
        print(f"trimul forward {label}: {statistics.median(times[200:]):.1f} us a call")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--ops", action="store_true", help="our most frequent aten ops")
    ap.add_argument(
        "--prologue",
        action="store_true",
        help="the forward's host work to its first C call, by piece",
    )
    ap.add_argument(
        "--compiled", action="store_true", help="with --prologue: the block under torch.compile"
    )
    a = ap.parse_args()
    _gpu_path()
    if a.prologue:
        return prologue(a.n, a.compiled)
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
