"""On the CPU: whether a compiled, checkpointed PairformerStack with our fused nodes inside its
checkpoints recomputes its blocks one at a time in the backward, or all of them first (so that
every block's saved sets live at once: the 27.5 GiB of a 4-block stack at N = 768 on the H200,
docs/perf-notes.md, fifteenth and eighteenth sessions).

The library's C calls are stubbed (no arithmetic; the order of the calls is what is read), the
multiplicative update's saved set is given its CUDA size, and --transition fused routes the pair
transition to its custom op as on an sm_90 GPU (on the CPU it composes). Prints the C calls of
one backward in order and how many blocks' recomputed forwards were alive at once.
Usage: TPF_LIBRARY=... PYTHONPATH=python python dev/scripts/cpu_checkpoint_order.py
       [--transition composed|fused] [--boundary] [--backend inductor|aot_eager] [--n 32]
       [--blocks 3]
--boundary: each checkpoint's z through a copying custom op (the fix candidate: the partitioner
saves it, where it recomputes a getitem of the transition's tuple)."""

import argparse

import torch
from torch.utils.checkpoint import checkpoint
from turbopairformer import _calls, _native, _norm, _transition, layers, trimul
from turbopairformer import pairformer as pf

CALLS = []


def _record(fn, a, *args):
    CALLS.append(fn.__name__)


def _saved_buffer(x, p_in_weight, save):
    """trimul._saved_buffer with the CUDA path's size on any device."""
    n = 0
    if save and p_in_weight is not None and x.dim() == 4:
        B, N, _, C = x.shape
        n = int(_native.LIB.tpf_trimul_saved_size(B, N, C, p_in_weight.shape[0] // 2))
    return torch.empty(n, dtype=torch.uint8, device=x.device)


@torch.library.custom_op("tpfdev::boundary", mutates_args=())
def boundary(x: torch.Tensor) -> torch.Tensor:
    """A copy of x that the partitioner saves at a checkpoint's end: the block's last node (the
    transition's custom op) returns a tuple, and a getitem there is recomputed, not saved (a plain
    clone is removed by inductor, a view recomputed)."""
    return x.clone()


@boundary.register_fake
def _(x):
    return torch.empty_like(x)


boundary.register_autograd(lambda ctx, g: g)


def stack_forward(use_boundary):
    """PairformerStack.forward with the nodes inside its checkpoints (the shipped forward composes
    there under compile), each checkpoint's z through boundary() where use_boundary."""

    def forward(self, s, z, single_mask, pair_mask):
        def run(first, last, s, z):
            for block in self.blocks[first:last]:
                s, z = block(s, z, single_mask, pair_mask)
            return s, (boundary(z) if use_boundary else z)

        for first in range(0, len(self.blocks), self.blocks_per_ckpt):
            s, z = checkpoint(run, first, first + self.blocks_per_ckpt, s, z, use_reentrant=False)
        return s, z

    return forward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transition", choices=("composed", "fused"), default="fused")
    ap.add_argument("--boundary", action="store_true")
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=3)
    a = ap.parse_args()
    _calls.check_call = _record
    trimul._saved_buffer = _saved_buffer
    if a.transition == "fused":
        _transition.supported = lambda *args, **kw: True
        _norm.gpu_supported = lambda *args, **kw: True
    layers.COMPILED_NODE_MIN_PAIRS = 0
    pf.PairformerStack.forward = stack_forward(a.boundary)
    torch.manual_seed(0)
    N = a.n
    s, z = torch.randn(1, N, 384), torch.randn(1, N, N, 128)
    sm = torch.ones(1, N)
    pm = sm[:, :, None] * sm[:, None, :]
    stack = pf.PairformerStack(no_blocks=a.blocks, blocks_per_ckpt=1).train()
    fn = torch.compile(stack, backend=a.backend)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        so, zo = fn(s, z, sm, pm)
    loss = so.float().square().mean() + zo.float().square().mean()
    CALLS.clear()
    loss.backward()
    live = most = 0
    for name in CALLS:  # two multiplicative updates a block, forward then backward
        live += name == "tpf_trimul_forward"
        live -= name == "tpf_trimul_backward"
        most = max(most, live)
    print(" ".join(n.removeprefix("tpf_") for n in CALLS))
    print(
        f"transition {a.transition}, boundary {'on' if a.boundary else 'off'}, {a.backend}: "
        f"recomputed blocks alive at once in the backward: {most // 2} of {a.blocks}"
    )


if __name__ == "__main__":
    main()
