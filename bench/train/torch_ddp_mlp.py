"""torch_ddp_mlp: ddp-train's job in PyTorch DDP, the anchor of bench/train.

Run it under ddprun (or torchrun) like ddp-train:

    ddprun --standalone --nproc-per-node 2 --no-prefix python3 bench/train/torch_ddp_mlp.py \\
        --epochs 2
    ddprun --standalone --nproc-per-node 1 --no-prefix python3 bench/train/torch_ddp_mlp.py \\
        --device cuda --precision bf16

It trains what ddp-train trains with its defaults (DEF_* in worker/trainer/train_options.c and
model_mlp.c), the way a torch user would write it:
  - the MLP 784-512-512-10 (--hidden, --layers), ReLU, softmax cross-entropy, torch.nn.Linear's
    default initialisation, torch.manual_seed(--seed) on every rank (DDP broadcasts rank 0's);
  - Fashion-MNIST from the same IDX .gz files (--data, default Debian's dataset-fashion-mnist
    directory), pixels x = (p / 255 - 0.2860) / 0.3530 as in worker/trainer/data.h;
  - every epoch a permutation of the training set drawn from (seed, epoch); global batch G =
    256 of consecutive permutation entries, rank r taking the r-th contiguous G / world of it
    (DistributedSampler-like, the global batch independent of the world size); the last
    incomplete global batch is dropped (60000 // 256 = 234 steps an epoch). The permutation
    differs from ddp-train's (another generator): same distribution, not the same batches;
  - AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0), linear warmup over 100 steps
    from lr/100, then cosine decay to 0 at the last step (libddp's ddp_schedule_lr);
  - DistributedDataParallel; torch.set_num_threads(1) (and one inter-op thread): one core per
    rank, as ddp-train's one OpenBLAS thread.

--device cpu (the default): the gloo process group, AdamW in torch's default implementation
(a for-loop over the tensors on the CPU).
--device cuda: rank r uses GPU LOCAL_RANK modulo the visible GPUs (torch.cuda.set_device, as
ddp-train's --device cuda); the NCCL process group when each rank of the host has a GPU of its
own, else gloo (NCCL allows one rank per GPU; ddp-train's cpu backend likewise); AdamW
fused=True where this torch has it (else its default, foreach); TF32 left off (torch's default,
ddp-train never uses it). The model and the whole training and test sets are moved to the GPU
once; the per-epoch gather and each batch's slice then run on the GPU.
--precision f32 (the default) or bf16: mixed precision by torch.autocast(device, bfloat16)
around forward and loss (on the CPU too), the parameters, optimizer state and gradients staying
f32 and DDP reducing the gradients in f32: the semantics of ddp-train's --precision bf16 with
its default --reduce-dtype f32.

Timing: samples/s = steps x G / seconds spent in training steps. Before each epoch every rank
gathers its rows of the epoch into one tensor (untimed: ddp-train's loader thread does this
work beside the training), so the timed loop is forward, backward with DDP's overlapped
allreduce, and the optimizer step on contiguous slices. The loss of each step is summed on the
device and read once at the epoch's end; on a GPU, torch.cuda.synchronize() precedes every
clock read. The test accuracy is measured after the last epoch over the 10,000 test images
(each rank a shard, the counts allreduced), untimed.

Output: rank 0 prints one JSON line on stdout with the keys impl ("torch"), torch (version),
device ("cpu" or "cuda"), device_name (the GPU's name, or the CPU's model), precision,
backend (gloo or nccl), optimizer ("adamw_fused", "adamw_foreach" or "adamw_forloop"), world,
epochs, steps, global_batch, params, train_seconds, samples_per_s, test_accuracy (a fraction),
final_loss (mean training loss of the last epoch, rank 0's shard). Progress goes to stderr.

Exit status: 0 trained, 1 bad usage or data (--device cuda without a visible GPU included),
3 could not join the process group.
"""

import argparse
import contextlib
import gzip
import inspect
import json
import math
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
DATA_MEAN = 0.2860
DATA_STD = 0.3530


def read_idx(path):
    """An IDX file (gzip-compressed or not) -> (dims, bytes)."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise SystemExit(f"torch_ddp_mlp: {path}: {e}")
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise SystemExit(f"torch_ddp_mlp: {path}: not an IDX file of unsigned bytes")
    nd = raw[3]
    dims = struct.unpack(">" + "I" * nd, raw[4 : 4 + 4 * nd])
    body = raw[4 + 4 * nd :]
    if len(body) != math.prod(dims):
        raise SystemExit(f"torch_ddp_mlp: {path}: {len(body)} bytes, expected {math.prod(dims)}")
    return dims, body


def find(dir_, stem):
    for name in (stem + ".gz", stem):
        p = os.path.join(dir_, name)
        if os.path.exists(p):
            return p
    raise SystemExit(f"torch_ddp_mlp: {os.path.join(dir_, stem)}[.gz]: no such file")


def load(dir_, split):
    """Split 'train' or 't10k' -> (x (n, 784) float32 normalised, y (n,) int64)."""
    dims, xb = read_idx(find(dir_, f"{split}-images-idx3-ubyte"))
    _, yb = read_idx(find(dir_, f"{split}-labels-idx1-ubyte"))
    n, d = dims[0], dims[1] * dims[2]
    x = torch.frombuffer(bytearray(xb), dtype=torch.uint8).reshape(n, d).float()
    x = (x / 255.0 - DATA_MEAN) / DATA_STD
    y = torch.frombuffer(bytearray(yb), dtype=torch.uint8).long()
    return x, y


def mlp(dim, hidden, layers, classes=10):
    mods, width = [], dim
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, classes))
    return nn.Sequential(*mods)


def schedule(warmup, total):
    """libddp's ddp_schedule_lr as a LambdaLR factor of the peak rate, step 0-based."""

    def f(t):
        if t < warmup:
            return (t + 1) / warmup
        if t >= total:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * (t - warmup) / (total - warmup)))

    return f


def cpu_name():
    """The CPU's model name from /proc/cpuinfo, or platform's guess."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DEFAULT_DIR)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    backend, dev, sync = "gloo", torch.device("cpu"), lambda: None
    if a.device == "cuda":
        ngpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if ngpu == 0:
            print(f"torch_ddp_mlp: --device cuda: torch {torch.__version__} sees no CUDA device",
                  file=sys.stderr)
            return 1
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % ngpu)
        torch.cuda.set_device(dev)
        sync = torch.cuda.synchronize
        if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= ngpu:
            backend = "nccl"
    try:
        dist.init_process_group(backend)
    except Exception as e:  # noqa: BLE001 (any failure to join is reported the same way)
        print(f"torch_ddp_mlp: cannot join the process group: {e}", file=sys.stderr)
        return 3
    rank, world = dist.get_rank(), dist.get_world_size()
    G = a.global_batch
    if G % world:
        print(f"torch_ddp_mlp: --global-batch {G} is not a multiple of {world}", file=sys.stderr)
        return 1
    micro = G // world

    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    xtr, ytr, xte, yte = (t.to(dev) for t in (xtr, ytr, xte, yte))
    n = xtr.shape[0]
    steps_per_epoch = n // G
    total = a.epochs * steps_per_epoch

    torch.manual_seed(a.seed)
    model = DDP(mlp(xtr.shape[1], a.hidden, a.layers).to(dev))
    params = sum(p.numel() for p in model.parameters())
    fused = a.device == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=a.lr,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=0.0,
        **({"fused": True} if fused else {}),
    )
    # What torch runs when not fused: foreach for CUDA tensors, a for-loop on the CPU.
    optimizer = "adamw_" + ("fused" if fused else "foreach" if a.device == "cuda" else "forloop")
    if a.precision == "bf16":
        autocast = lambda: torch.autocast(a.device, dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(a.warmup, total))
    if rank == 0:
        print(
            f"torch_ddp_mlp: torch {torch.__version__}, {world} rank(s), {a.device} ({backend}, "
            f"{a.precision}, {optimizer}), {params} parameters, global batch {G} "
            f"({micro} per rank), {a.epochs} epoch(s) of {steps_per_epoch} steps",
            file=sys.stderr,
        )

    train_s = 0.0
    last_loss = float("nan")
    for epoch in range(a.epochs):
        g = torch.Generator().manual_seed(a.seed * 1000003 + epoch)
        perm = torch.randperm(n, generator=g)[: steps_per_epoch * G].view(steps_per_epoch, G)
        mine = perm[:, rank * micro : (rank + 1) * micro].reshape(-1).to(dev)
        xe = xtr.index_select(0, mine)  # (steps * micro, 784), untimed
        ye = ytr.index_select(0, mine)
        model.train()
        loss_sum = torch.zeros((), device=dev)
        sync()
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            xb = xe[s * micro : (s + 1) * micro]
            yb = ye[s * micro : (s + 1) * micro]
            with autocast():
                loss = F.cross_entropy(model(xb), yb)  # f32 under autocast too
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.detach()
        sync()
        train_s += time.perf_counter() - t0
        last_loss = loss_sum.item() / steps_per_epoch
        if rank == 0:
            print(
                f"torch_ddp_mlp: epoch {epoch + 1}/{a.epochs}: loss {last_loss:.4f}, "
                f"{(epoch + 1) * steps_per_epoch * G / train_s:.0f} samples/s",
                file=sys.stderr,
            )

    # Test accuracy: rank r takes the r-th contiguous shard of the test set.
    model.eval()
    m = xte.shape[0]
    lo, hi = rank * m // world, (rank + 1) * m // world
    with torch.no_grad(), autocast():
        correct = (model.module(xte[lo:hi]).argmax(1) == yte[lo:hi]).sum().double()
    dist.all_reduce(correct)
    acc = correct.item() / m

    if rank == 0:
        device_name = torch.cuda.get_device_name(dev) if a.device == "cuda" else cpu_name()
        print(
            json.dumps(
                {
                    "impl": "torch",
                    "torch": torch.__version__,
                    "device": a.device,
                    "device_name": device_name,
                    "precision": a.precision,
                    "backend": backend,
                    "optimizer": optimizer,
                    "world": world,
                    "epochs": a.epochs,
                    "steps": total,
                    "global_batch": G,
                    "params": params,
                    "train_seconds": round(train_s, 4),
                    "samples_per_s": round(total * G / train_s, 1),
                    "test_accuracy": round(acc, 6),
                    "final_loss": round(last_loss, 6),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
