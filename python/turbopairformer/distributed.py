"""A pair-sharded Pairformer pair stack over torch.distributed (DAP / context-parallel style).

The pair tensor z [B, N, N, C] is split by rows over the P ranks of a process group (rank r
holds rows `shard_bounds(N, P)[r]`; N need not divide by P). Per layer:

- the starting node and the outgoing update work on the row shard; the pair bias (all rows of
  the bias projection) and the outgoing update's b projection are gathered from every rank;
- the ending node and the incoming update first transpose the shard with one all-to-all (rank
  r then holds rows r of z^T), and the ending node transposes its output back;
- the transition is per pair: local.

Every gradient that sums over ranks (the gathered bias and b) is summed in rank order from an
all-to-all of the per-rank parts, never by a reduction whose order the backend chooses, so the
gradients are bitwise reproducible. Parameter gradients stay per rank, as in data parallelism:
`reduce_gradients_in_rank_order` sums them the same way.

    block = ShardedPairBlock(tpf.PairBlock(...), group)      # the same parameters
    z_rows = block(z_rows, mask_rows)                          # this rank's rows in and out
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from .pairformer import PairBlock, _shared_dropout


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) of each rank's rows: the first n % parts ranks hold one row more."""
    sizes = [n // parts + (r < n % parts) for r in range(parts)]
    starts = [sum(sizes[:r]) for r in range(parts)]
    return [(s, s + k) for s, k in zip(starts, sizes)]


def _exchange(parts: list[torch.Tensor], shapes: list[tuple], group) -> list[torch.Tensor]:
    """all_to_all: parts[s] goes to rank s; returns what every rank q sent here (shape
    shapes[q]). Pieces are zero-padded to one shape on the way, as gloo exchanges equal sizes."""
    common = [max(d) for d in zip(*[tuple(p.shape) for p in parts], *shapes)]

    def pad(t):
        widths = []
        for have, want in zip(reversed(t.shape), reversed(common)):
            widths += [0, want - have]
        return F.pad(t, widths).contiguous()

    if dist.get_backend(group) == "nccl":
        out = [parts[0].new_empty(common) for _ in shapes]
        dist.all_to_all(out, [pad(p) for p in parts], group=group)
    else:  # gloo has no all_to_all before PyTorch 2.12: every rank's pieces, this rank's kept
        stacked = torch.stack([pad(p) for p in parts])
        every = [torch.empty_like(stacked) for _ in shapes]
        dist.all_gather(every, stacked, group=group)
        out = [e[dist.get_rank(group)] for e in every]
    return [o[tuple(slice(0, k) for k in s)] for o, s in zip(out, shapes)]


class _GatherRows(torch.autograd.Function):
    """Every rank's rows along dim 1, concatenated in rank order. Backward: each rank's gradient
    of the whole tensor is cut by rows, exchanged, and this rank's rows summed in rank order."""

    @staticmethod
    def forward(ctx, x, bounds, group):
        ctx.bounds, ctx.group = bounds, group
        rows = max(b - a for a, b in bounds)
        padded = F.pad(x, (0,) * (2 * (x.dim() - 2)) + (0, rows - x.shape[1]))
        parts = [torch.empty_like(padded) for _ in bounds]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([p[:, : b - a] for p, (a, b) in zip(parts, bounds)], dim=1)

    @staticmethod
    def backward(ctx, g):
        r = dist.get_rank(ctx.group)
        mine = ctx.bounds[r][1] - ctx.bounds[r][0]
        pieces = [g[:, a:b] for a, b in ctx.bounds]
        shape = (g.shape[0], mine) + tuple(g.shape[2:])
        got = _exchange(pieces, [shape] * len(ctx.bounds), ctx.group)
        total = got[0]
        for piece in got[1:]:  # rank order: the same bits on every run
            total = total + piece
        return total, None, None


class _TransposeShards(torch.autograd.Function):
    """Rows r of z [B, N, N, C] -> rows r of z^T, with one all-to-all. It is its own inverse on
    the sharded layout, so the backward is the same exchange."""

    @staticmethod
    def forward(ctx, x, bounds, group):
        ctx.bounds, ctx.group = bounds, group
        return _TransposeShards.apply_exchange(x, bounds, group)

    @staticmethod
    def apply_exchange(x, bounds, group):
        r = dist.get_rank(group)
        mine = bounds[r][1] - bounds[r][0]
        parts = [x[:, :, a:b] for a, b in bounds]  # to rank s: my rows, its columns
        shapes = [(x.shape[0], b - a, mine) + tuple(x.shape[3:]) for a, b in bounds]
        cols = torch.cat(_exchange(parts, shapes, group), dim=1)  # z[:, all rows, my columns]
        return cols.transpose(1, 2).contiguous()

    @staticmethod
    def backward(ctx, g):
        return _TransposeShards.apply_exchange(g, ctx.bounds, ctx.group), None, None


def _trimul_on_rows(m, z, src, src_mask, gather):
    """The multiplicative update for this rank's rows of z, in plain PyTorch on the module's
    weights: a from src's rows, b from every rank's rows of src (gathered), the output gate from
    z. src is z (outgoing) or this rank's rows of z^T (incoming, which is the outgoing product
    of the transposed pair tensor)."""
    sn = m.layer_norm_in(src)
    keep = src_mask.unsqueeze(-1).to(sn.dtype)
    a = torch.sigmoid(m.linear_a_g(sn)) * m.linear_a_p(sn) * keep
    b = gather(torch.sigmoid(m.linear_b_g(sn)) * m.linear_b_p(sn) * keep)
    x = torch.einsum("bikc,bjkc->bijc", a, b)  # [B, n_r, N, Ch]
    zn = sn if src is z else m.layer_norm_in(z)
    return torch.sigmoid(m.linear_g(zn)) * m.linear_z(m.layer_norm_out(x))


class ShardedPairBlock(nn.Module):
    """A PairBlock run on row shards of the pair tensor across `group` (see the module
    docstring). It holds the block itself, so its parameters and state_dict are the block's.
    forward(z_rows, mask_rows): this rank's rows [B, n_r, N, C] and [B, n_r, N]; returns the
    block's output rows. Training-mode dropout draws its shared masks on rank 0 and broadcasts
    them, so every rank applies the same ones."""

    def __init__(self, block: PairBlock, group: Optional[dist.ProcessGroup] = None):
        super().__init__()
        self.block = block
        self.group = group

    def _dropout(self, x, bounds, dim):
        blk = self.block
        if not blk.training or blk.pair_dropout == 0.0:
            return x
        N = bounds[-1][1]
        shape = [x.shape[0], N, N, x.shape[-1]]
        shape[dim] = 1
        keep = _shared_dropout(x.new_ones(shape), blk.pair_dropout, True, dim)
        dist.broadcast(keep, src=0, group=self.group)
        r = dist.get_rank(self.group)
        if dim == -2:  # one mask for every column: this rank's rows of it
            keep = keep[:, bounds[r][0] : bounds[r][1]]
        return x * keep

    def forward(self, z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        blk, group = self.block, self.group
        P = dist.get_world_size(group)
        N = z.shape[2]
        bounds = shard_bounds(N, P)
        if z.shape[1] != bounds[dist.get_rank(group)][1] - bounds[dist.get_rank(group)][0]:
            raise ValueError(
                f"turbopairformer: argument 'z': this rank holds {z.shape[1]} rows; "
                f"shard_bounds({N}, {P}) gives it {bounds[dist.get_rank(group)]}"
            )

        def gather(x):
            return _GatherRows.apply(x, bounds, group)

        def transpose(x):
            return _TransposeShards.apply(x, bounds, group)

        mask = mask.to(z.dtype)
        mask_t = transpose(mask.unsqueeze(-1)).squeeze(-1)
        upd = _trimul_on_rows(blk.tri_mul_out, z, z, mask, gather)
        z = z + self._dropout(upd, bounds, -3)
        upd = _trimul_on_rows(blk.tri_mul_in, z, transpose(z), mask_t, gather)
        z = z + self._dropout(upd, bounds, -3)
        upd = blk.tri_att_start.attend(z, mask, True, gather_rows=gather)
        z = z + self._dropout(upd, bounds, -3)
        upd = blk.tri_att_end.attend(transpose(z), mask_t, True, gather_rows=gather)
        z = z + self._dropout(transpose(upd), bounds, -2)
        return z + blk.pair_transition(z, mask)


def reduce_gradients_in_rank_order(module: nn.Module, group=None) -> None:
    """Sums every parameter's gradient over the ranks of `group`, in rank order (the same bits
    on every rank and every run), in place."""
    P = dist.get_world_size(group)
    for p in module.parameters():
        if p.grad is None:
            continue
        parts = [torch.empty_like(p.grad) for _ in range(P)]
        dist.all_gather(parts, p.grad.contiguous(), group=group)
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        p.grad.copy_(total)
