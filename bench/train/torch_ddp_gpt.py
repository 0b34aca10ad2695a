"""torch_ddp_gpt: ddp-train --model gpt's job in PyTorch DDP, the torch side of bench/train/gpt.sh.

Run it under ddprun (or torchrun) like ddp-train:

    ddprun --standalone --nproc-per-node 2 --no-prefix python3 bench/train/torch_ddp_gpt.py \\
        --global-batch 64 --max-steps 200 --lr 3e-3 --warmup 20

It trains what `ddp-train --model gpt` trains (worker/trainer/gpt.h, model_gpt.c), the way a
torch user would write it (nanoGPT's model.py, trimmed):
  - a GPT-2-style decoder over bytes (vocabulary 256): token and learned position embeddings,
    --layers pre-LayerNorm blocks (causal self-attention with --heads heads and a fused qkv
    projection, an MLP C -> 4C -> C with GELU's tanh approximation), a final LayerNorm (eps
    1e-5), logits ln_f(x) wte^T (tied); torch.nn.Linear layers with biases; the parameter
    names and shapes are ddp-train's (emb.wte, emb.wpe, h0.attn.c_attn.weight, ..., ln_f.bias);
    GPT-2's initialisation (N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 L)), biases
    0, LayerNorm weights 1) drawn by torch.manual_seed(--seed) (DDP broadcasts rank 0's);
  - attention by F.scaled_dot_product_attention(is_causal=True) where this torch has it
    (2.0 and later: a fused CPU kernel), else written out (scores, causal mask, softmax);
    --attention picks one;
  - the text of --data (files or directories; default Debian's fortunes) split and cut into
    windows exactly as ddp-train's data_load_text() (worker/trainer/data.h): each file cut at
    the first "%" record at or after 95% of its bytes, the training parts of all files one
    stream, the validation parts another, window i = bytes [i T, i T + T + 1);
  - every epoch a permutation of the windows from (seed, epoch); global batch G = --global-batch
    consecutive entries, rank r taking the r-th contiguous G / world (the global batch does not
    depend on the world size), the last incomplete one dropped: ddp-train's sampler, with
    another generator (the same distribution, not the same batches);
  - the loss the mean cross-entropy over the rank's predicted bytes, DDP averaging over ranks:
    the mean over the global batch's bytes, as ddp-train's;
  - AdamW (betas 0.9/0.999, eps 1e-8, --weight-decay on every parameter, as ddp-train), linear
    warmup over --warmup steps then cosine decay to 0 at the last step (libddp's
    ddp_schedule_lr), --max-steps steps;
  - DistributedDataParallel on gloo; torch.set_num_threads(1) and one inter-op thread: one core
    per rank, as ddp-train's one OpenBLAS thread.
--precision bf16 wraps forward and loss in torch.autocast("cpu", torch.bfloat16) (f32
parameters, optimizer state and gradients, reduced in f32).

Timing, as ddp-train's: the training steps only (forward, backward with DDP's overlapped
allreduce, the optimizer step). Each rank gathers its windows of an epoch into one tensor before
the epoch's clock starts (ddp-train's loader thread does this beside training). After the last
step the validation loss is measured over every validation window (each rank a contiguous
shard, in passes of a micro-batch's rows, the sums allreduced), untimed.

Output: rank 0 prints one JSON line on stdout: impl ("torch"), torch (version), device,
device_name, precision, backend, optimizer, attention ("sdpa" or "written"), world, steps,
global_batch, seq, layers, width, heads, params, train_seconds, tokens_per_s, test_loss
(validation loss per byte, nats), test_bpb (the same in bits), final_loss (mean training loss
of the last 10 steps, rank 0's share). Progress goes to stderr.

Exit status: 0 trained, 1 bad usage or data, 3 could not join the process group.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_ddp_mlp import cpu_name, schedule

DEFAULT_DATA = "/usr/share/games/fortunes"
VOCAB = 256


def text_cut(b):
    """data.c's text_cut(): the start of the first record at or after 95% of b, else 95%."""
    at = len(b) * 19 // 20
    for q in range(max(at, 2), len(b)):
        if b[q - 1] == 10 and b[q - 2] == 37 and (q == 2 or b[q - 3] == 10):  # "\n%\n"
            return q
    return at


def text_files(path):
    """A file, or a directory's regular files by byte order of name (no hidden, .dat, .u8)."""
    if not os.path.isdir(path):
        return [path]
    names = sorted((n for n in os.listdir(path) if not n.startswith(".")
                    and not n.endswith(".dat") and not n.endswith(".u8")),
                   key=lambda n: n.encode())
    return [p for p in (os.path.join(path, n) for n in names) if os.path.isfile(p)]


def load_text(paths, seq, split):
    """(n, seq + 1) uint8 windows of split 'train' or 'test', as data_load_text()."""
    stream = bytearray()
    for path in paths:
        for f in text_files(path):
            try:
                with open(f, "rb") as fh:
                    b = fh.read()
            except OSError as e:
                raise SystemExit(f"torch_ddp_gpt: {f}: {e}")
            cut = text_cut(b)
            stream += b[cut:] if split == "test" else b[:cut]
    n = (len(stream) - 1) // seq if len(stream) > 1 else 0
    if n < 1:
        raise SystemExit(f"torch_ddp_gpt: the {split} text is {len(stream)} bytes, fewer than "
                         f"one window of {seq + 1}")
    t = torch.frombuffer(stream, dtype=torch.uint8)
    return t.as_strided((n, seq + 1), (seq, 1)).clone()


class Block(nn.Module):
    def __init__(self, C, H, attention):
        super().__init__()
        self.H, self.attention = H, attention
        self.ln_1 = nn.LayerNorm(C)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C)
        self.attn.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C)
        self.mlp.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, N, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
            mask = torch.ones(N, N, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.attn.c_proj(y.transpose(1, 2).reshape(B, N, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, seq, C, L, H, attention):
        super().__init__()
        self.L = L
        self.emb = nn.Module()
        self.emb.wte = nn.Parameter(torch.empty(VOCAB, C))
        self.emb.wpe = nn.Parameter(torch.empty(seq, C))
        for l in range(L):
            self.add_module(f"h{l}", Block(C, H, attention))
        self.ln_f = nn.LayerNorm(C)
        for name, p in self.named_parameters():  # GPT-2's initialisation, as gpt_init_param()
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif name.startswith("emb.") or (name.endswith(".weight") and p.dim() == 2):
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.emb.wte[idx] + self.emb.wpe[: idx.shape[1]]
        for l in range(self.L):
            x = getattr(self, f"h{l}")(x)
        return self.ln_f(x) @ self.emb.wte.t()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", nargs="+", default=[DEFAULT_DATA])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    have_sdpa = hasattr(F, "scaled_dot_product_attention")
    ap.add_argument("--attention", choices=("sdpa", "written"),
                    default="sdpa" if have_sdpa else "written")
    a = ap.parse_args()
    if a.attention == "sdpa" and not have_sdpa:
        print(f"torch_ddp_gpt: --attention sdpa: torch {torch.__version__} has no "
              "scaled_dot_product_attention", file=sys.stderr)
        return 1
    if a.width % a.heads:
        print(f"torch_ddp_gpt: --width {a.width} is not a multiple of --heads {a.heads}",
              file=sys.stderr)
        return 1

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    try:
        dist.init_process_group("gloo")
    except Exception as e:  # noqa: BLE001 (any failure to join is reported the same way)
        print(f"torch_ddp_gpt: cannot join the process group: {e}", file=sys.stderr)
        return 3
    rank, world = dist.get_rank(), dist.get_world_size()
    G, T = a.global_batch, a.seq_len
    if G % world:
        print(f"torch_ddp_gpt: --global-batch {G} is not a multiple of {world}", file=sys.stderr)
        return 1
    micro = G // world

    train = load_text(a.data, T, "train").long()
    val = load_text(a.data, T, "test").long()
    n = train.shape[0]
    steps_per_epoch = n // G
    if steps_per_epoch < 1:
        print(f"torch_ddp_gpt: {n} training windows, fewer than --global-batch {G}",
              file=sys.stderr)
        return 1
    total = a.max_steps

    torch.manual_seed(a.seed)
    model = DDP(GPT(T, a.width, a.layers, a.heads, a.attention))
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(a.warmup, total))
    # The implementation torch picked (on the CPU: its for-loop unless it defaults otherwise).
    d = opt.defaults
    optimizer = "adamw_" + ("fused" if d.get("fused") else "foreach" if d.get("foreach")
                            else "default")
    if a.precision == "bf16":
        autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    if rank == 0:
        print(f"torch_ddp_gpt: torch {torch.__version__}, {world} rank(s), gloo, {a.precision}, "
              f"GPT {a.layers} layers, width {a.width}, {a.heads} heads, context {T} "
              f"({a.attention} attention), {params} parameters, global batch {G} ({micro} per "
              f"rank), {total} steps ({n} training windows, {steps_per_epoch} steps an epoch)",
              file=sys.stderr)

    def loss_of(win):
        with autocast():
            logits = model(win[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), win[:, 1:].reshape(-1))

    train_s, step, epoch, losses = 0.0, 0, 0, []
    model.train()
    while step < total:
        g = torch.Generator().manual_seed(a.seed * 1000003 + epoch)
        perm = torch.randperm(n, generator=g)[: steps_per_epoch * G].view(steps_per_epoch, G)
        k = min(steps_per_epoch, total - step)
        mine = perm[:k, rank * micro : (rank + 1) * micro].reshape(-1)
        we = train.index_select(0, mine)  # (k * micro, T + 1), untimed
        t0 = time.perf_counter()
        for s in range(k):
            loss = loss_of(we[s * micro : (s + 1) * micro])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.detach())
        train_s += time.perf_counter() - t0
        step += k
        epoch += 1
        if rank == 0:
            print(f"torch_ddp_gpt: step {step}/{total}: loss {losses[-1].item():.4f}, "
                  f"{step * G * T / train_s:.0f} tokens/s", file=sys.stderr)
    final_loss = torch.stack(losses[-10:]).mean().item()

    # Validation: rank r takes the r-th contiguous shard of the windows.
    model.eval()
    m = val.shape[0]
    lo, hi = rank * m // world, (rank + 1) * m // world
    sums = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for i in range(lo, hi, micro):
            w = val[i : min(hi, i + micro)]
            with autocast():
                logits = model.module(w[:, :-1])
            sums[0] += F.cross_entropy(logits.float().reshape(-1, VOCAB), w[:, 1:].reshape(-1),
                                       reduction="sum").double()
            sums[1] += w[:, 1:].numel()
    dist.all_reduce(sums)
    test_loss = (sums[0] / sums[1]).item()

    if rank == 0:
        print(json.dumps({
            "impl": "torch", "torch": torch.__version__, "device": "cpu",
            "device_name": cpu_name(), "precision": a.precision, "backend": "gloo",
            "optimizer": optimizer, "attention": a.attention, "world": world,
            "steps": total, "global_batch": G, "seq": T, "layers": a.layers, "width": a.width,
            "heads": a.heads, "params": params, "train_seconds": round(train_s, 4),
            "tokens_per_s": round(total * G * T / train_s, 1), "test_loss": round(test_loss, 6),
            "test_bpb": round(test_loss / math.log(2), 6), "final_loss": round(final_loss, 6),
        }), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
