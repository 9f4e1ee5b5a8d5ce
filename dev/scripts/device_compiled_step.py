"""On the GPU machine: where our modules' fused nodes should run under torch.compile.

For each N, in one process and against the plain-PyTorch block compiled in the same run, times
(median CUDA-event ms) our block's step, its pair stack's, and a 4-block stack's AdamW step
(one block per checkpoint), eager and compiled, with the fused nodes switched by
layers.COMPILED_NODE_MIN_PAIRS ("composed": never, "nodes": always, "default": the shipped
threshold) and, for the stack, with the nodes also inside the compiled checkpoints ("nodes+ckpt").
Each compiled case also reports dynamo's graph count and graph breaks, the stack's peak memory,
and the CUDA kernel time of one step (torch.profiler), so that a wall time above the kernel time
reads as host-bound.
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 dev/scripts/device_compiled_step.py
       [--n 256,512] [--cases block,pair,stack] [--budget 540]"""

import argparse
import time

import torch
import torch._dynamo
from turbopairformer import layers
from turbopairformer import pairformer as pf
from turbopairformer.bench_pairformer import (
    _inputs,
    _loss,
    _median_ms,
    _pair_step,
    block_step,
    profiled,
)
from turbopairformer.reference import OpenFold3PairFormerBlock, OpenFold3PairFormerStack

DEFAULT_MIN = layers.COMPILED_NODE_MIN_PAIRS
VARIANTS = {"composed": 1 << 62, "nodes": 0, "default": DEFAULT_MIN}


def kernel_ms(step, reps=2):
    prof = profiled(step, reps, warmups=1)
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return total / 1e3 / reps


def stack_step(stack, fn, s, z, sm, pm):
    opt = torch.optim.AdamW(stack.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            so, zo = fn(s, z, sm, pm)
        _loss(so, zo, sm, pm).backward()
        opt.step()

    return step


SHIPPED_STACK_FORWARD = pf.PairformerStack.forward


def forward_nodes_in_checkpoints(self, s, z, single_mask, pair_mask):
    """PairformerStack.forward without its switch to the composed ops inside compiled checkpoints."""
    from torch.utils.checkpoint import checkpoint

    def run(first, last, s, z):
        for block in self.blocks[first:last]:
            s, z = block(s, z, single_mask, pair_mask)
        return s, z

    for first in range(0, len(self.blocks), self.blocks_per_ckpt):
        s, z = checkpoint(run, first, first + self.blocks_per_ckpt, s, z, use_reentrant=False)
    return s, z


def case(label, make_step, compiled):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step = make_step()
    torch.cuda.synchronize()
    t0 = time.monotonic()
    step()
    torch.cuda.synchronize()
    first = time.monotonic() - t0
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ms = _median_ms(step, 8)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    kms = kernel_ms(step)
    c = torch._dynamo.utils.counters
    graphs = c["stats"]["unique_graphs"] if compiled else 0
    breaks = sum(c["graph_break"].values()) if compiled else 0
    print(
        f"{label:34s} {ms:8.2f} ms  kernels {kms:7.2f} ms  peak {peak:6.2f} GiB  "
        f"graphs {graphs:3d} breaks {breaks:3d}  first {first:5.1f} s",
        flush=True,
    )
    if breaks:
        for k, v in list(c["graph_break"].items())[:3]:
            print(f"    break x{v}: {k[:160]}")
    return ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="256,512")
    ap.add_argument("--cases", default="block,pair,stack")
    ap.add_argument("--budget", type=float, default=540.0)
    a = ap.parse_args()
    t_start = time.monotonic()
    torch.manual_seed(0)
    weights = {k: v.cuda() for k, v in OpenFold3PairFormerBlock().state_dict().items()}
    cases = a.cases.split(",")
    for N in [int(n) for n in a.n.split(",")]:
        run_n(N, weights, cases, lambda: time.monotonic() - t_start > a.budget, a.budget)


def run_n(N, weights, cases, over, budget):
    s0, z0, sm, pm = _inputs(N)
    print(f"== N = {N}", flush=True)

    def leaves():
        return s0.detach().requires_grad_(True), z0.detach().requires_grad_(True)

    def block(cls):
        b = cls().cuda()
        b.load_state_dict(weights)
        return b.train()

    def block_case(cls, compiled):
        def make():
            b = block(cls)
            s, z = leaves()
            return block_step(b, torch.compile(b) if compiled else b, s, z, sm, pm)

        return make

    def pair_case(cls, compiled):
        def make():
            p = block(cls).pair_stack
            _, z = leaves()
            return _pair_step(torch.compile(p) if compiled else p, z, pm)

        return make

    def stack_case(cls, compiled):
        def make():
            st = cls(no_blocks=4, blocks_per_ckpt=1).cuda()
            for blk in st.blocks:
                blk.load_state_dict(weights)
            return stack_step(st, torch.compile(st) if compiled else st, s0, z0, sm, pm)

        return make

    plan = []
    for kind, maker in (("block", block_case), ("pair", pair_case), ("stack", stack_case)):
        if kind not in cases:
            continue
        ref = OpenFold3PairFormerBlock if kind != "stack" else OpenFold3PairFormerStack
        ours = pf.PairformerBlock if kind != "stack" else pf.PairformerStack
        plan.append((f"{kind} pytorch compile", maker(ref, True), True, None, False))
        plan.append((f"{kind} ours eager", maker(ours, False), False, None, False))
        # inside the stack's checkpoints the shipped forward always composes
        variants = ("composed", "nodes+ckpt") if kind == "stack" else ("composed", "nodes")
        for v in variants:
            plan.append(
                (f"{kind} ours compile {v}", maker(ours, True), True, v.split("+")[0], "+" in v)
            )
    for label, make, compiled, variant, ckpt in plan:
        if over():
            print(f"{label:34s} skipped: --budget {budget:.0f} s reached", flush=True)
            continue
        layers.COMPILED_NODE_MIN_PAIRS = VARIANTS[variant or "default"]
        pf.PairformerStack.forward = forward_nodes_in_checkpoints if ckpt else SHIPPED_STACK_FORWARD
        try:
            case(label, make, compiled)
        except Exception as e:  # noqa: BLE001  # an out-of-memory case is a result, not the end of the call
            print(f"{label:34s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        finally:
            layers.COMPILED_NODE_MIN_PAIRS = DEFAULT_MIN
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
