"""A gloo job that fails on its first attempt after the process group is up (rank 1 exits 5),
so the restarted attempt must form a new process group on the same launcher store."""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if attempt == 0 and rank == 1:
    sys.exit(5)
if attempt == 0:
    dist.barrier()  # rank 1 is gone: blocks until ddprun stops this rank
n = dist.get_world_size()
assert t.item() == n * (n + 1) / 2, t
print(f"restart OK rank {rank} attempt {attempt}", flush=True)
dist.destroy_process_group()
# torch 2.x's gloo can abort in the interpreter's finalization ("terminate called without an
# active exception", SIGABRT), after destroy_process_group() and after the rank has reported:
# a torch bug (pytorch/pytorch#179291), not the launcher's. The rank's work is done and its
# output flushed, so it leaves without finalization.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
