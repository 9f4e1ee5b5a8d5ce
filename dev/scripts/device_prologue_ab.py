"""On the GPU machine: which host work before a pair-track step's first long kernel costs its
from-idle time, by variants of that work swapped in one process and timed in alternating rounds.

The pair track timed from an idle GPU (the Pairformer issue's measure) carries the host's
prologue before the first multiplicative update's kernels (1.4 ms eager, 1.7 compiled on an
H100: bench/results/h100/pair_host_timeline.txt); queued back to back it does not. Each variant
replaces one piece of that prologue with a cheaper equivalent, for timing only:
  base          the shipped modules, the bench's step (module.zero_grad walks the module tree)
  flat-zero     the step sets a precomputed parameter list's grads to None
  one-cat       the multiplicative update's p_in and g_in weights from one concatenation, split
  bernoulli     the dropout masks as empty().bernoulli_(1 - p).div_(1 - p) (another RNG stream)
  all           the three together
Prints per mode and variant the median from-idle and queued ms over the rounds (each variant
compiled afresh under compile).
Usage: TPF_LIBRARY=... PYTHONPATH=python:dev/scripts python3 dev/scripts/device_prologue_ab.py
       [--n 768] [--modes eager,compile] [--rounds 3] [--variants base,flat-zero,...]"""

import argparse
import collections
import contextlib
import statistics
from types import SimpleNamespace

import torch
import torch._dynamo
from device_gpu_gaps import CONFIG  # dev/scripts: the Pairformer's pair-block configuration
from turbopairformer import modules, pairformer
from turbopairformer.bench_pairformer import _inputs, _median_ms, _queued_ms, run_as
from turbopairformer.layers import _compute_dtype
from turbopairformer.pairformer import PairBlock

SHIPPED_PACKED, SHIPPED_DROPOUT = modules.packed_weights, pairformer._dropout_scale


def one_cat(m) -> dict:
    """packed_weights(m) with p_in and g_in split from one concatenation (the Pairformer's
    multiplicative updates have no projection biases)."""
    ins = (m.linear_a_p, m.linear_b_p, m.linear_a_g, m.linear_b_g)
    assert all(lin.bias is None for lin in ins)
    none = SimpleNamespace(weight=None, bias=None)  # packed_weights skips absent weights
    rest = SHIPPED_PACKED(
        SimpleNamespace(
            **{
                **vars(m)["_modules"],
                "linear_a_p": none,
                "linear_b_p": none,
                "linear_a_g": none,
                "linear_b_g": none,
            }
        )
    )
    p_in, g_in = torch.cat([lin.weight for lin in ins]).split(2 * m.c_hidden)  # [2 Ch, C] each
    return dict(rest, p_in_weight=p_in, g_in_weight=g_in)


def bernoulli(z, p, training, dim):
    if not training or p == 0.0:
        return None
    shape = list(z.shape)
    shape[dim] = 1
    return (
        torch.empty(shape, dtype=_compute_dtype(z), device=z.device).bernoulli_(1 - p).div_(1 - p)
    )


@contextlib.contextmanager
def variant(name):
    """The variant's module-level swaps for the duration of its rounds."""
    if name in ("one-cat", "all"):
        modules.packed_weights = one_cat
    if name in ("bernoulli", "all"):
        pairformer._dropout_scale = bernoulli
    try:
        yield name in ("flat-zero", "all")
    finally:
        modules.packed_weights, pairformer._dropout_scale = SHIPPED_PACKED, SHIPPED_DROPOUT


def make_step(blk, fn, z, pm, flat):
    params = list(blk.parameters())

    def step():
        if flat:
            for p in params:
                p.grad = None
        else:
            blk.zero_grad(set_to_none=True)
        z.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(z, pm)
        (out.float() * pm[..., None]).square().mean().backward()  # the bench's pair-track loss

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="base,flat-zero,one-cat,bernoulli,all")
    args = ap.parse_args()
    torch.manual_seed(0)
    blk = PairBlock(**CONFIG).cuda().train()
    _, z, _, pm = _inputs(args.n)
    z = z.requires_grad_(True)
    times = collections.defaultdict(list)
    for r in range(args.rounds):
        for mode in args.modes.split(","):
            for name in args.variants.split(","):
                with variant(name) as flat:
                    torch._dynamo.reset()
                    step = make_step(blk, run_as(blk, mode), z, pm, flat)
                    idle, queued = _median_ms(step, 10), _queued_ms(step, 10, warmups=0)
                times[(mode, name)].append((idle, queued))
                print(
                    f"round {r} {mode} {name}: {idle:.2f} from idle, {queued:.2f} queued",
                    flush=True,
                )
    print(f"\nN = {args.n}, medians over {args.rounds} rounds (ms): from idle, queued")
    for (mode, name), v in times.items():
        idle = statistics.median(i for i, _ in v)
        queued = statistics.median(q for _, q in v)
        print(f"  {mode:8s} {name:10s} {idle:7.2f} {queued:7.2f}")


if __name__ == "__main__":
    main()
