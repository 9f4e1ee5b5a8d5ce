"""On the GPU machine: where one Pairformer block's training step goes, by part and by kernel.

Times (median CUDA-event ms of forward + backward, eager, bf16 autocast, training mode, the
bench's loss) the whole block, the pair stack alone and the single track alone (attention with
pair bias and the single transition on a fixed z that takes gradients), then lists each one's
kernels (torch.profiler CUDA time per step, grouped by name).
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 dev/scripts/device_block_kernels.py
       [--n 768] [--top 25] [--parts block,pair,single] [--cpu] [--gaps]
--cpu: also each part's host side (torch.profiler CPU self time per op, a cProfile of the Python,
and the host's time to issue a step: steps launched back to back without a synchronize).
--gaps: the GPU's idle time between kernels inside a step, and the largest gaps."""

import argparse
import time

import torch
from turbopairformer.bench_pairformer import (
    _inputs,
    _kernel_ms,
    _median_ms,
    _pair_step,
    block_step,
    profiled,
)
from turbopairformer.pairformer import PairformerBlock
from turbopairformer.reference import OpenFold3PairFormerBlock


def steps(block, s, z, sm, pm):
    s, z = s.detach().requires_grad_(True), z.detach().requires_grad_(True)

    def single():
        block.zero_grad(set_to_none=True)
        s.grad = z.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            so = s + block.attn_pair_bias(s, z, sm)
            so = so + block.single_transition(so, sm)
        (so.float() * sm[..., None]).square().mean().backward()

    return {
        "block": block_step(block, block, s, z, sm, pm),
        "pair": _pair_step(block.pair_stack, z, pm),
        "single": single,
    }


def host_rows(step, reps=3):
    """The host's ops by self CPU time per step (ms) and calls per step."""
    prof = profiled(step, reps, warmups=2, cpu=True)
    rows = [(e.key, e.self_cpu_time_total / 1e3 / reps, e.count / reps) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])


def python_profile(step, top, reps=3):
    """cProfile of `reps` steps: the Python functions by their own time."""
    import cProfile
    import pstats

    step()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(top)


def gaps(step, top, reps=3):
    """The GPU's idle time inside a step: the gaps between one kernel's end and the next one's
    start (kernels in launch order on any stream), summed, and the largest with the kernel after."""
    prof = profiled(step, reps, warmups=2)
    ks = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
    )
    end, total, big = ks[0][1], 0.0, []
    for start, stop, name in ks[1:]:
        if start > end:
            total += start - end
            big.append((start - end, name))
        end = max(end, stop)
    big.sort(key=lambda r: -r[0])
    span = (ks[-1][1] - ks[0][0]) / reps / 1e3
    print(f"-- GPU span {span:.2f} ms a step, idle between kernels {total / reps / 1e3:.2f} ms a step")
    for us, name in big[:top]:
        print(f"  gap {us:8.1f} us before {name[:100]}")


def issue_ms(step, reps=5):
    """Host time to issue one step, steps back to back (the GPU's backlog grows when it is faster)."""
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e3 / reps, (time.perf_counter() - t1) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--parts", default="block,pair,single")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--gaps", action="store_true", help="the GPU's idle time between kernels")
    a = ap.parse_args()
    torch.manual_seed(0)
    weights = OpenFold3PairFormerBlock().state_dict()
    block = PairformerBlock().cuda().train()
    block.load_state_dict(weights)
    fns = steps(block, *_inputs(a.n))
    summary = []
    for part in a.parts.split(","):
        ms = _median_ms(fns[part], 10)
        ours, rest, rows = _kernel_ms(fns[part])
        total = ours + rest
        summary.append((part, ms, total, ours))
        print(f"== {part} N={a.n}: {ms:.2f} ms a step; kernels {total:.2f} ms (ours {ours:.2f})")
        for name, t, calls in rows[: a.top]:
            print(f"  {t:7.3f} ms {calls:4.0f}x  {name[:110]}")
        if a.cpu:
            issue, tail = issue_ms(fns[part])
            print(f"-- {part} host: {issue:.2f} ms to issue a step, then {tail:.2f} ms of GPU backlog")
            for name, t, calls in host_rows(fns[part])[: a.top]:
                print(f"  {t:7.3f} ms {calls:5.0f}x  {name[:100]}")
            python_profile(fns[part], a.top)
        if a.gaps:
            gaps(fns[part], a.top)
    print("\npart     step ms  kernel ms  ours ms")
    for part, ms, total, ours in summary:
        print(f"{part:8s} {ms:7.2f}  {total:9.2f}  {ours:7.2f}")


if __name__ == "__main__":
    main()
