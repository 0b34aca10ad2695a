#!/usr/bin/env python3
"""One rank of a gloo all-reduce whose rendezvous goes through an external TCPStore.

Usage: RANK=r WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=port \
       TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 gloo_allreduce.py

With TORCHELASTIC_USE_AGENT_STORE=True, init_process_group("gloo", init_method="env://")
makes every rank, rank 0 included, a plain client of the store at MASTER_ADDR:MASTER_PORT
instead of letting rank 0 host one, so the store under test carries the whole rendezvous:

  torch 1.13  TCPStore(addr, port, world_size, False, timeout) wrapped in
              PrefixStore("/worker/attempt_<TORCHELASTIC_RESTART_COUNT>"); the variable must
              be set or rendezvous raises KeyError.
  torch 2.x   the plain TCPStore client, no attempt prefix, but only when MASTER_ADDR and
              MASTER_PORT are exactly the host and port being connected to (they are here,
              since env:// reads them from the same variables); the restart count is unused.

Both versions then add their own "default_pg" and group prefixes. The rank all-reduces a
float64 tensor [rank, 1, rank * rank], checks it against [sum of ranks, world size, sum of
squares], prints "OK rank R/N" and exits 0; any mismatch or error exits 1.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"):
        if var not in os.environ:
            sys.stderr.write("gloo_allreduce.py: %s is not set\n" % var)
            return 1
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # Without it rank 0 would try to host its own store on MASTER_PORT.
        sys.stderr.write("gloo_allreduce.py: TORCHELASTIC_USE_AGENT_STORE must be True\n")
        return 1
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])

    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=30))
    if dist.get_rank() != rank or dist.get_world_size() != world:
        sys.stderr.write("rank %d: group says rank %d of %d\n"
                         % (rank, dist.get_rank(), dist.get_world_size()))
        return 1

    t = torch.tensor([rank, 1, rank * rank], dtype=torch.float64)
    dist.all_reduce(t)
    want = torch.tensor([sum(range(world)), world, sum(r * r for r in range(world))],
                        dtype=torch.float64)
    if not torch.equal(t, want):
        sys.stderr.write("rank %d: all_reduce gave %s, want %s\n" % (rank, t.tolist(), want.tolist()))
        return 1
    dist.barrier()
    dist.destroy_process_group()
    print("OK rank %d/%d" % (rank, world), flush=True)
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
