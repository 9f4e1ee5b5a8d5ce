"""Worker of tests/python/test_distributed.py: P gloo processes on the CPU (FP64 reference path).

python dist_worker.py sharded P N OUT     # ShardedPairBlock: output rows and gradients
"""

import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import turbopairformer as tpf
from turbopairformer.distributed import (
    ShardedPairBlock,
    _GatherRows,
    reduce_gradients_in_rank_order,
    shard_bounds,
)

SMALL = dict(c_z=16, c_hidden_mul=8, c_hidden_pair_att=8, no_heads_pair=2, transition_n=2)


def problem(N, seed=0):
    """The block (seeded weights, non-trivial LayerNorms), z, pair mask with padded tokens, dout."""
    torch.manual_seed(seed)
    block = tpf.PairBlock(**SMALL, pair_dropout=0.0).double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64) + (p.dim() == 1))
    z = torch.randn(1, N, N, SMALL["c_z"], generator=g, dtype=torch.float64)
    tok = torch.ones(1, N, dtype=torch.float64)
    tok[:, N - max(1, N // 5) :] = 0 if N > 1 else 1
    mask = tok[:, :, None] * tok[:, None, :]
    dout = torch.randn(z.shape, generator=g, dtype=torch.float64)
    return block, z, mask, dout


def sharded(rank, P, N, out):
    # A file store, not TCP: no rank hosts the store, so none can take it away from a peer that
    # is still tearing down (with TCP rank 0's exit aborted rank 1 about one run in four here)
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=P)
    block, z, mask, dout = problem(N)
    a, b = shard_bounds(N, P)[rank]
    zr = z[:, a:b].clone().requires_grad_(True)
    y = ShardedPairBlock(block)(zr, mask[:, a:b])
    y.backward(dout[:, a:b])
    reduce_gradients_in_rank_order(block)
    bounds = shard_bounds(N, P)
    y_all = _GatherRows.apply(y.detach(), bounds, None)
    dz_all = _GatherRows.apply(zr.grad, bounds, None)
    if rank == 0:
        grads = {n: p.grad for n, p in block.named_parameters()}
        torch.save({"y": y_all, "dz": dz_all, "grads": grads}, out)
    dist.barrier()  # every rank leaves together
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, P, N, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mp.spawn({"sharded": sharded}[mode], args=(P, N, out), nprocs=P)
