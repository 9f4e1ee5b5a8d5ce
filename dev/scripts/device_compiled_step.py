"""On the GPU machine: where the small-N training step's time goes, and what takes it back.

For each N, in one process, times (median CUDA-event ms) a block's step, its pair stack's and a
4-block stack's AdamW step (one block per checkpoint), ours and the plain-PyTorch reference, in
variants (--variants): eager; torch.compile with our fused nodes switched by
layers.COMPILED_NODE_MIN_PAIRS ("composed": never, "nodes": always) and, for the stack, with the
nodes inside the compiled checkpoints too ("nodes+ckpt"); torch.compile(mode="reduce-overhead")
("compile-ro", CUDA graphs by inductor); and the eager step captured whole in one CUDA graph
("graph": PyTorch's whole-network capture, autocast without its cast cache, a capturable AdamW).
Each case also reports the CUDA kernel time of one step (torch.profiler: a wall time above it
reads as host-bound), the peak memory (a graph's from its capture on), and under compile
dynamo's graph count and graph breaks.
Usage: TPF_LIBRARY=... PYTHONPATH=python python3 dev/scripts/device_compiled_step.py
       [--n 256,512] [--cases block,pair,stack] [--variants V,...] [--budget 540]"""

import argparse
import functools
import time

import torch
import torch._dynamo
from cpu_checkpoint_order import stack_forward  # dev/scripts: the nodes inside checkpoints
from turbopairformer import layers
from turbopairformer import pairformer as pf
from turbopairformer.bench_pairformer import (
    _inputs,
    _loss,
    _median_ms,
    profiled,
    run_as,
)
from turbopairformer.reference import OpenFold3PairFormerBlock, OpenFold3PairFormerStack

DEFAULT_MIN = layers.COMPILED_NODE_MIN_PAIRS
VARIANTS = {"composed": 1 << 62, "nodes": 0, "default": DEFAULT_MIN}


def kernel_ms(step, reps=2):
    prof = profiled(step, reps, warmups=1)
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return total / 1e3 / reps


def stack_step(stack, fn, s, z, sm, pm, graph=False):
    # a captured step needs the optimizer's state on the GPU and no autocast cast cache
    opt = torch.optim.AdamW(stack.parameters(), lr=1e-4, capturable=graph)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not graph):
            so, zo = fn(s, z, sm, pm)
        _loss(so, zo, sm, pm).backward()
        opt.step()

    return step


SHIPPED_STACK_FORWARD = pf.PairformerStack.forward


def captured(step):
    """The whole step as one CUDA graph (PyTorch's whole-network capture: warm-up on a side
    stream, then capture); returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def case(label, make_step, compiled, graph=False):
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
    if graph:  # the graph's pool counts from its capture on
        step = captured(step)
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
    ap.add_argument("--cases", default="block,pair,stack", help="what each variant times")
    ap.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help=f"from: {', '.join(VARIANT_TABLE)}"
    )
    ap.add_argument("--budget", type=float, default=540.0)
    a = ap.parse_args()
    t_start = time.monotonic()
    torch.manual_seed(0)
    weights = {k: v.cuda() for k, v in OpenFold3PairFormerBlock().state_dict().items()}
    variants = a.variants.split(",")
    unknown = [v for v in variants if v not in VARIANT_TABLE]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {list(VARIANT_TABLE)}")

    def over():
        return time.monotonic() - t_start > a.budget

    for N in [int(n) for n in a.n.split(",")]:
        run_n(N, weights, a.cases.split(","), variants, over, a.budget)


# variant -> (backend, how, COMPILED_NODE_MIN_PAIRS, nodes inside the stack's checkpoints)
VARIANT_TABLE = {
    "pytorch compile": ("pytorch", "compile", "default", False),
    "pytorch compile-ro": ("pytorch", "compile-ro", "default", False),
    "pytorch graph": ("pytorch", "graph", "default", False),
    "ours eager": ("ours", "eager", "default", False),
    "ours compile composed": ("ours", "compile", "composed", False),
    "ours compile nodes": ("ours", "compile", "nodes", False),
    "ours compile nodes+ckpt": ("ours", "compile", "nodes", True),
    "ours compile nodes+ckpt+boundary": ("ours", "compile", "nodes", "boundary"),
    "ours compile-ro": ("ours", "compile-ro", "default", False),
    "ours compile-ro nodes": ("ours", "compile-ro", "nodes", False),
    "ours graph": ("ours", "graph", "default", False),
}
DEFAULT_VARIANTS = (
    "pytorch compile,ours eager,ours compile composed,ours compile nodes,ours compile nodes+ckpt,"
    "ours compile nodes+ckpt+boundary"
)


def wrap(module, how):
    """The module as the step runs it: the bench's modes (eager, compile, compile-ro: CUDA graphs
    by inductor); "graph" runs it eagerly and case() captures the whole step."""
    return module if how == "graph" else run_as(module, how)


def run_n(N, weights, kinds, variants, over, budget):
    s0, z0, sm, pm = _inputs(N)
    print(f"== N = {N}", flush=True)

    def leaves():
        return s0.detach().requires_grad_(True), z0.detach().requires_grad_(True)

    def block(backend):
        b = (pf.PairformerBlock if backend == "ours" else OpenFold3PairFormerBlock)().cuda()
        b.load_state_dict(weights)
        return b.train()

    def make(kind, backend, how):
        graph = how == "graph"
        if kind == "stack":
            cls = pf.PairformerStack if backend == "ours" else OpenFold3PairFormerStack
            st = cls(no_blocks=4, blocks_per_ckpt=1).cuda()
            for blk in st.blocks:
                blk.load_state_dict(weights)
            return stack_step(st, wrap(st, how), s0, z0, sm, pm, graph)
        b = block(backend)
        s, z = leaves()
        mod = b if kind == "block" else b.pair_stack
        fn = wrap(mod, how)

        def step():
            mod.zero_grad(set_to_none=True)
            s.grad = z.grad = None
            # a captured step must not use autocast's cast cache
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not graph):
                if kind == "block":
                    loss = _loss(*fn(s, z, sm, pm), sm, pm)
                else:
                    loss = (fn(z, pm).float() * pm[..., None]).square().mean()
            loss.backward()

        return step

    for kind in kinds:
        for v in variants:
            if kind != "stack" and "+ckpt" in v:
                continue
            label = f"{kind} {v}"
            if over():
                print(f"{label:34s} skipped: --budget {budget:.0f} s reached", flush=True)
                continue
            backend, how, threshold, ckpt = VARIANT_TABLE[v]
            layers.COMPILED_NODE_MIN_PAIRS = VARIANTS[threshold]
            pf.PairformerStack.forward = (
                stack_forward(ckpt == "boundary") if ckpt else SHIPPED_STACK_FORWARD
            )
            try:
                compiled = how.startswith("compile")
                case(label, functools.partial(make, kind, backend, how), compiled, how == "graph")
            except Exception as e:  # noqa: BLE001 - a failing variant is a result
                print(f"{label:34s} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            finally:
                layers.COMPILED_NODE_MIN_PAIRS = DEFAULT_MIN
                pf.PairformerStack.forward = SHIPPED_STACK_FORWARD
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
