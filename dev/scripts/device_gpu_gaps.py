"""On the GPU machine: where the GPU idles inside one pair-track training step, and what the host
was doing then.

A step timed from an idle GPU (bench --pairformer's pair track) exceeds the same steps queued back
to back by the GPU's idle time inside it: before the first kernel, and wherever the host falls
behind the kernels. This profiles one step (torch.profiler, CPU ops and CUDA kernels, as a
Chrome trace), merges the kernels of every stream into busy intervals, and lists each idle gap
over --min-us with the kernel after it and the host ops that enclosed that kernel's launch
(outermost first), then the idle total. Profiling adds host time per op, so the gaps read high;
their places are what counts. --host instead times the host without the profiler: when each of
a step's first C calls of the library starts (medians over steps, ms from the step's start) and
how long it takes on the host, when the host is done, and the step's CUDA-event time from an
idle GPU and queued back to back. --before instead times the host from a step's start to its
first C call, and the step's CUDA-event time, each step preceded by one of: a synchronize (sync,
the bench's from-idle step), a synchronize then 5 ms of Python busy work (spin) or of sleep
(sleep), a synchronize with the main thread pinned to one core (pinned), or nothing (queued: host
time only); --pieces adds when each piece of the forward before that call starts and ends.
--loss takes the bench's loss instead of a fixed output gradient. --modes takes the bench's modes
(eager, compile, compile-ro).
Usage: TPF_LIBRARY=... PYTHONPATH=python:dev/scripts python3 dev/scripts/device_gpu_gaps.py
       [--n 768] [--modes eager,compile] [--module pair_stack] [--min-us 20] [--host]
       [--before sync,spin,sleep,pinned,queued [--pieces]] [--loss]"""

import argparse
import collections
import contextlib
import json
import os
import statistics
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile
from turbopairformer import _calls
from turbopairformer.bench_pairformer import (
    PAIR_PARTS,
    _inputs,
    _median_ms,
    _pair_step,
    _part,
    _queued_ms,
    run_as,
)
from turbopairformer.pairformer import PairBlock
from turbopairformer.reference import OpenFold3PairBlock

CONFIG = dict(c_z=128, c_hidden_mul=128, c_hidden_pair_att=32, no_heads_pair=4, transition_n=4)


def trace(step):
    """The Chrome-trace events of one profiled step (after three warm-up steps)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        return json.load(open(f.name))["traceEvents"]


def gaps(events, min_us):
    """(idle gaps [(start us, length us, kernel after, host ops around its launch)], busy us,
    span us from the first host op to the last kernel's end)."""
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: e["ts"],
    )
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    start = min(e["ts"] for e in ops)
    out, busy, end = [], 0.0, start
    for k in kernels:
        if k["ts"] - end > min_us:
            launch = launches.get(k["args"].get("correlation"))
            t = launch["ts"] if launch else k["ts"]
            around = sorted(
                (o for o in ops if o["ts"] <= t <= o["ts"] + o["dur"]), key=lambda o: o["ts"]
            )
            out.append((end - start, k["ts"] - end, k["name"], [o["name"] for o in around]))
        busy += max(0.0, k["ts"] + k["dur"] - max(end, k["ts"]))
        end = max(end, k["ts"] + k["dur"])
    return out, busy, end - start


@contextlib.contextmanager
def c_calls_stamped(record):
    """The library's C calls time-stamped while inside: record(fn, start, end) after each, in
    perf_counter seconds; the call path restored on exit."""
    call = _calls.check_call

    def stamped(fn, a, *args):
        t = time.perf_counter()
        call(fn, a, *args)
        record(fn, t, time.perf_counter())

    _calls.check_call = stamped
    try:
        yield
    finally:
        _calls.check_call = call


def host_timeline(step, steps=10, first=8):
    """(median ms from a step's start to each of its first C calls and the call's own host ms
    [(name, start, ms)], median host ms of the whole step), the library's C calls time-stamped."""
    stamps = []
    with c_calls_stamped(lambda fn, t, done: stamps.append((fn.__name__, t, done))):
        for _ in range(3):
            step()
        at, ends = collections.defaultdict(list), []
        for _ in range(steps):
            torch.cuda.synchronize()
            stamps.clear()
            t0 = time.perf_counter()
            step()
            ends.append((time.perf_counter() - t0) * 1e3)
            for i, (name, t, done) in enumerate(stamps[:first]):
                at[(i, name)].append(((t - t0) * 1e3, (done - t) * 1e3))
    med = statistics.median
    calls = [(n, med(t for t, _ in v), med(d for _, d in v)) for (_, n), v in sorted(at.items())]
    return calls, med(ends)


def _busy(ms):
    t = time.perf_counter()
    x = 0
    while time.perf_counter() - t < ms / 1e3:
        x += 1
    return x


BEFORE = ("sync", "spin", "sleep", "pinned", "queued")  # what may precede a timed step (--before)
# (label, time.perf_counter()) of the C calls and, with --pieces, of the forward's pieces
STAMPS = []


def prologue(step, before, steps=10):
    """(median host ms from a step's start to its first C call, median CUDA-event ms of the step
    or None when queued, [(stamp, median ms from the step's start)] up to that call), each step
    preceded by `before` (see the docstring)."""
    first, pieces = STAMPS, collections.defaultdict(list)
    cpus = os.sched_getaffinity(0)
    try:
        with c_calls_stamped(lambda fn, t, done: first.append(("C call", t))):
            if before == "pinned":
                os.sched_setaffinity(0, {max(cpus)})  # this thread only; the others keep theirs
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            host, events = [], []
            for _ in range(steps):
                if before != "queued":
                    torch.cuda.synchronize()
                if before == "spin":
                    _busy(5)
                elif before == "sleep":
                    time.sleep(5e-3)
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                first.clear()
                a.record()
                t0 = time.perf_counter()
                step()
                b.record()
                upto = next(i for i, (label, _) in enumerate(first) if label == "C call")
                host.append((first[upto][1] - t0) * 1e3)
                for i, (label, t) in enumerate(first[: upto + 1]):
                    pieces[(i, label)].append((t - t0) * 1e3)
                events.append((a, b))
            torch.cuda.synchronize()
    finally:
        os.sched_setaffinity(0, cpus)
    med = statistics.median
    gpu = None if before == "queued" else med(a.elapsed_time(b) for a, b in events)
    return med(host), gpu, [(label, med(v)) for (_, label), v in sorted(pieces.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--module", default="pair_stack", choices=(*PAIR_PARTS, "pair_stack"))
    ap.add_argument("--min-us", type=float, default=20.0)
    ap.add_argument("--host", action="store_true", help="the host's timeline, no profiler")
    ap.add_argument("--before", default="", help="what precedes each timed step (docstring)")
    ap.add_argument("--loss", action="store_true", help="the bench's loss, not a fixed dz")
    ap.add_argument(
        "--pieces",
        action="store_true",
        help="with --before: when each piece of the forward before the first C call starts and "
        "ends (cpu_host_proxy.stamp_pieces; in compiled modes only those inside the custom ops)",
    )
    args = ap.parse_args()
    modes = args.modes.split(",")
    if args.pieces and "eager" in modes and len(modes) > 1:
        ap.error("--pieces: eager's stamps would break the compiled graphs; one mode a run")
    unknown = set(filter(None, args.before.split(","))) - set(BEFORE)
    if unknown:
        ap.error(f"--before: unknown {', '.join(sorted(unknown))}; choose from {', '.join(BEFORE)}")
    torch.manual_seed(0)
    weights = {n: p.detach().cuda() for n, p in OpenFold3PairBlock(**CONFIG).state_dict().items()}
    _, z, _, pm = _inputs(args.n)
    z = z.requires_grad_(True)
    dz = torch.randn_like(z) * pm[..., None]  # [B, N, N, c_z] fp32
    blk = PairBlock(**CONFIG).cuda().train()
    blk.load_state_dict(weights)
    if args.pieces:
        import cpu_host_proxy

        cpu_host_proxy.stamp_pieces(STAMPS, "eager" not in modes)
    for mode in modes:
        fn = _part(blk, args.module, False)
        step = _pair_step(run_as(fn, mode), z, pm, None if args.loss else dz)
        if args.before:
            for rnd in range(2):
                for before in args.before.split(","):
                    host, gpu, pieces = prologue(step, before)
                    ms = "" if gpu is None else f", step {gpu:.2f} ms (CUDA events)"
                    print(
                        f"{mode} {args.module} N={args.n} round {rnd} before={before}: "
                        f"first C call at {host:.3f} ms host{ms}",
                        flush=True,
                    )
                    if args.pieces:
                        print("  " + ", ".join(f"{label} {t:.3f}" for label, t in pieces))
            continue
        if args.host:
            calls, host = host_timeline(step)
            print(
                f"\n{mode} {args.module} N={args.n}: host {host:.2f} ms a step; from an idle "
                f"GPU {_median_ms(step, 10):.2f} ms, queued {_queued_ms(step, 10, warmups=0):.2f} ms"
            )
            print(
                "  C calls (start ms, own host ms): "
                + ", ".join(f"{n[4:]} {t:.3f} +{d:.3f}" for n, t, d in calls)
            )
            continue
        found, busy, span = gaps(trace(step), args.min_us)
        print(
            f"\n{mode} {args.module} N={args.n}: span {span / 1e3:.2f} ms, kernels busy "
            f"{busy / 1e3:.2f} ms, idle {(span - busy) / 1e3:.2f} ms in {len(found)} gaps "
            f"over {args.min_us:g} us"
        )
        for at, length, name, around in found:
            host = " > ".join(a[:40] for a in around[-4:])
            print(f"  at {at / 1e3:6.2f} ms idle {length:7.1f} us before {name[:60]}  [{host}]")


if __name__ == "__main__":
    main()
