"""Data-parallel training of a PairformerStack with PyTorch's DistributedDataParallel.

    python examples/train_ddp.py --nprocs 2                       # GPUs (NCCL), one per process
    python examples/train_ddp.py --nprocs 2 --device cpu          # CPU (gloo), FP64 reference path
    torchrun --nproc-per-node 2 examples/train_ddp.py              # the same under torchrun
    python examples/train_ddp.py --nprocs 1 --accumulate 2        # one process, two micro-batches

Each process takes its own crops (one per rank and step, from a seeded generator), runs forward
and backward, DDP averages the gradients, and AdamW steps. Our kernels' gradients are bitwise
deterministic, so two runs from the same seed end with bitwise-identical parameters; with
--accumulate K on one process the losses match K ranks up to the fp32 (here fp64) summation
order. --out FILE saves the final parameters and the per-step losses.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import turbopairformer as tpf

SMALL = dict(
    c_s=16,
    c_z=16,
    c_hidden_pair_bias=8,
    no_heads_pair_bias=2,
    c_hidden_mul=16,
    c_hidden_pair_att=8,
    no_heads_pair=2,
    transition_n=2,
    pair_dropout=0.0,
)


def crop(step: int, sample: int, N: int, device, dtype, config):
    """One training crop: s, z, masks (the last tokens padded) and a target for z."""
    g = torch.Generator().manual_seed(1000 * step + sample)
    s = torch.randn(1, N, config["c_s"], generator=g, dtype=torch.float64)
    z = torch.randn(1, N, N, config["c_z"], generator=g, dtype=torch.float64)
    target = torch.randn(z.shape, generator=g, dtype=torch.float64)
    tok = torch.ones(1, N, dtype=torch.float64)
    tok[:, N - N // 8 :] = 0
    pm = tok[:, :, None] * tok[:, None, :]
    return [t.to(device, dtype) for t in (s, z, tok, pm, target)]


def loss_of(model, s, z, tok, pm, target, autocast: bool):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        so, zo = model(s, z, tok, pm)
    pair = ((zo.float() - target) * pm[..., None]).square().sum() / pm.sum()
    return pair + (so.float() * tok[..., None]).square().sum() / tok.sum()


def train(rank: int, world: int, args) -> None:
    cpu = args.device == "cpu"
    if world > 1:
        dist.init_process_group("gloo" if cpu else "nccl", rank=rank, world_size=world)
    device = torch.device("cpu" if cpu else f"cuda:{rank % max(1, torch.cuda.device_count())}")
    if not cpu:
        torch.cuda.set_device(device)
    dtype = torch.float64 if cpu else torch.float32
    config = SMALL if args.small else dict(c_s=384, c_z=128, pair_dropout=0.0)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = tpf.PairformerStack(no_blocks=args.blocks, blocks_per_ckpt=1, **config).to(
        device, dtype
    )
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        samples = [rank] if world > 1 else list(range(args.accumulate))
        for sample in samples:
            batch = crop(step, sample, args.n, device, dtype, config)
            loss = loss_of(ddp, *batch, autocast=not cpu) / len(samples)
            loss.backward()
            total += loss.item()
        if world > 1:  # the mean over ranks, for the log
            t = torch.tensor([total], dtype=torch.float64, device=device)
            dist.all_reduce(t)
            total = t.item() / world
        losses.append(total)
        opt.step()
        if rank == 0:
            print(f"step {step}: loss {total:.10f}", flush=True)
    if rank == 0 and args.out:
        torch.save(
            {
                "losses": losses,
                "params": {n: p.detach().cpu() for n, p in model.named_parameters()},
            },
            args.out,
        )
    if world > 1:
        dist.destroy_process_group()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nprocs", type=int, default=None, help="processes to spawn (default: GPUs)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--n", type=int, default=64, help="crop size (tokens)")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--accumulate", type=int, default=1, help="micro-batches per step (one process)"
    )
    ap.add_argument("--small", action="store_true", help="tiny channel widths (tests, CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=29512)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA GPU here: use --device cpu")
    if "RANK" in os.environ:  # torchrun
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    world = args.nprocs or (torch.cuda.device_count() if args.device == "cuda" else 2)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    if world == 1:
        train(0, 1, args)
    else:
        mp.spawn(train, args=(world, args), nprocs=world)


if __name__ == "__main__":
    main()
