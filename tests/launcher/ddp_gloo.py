#!/usr/bin/env python3
"""A plain PyTorch DDP training script, written as users write them for torchrun.

    torchrun --nproc-per-node 4 ddp_gloo.py [--steps N]
    ddprun   --nproc-per-node 4 ddp_gloo.py [--steps N]

Gloo backend, init_process_group("gloo", init_method="env://") from the launcher's RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT, a tiny model wrapped in DistributedDataParallel,
a few SGD steps on random data that differs per rank (fixed seeds, so runs repeat). DDP
averages the gradients, so the parameters must end up bit-identical on every rank; the script
checks that with an all_gather and prints "DDP OK rank R", or exits 1. Works with torch 1.13
and 2.x, CPU only.
"""
import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    world = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    if world != int(os.environ["WORLD_SIZE"]) or rank != int(os.environ["RANK"]):
        print(f"rank {rank}: process group says rank {rank} of {world}, environment says "
              f"RANK={os.environ['RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']}", file=sys.stderr)
        return 1

    torch.set_num_threads(1)
    torch.manual_seed(1234)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.MSELoss()

    gen = torch.Generator().manual_seed(1000 + rank)  # different data on every rank
    for _ in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    bad = [r for r in range(world) if not torch.equal(gathered[r], gathered[0])]
    # A second, independent look: the spread of each parameter across ranks must be zero.
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    spread = (hi - lo).abs().max().item()
    dist.barrier()
    dist.destroy_process_group()
    if bad or spread != 0.0:
        print(f"DDP MISMATCH rank {rank}: ranks {bad} differ from rank 0, spread {spread}",
              file=sys.stderr)
        return 1
    print(f"DDP OK rank {rank} (local rank {local_rank}, world {world}, loss {loss.item():.4f})",
          flush=True)
    return 0


if __name__ == "__main__":
    # torch 2.x's gloo can abort in the interpreter's finalization ("terminate called without an
    # active exception", SIGABRT), after destroy_process_group() and after the rank has reported:
    # a torch bug (pytorch/pytorch#179291), not the launcher's. The rank's work is done and its
    # output flushed, so it leaves without finalization.
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
