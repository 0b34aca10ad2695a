"""torch.save and torch.distributed.checkpoint of the tensors ckpt-bench saves, timed the same way.

Run under ddprun (or torchrun) by bench/ckpt/compare.sh. Each rank holds what a ZeRO-sharded
rank owns of ddp-train's MLP with AdamW: its 1/WORLD slice of every parameter and of both
moments, three float32 arrays of the parameters' size in all. Measured, rank 0's times after a
barrier, best of --reps:
  torch_save    each rank torch.save()s its tensors to its own file, then fsyncs it
  torch_load    each rank torch.load()s its file
  dcp_save      torch.distributed.checkpoint.save() of the same state dict (the keys name the
                rank, so nothing is deduplicated), fsynced by dcp's own file writer
  dcp_load      torch.distributed.checkpoint.load() into preallocated tensors
Prints one JSON line (rank 0).
"""

import argparse
import json
import os
import shutil
import time

import torch
import torch.distributed as dist


def shapes(hidden, layers):
    dims = [784] + [hidden] * layers + [10]
    out = []
    for i in range(len(dims) - 1):
        out.append((f"fc{i + 1}.weight", dims[i + 1] * dims[i]))
        out.append((f"fc{i + 1}.bias", dims[i + 1]))
    return out


def timed(fn, reps):
    best = float("inf")
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    state = {}
    params = 0
    for name, n in shapes(a.hidden, a.layers):
        params += n
        part = (n + world - 1) // world
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            state[f"{name}.{kind}.rank{rank}"] = torch.rand(max(0, min(part, n - rank * part)))
    mb = 3 * params * 4 / 1e6
    tdir = os.path.join(a.dir, "torch")
    os.makedirs(tdir, exist_ok=True)
    path = os.path.join(tdir, f"rank{rank}.pt")

    def save():
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    res = {"world": world, "hidden": a.hidden, "layers": a.layers, "params": params, "mb": mb,
           "torch": torch.__version__}
    res["torch_save_ms"] = timed(save, a.reps)
    res["torch_load_ms"] = timed(lambda: torch.load(path), a.reps)

    try:
        import torch.distributed.checkpoint as dcp
        have_dcp = hasattr(dcp, "save") and hasattr(dcp, "load")
    except ImportError:
        have_dcp = False
    if have_dcp:
        ddir = os.path.join(a.dir, "dcp")

        def dsave():
            if rank == 0:
                shutil.rmtree(ddir, ignore_errors=True)
            dist.barrier()
            dcp.save(state, checkpoint_id=ddir)

        res["dcp_save_ms"] = timed(dsave, a.reps)
        target = {k: torch.empty_like(v) for k, v in state.items()}
        res["dcp_load_ms"] = timed(lambda: dcp.load(target, checkpoint_id=ddir), a.reps)
    for k in list(res):
        if k.endswith("_ms"):
            res[k[:-3] + "_mbps"] = mb / (res[k] / 1e3)
    if rank == 0:
        print(json.dumps(res), flush=True)
    dist.barrier()
    # Leave without gloo's finalization, which aborts under torch 2.x on some exits
    # ("terminate called without an active exception"), as the project's gloo tests do.
    os._exit(0)


if __name__ == "__main__":
    main()
