#!/usr/bin/env python3
"""ddp-train against PyTorch: the same MLP, initial weights, batches and optimizer, 50 steps.

Runs ddp-train for 50 steps with --dump-init, --dump-batches and per-step --metrics (alone, and
on two ranks under ddprun: SGD at ZeRO-2, AdamW at ZeRO-3, Lion at ZeRO-1), for SGD (momentum
0.9, weight decay), AdamW and Lion (betas 0.9 and 0.99; both with decoupled weight decay), each
with a cosine schedule after a linear warmup and --clip. Then rebuilds the model in PyTorch
(float32, one thread) from the dumped parameters, replays the dumped global batches with
torch.optim.SGD / torch.optim.AdamW / the few lines of torch in tests/libddp/lion_torch.py (torch
has no Lion; tests/libddp/optim_torch.py checks libddp's Lion kernels against the same lines
bit for bit) and torch.nn.utils.clip_grad_norm_, taking each step's learning rate from the
dump, and compares every step's loss (the mean cross-entropy over the global batch before the
update) and gradient norm (before clipping) with ddp-train's metrics. Prints the largest
difference per configuration. It does not test the evaluation, the data pipeline's order (the
batches come from the dump) or anything at more than two ranks (tests/libddp/run_ddp.sh does).

Tolerances, relative, at every one of the 50 steps: 2e-4 for the loss, 1e-3 for the gradient
norm. Both sides compute in float32 but sum in different orders (OpenBLAS against PyTorch's
GEMMs, the loss reduced in double against float, the allreduce and the split of the batch at two
ranks), so a step agrees to ~1e-7 relative and the differences fed back through the updates stay
near 1e-6: measured over seeds 1-7, at most 2.5e-6 for the loss and 1e-5 for the norm, except
where a pre-activation comes within rounding of 0 (twice in those 28 runs: SGD with seed 4 and
AdamW at two ranks with seed 7, whose step 40 has |x| = 2e-7 where the other steps' smallest is
~1e-5): the ReLU then switches a unit on one side and off on the other. The loss is continuous
there but the gradient is not: that step's norm differs by 6e-5, and the later steps' norms by
up to 1.2e-4 and losses by up to 3e-5 (AdamW's normalised steps carry the change to every
weight). The bounds leave a margin of 7 over those worst cases, and stay 15 times below the
smallest change a wrong formula makes (measured against this run: SGD without its weight decay
3e-3, AMSGrad 4e-3, AdamW without weight decay 5e-3, eps 1e-6 1e-2, the lr of the next step
6e-2, Nesterov, no clip or coupled weight decay 2e-1 and more).

Lion's bounds differ. Lion moves every weight by exactly lr along sign(c), c = b1*m + (1-b1)*g, so
a small difference in the gradient changes nothing until some weight's c lies within rounding of 0:
then that weight steps by lr one way on one side and the other way on the other, a jump of 2*lr
(6e-4, against weights of ~5e-2) that the next steps' gradients carry to the loss and norm
everywhere. Such flips do not come in the first steps, while the momentum is small beside the
gradient, and come more often later, as c shrinks where m and g disagree. Measured over seeds 1-15
at one and two ranks (mostly the same figures at both; seed 12's run alone meets a flip at step 46
that its two-rank run does not): over steps 1-8 (alone) at most 3e-7 for the loss and 2.4e-6 for
the norm, as for the others; the first flips come at steps 9 to 12 (seeds 2, 5, 6, 14), and over
steps 1-12 the largest differences are 6.2e-5 for the loss and 2.3e-4 for the norm (seeds 2 and 5;
seed 7, the test's, 1.3e-7 and 2e-6), over all 50 steps 1.9e-3 and 5.9e-3 (seed 2; seed 7 3e-7 and
2e-6). It is rounding, not the formula: PyTorch against itself, with the batch's loss summed in two
halves of 64 (the split of two ranks), meets the same flips (seed 6: 4.2e-4 and 4.3e-3 over 50
steps, as against ddp-train). A wrong formula shows in the first steps: over steps 1-12, the
momentum updated before c is computed differs by 1.8e-4 to 9e-4 for the loss and 1.3e-3 to 3.7e-3
for the norm (seeds 1-15; seed 7 4.8e-4 and 3.0e-3), no weight decay by 5.3e-4 to 1.2e-3 and 2.0e-3
to 4.8e-3 (seed 7 7.2e-4 and 3.2e-3), beta2 0.999 or the betas swapped by 7.6e-3 and more (seeds
1-15, alone). So Lion is held to the bounds above over its first 12 steps (3 times its rounding's
loss there and 4 times its norm; each of those 30 wrong runs exceeds the norm's bound, by 1.3 times
at least and 3 at seed 7), and over steps 13-50 to 1e-2 for the loss and 3e-2 for the norm (5 times
its rounding; they catch the betas swapped or beta2 0.999, whose differences over 50 steps are 5e-2
and 2.8e-1 at least, but not the small errors the first steps catch).

OpenBLAS picks its kernels by CPU (and ddp-train picks for it where it does not know the CPU:
ddp-train(1), OPENBLAS_CORETYPE), and its sets sum in different orders: each step still agrees
to ~1e-7, but the rounding stream, and so where a ReLU input lands within rounding of 0, depends
on the machine. On an Emerald Rapids Xeon, seed 7's AdamW run at world 1 met such a switch at
step 7 with OpenBLAS's Prescott kernels and drifted to 4e-3 by step 28, while the Haswell
kernels on the same machine stay within 3e-5 for all 50 steps (as on the AMD EPYC machines,
whose kernels are Haswell's). So that the test checks the same arithmetic on every machine CI
may run on, ddp-train runs on the host (--device cpu, whatever GPU the machine has) with
OpenBLAS's Haswell kernels (OPENBLAS_CORETYPE, on any CPU with AVX2; an explicit
OPENBLAS_CORETYPE is kept). libddp's own kernels still dispatch by CPU as
usual (the ddp-optim test covers each set).

Usage: torch_reference.py DDPRUN DDP_TRAIN
Exit: 0 pass, 1 fail, 77 skipped (no torch, or Fashion-MNIST is not installed).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
try:
    import torch
except ImportError as e:
    print(f"SKIP: import torch failed: {e}")
    sys.exit(77)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "libddp"))
from lion_torch import Lion  # noqa: E402 - after the skip on no torch

DATA = "/usr/share/datasets/fashion-mnist"
STEPS = 50
LOSS_TOL, NORM_TOL = 2e-4, 1e-3  # relative, per step; see the header
LION_EXACT_STEPS, LION_LATE_TOL = 12, (1e-2, 3e-2)  # Lion's sign flips; see the header

# (name, world, ddp-train flags); every run also gets COMMON.
COMMON = ["--device", "cpu", "--max-steps", str(STEPS), "--log-every", "1", "--schedule",
          "cosine", "--warmup", "10", "--clip", "1.0", "--global-batch", "128", "--hidden", "256",
          "--seed", "7"]
SGD = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "5e-4"]
ADAMW = ["--optimizer", "adamw", "--lr", "2e-3", "--weight-decay", "0.05"]
LION = ["--optimizer", "lion", "--lr", "3e-4", "--weight-decay", "1.0"]
CONFIGS = [
    ("sgd, world 1", 1, SGD),
    ("sgd, world 2, ZeRO-2", 2, SGD + ["--zero", "2"]),
    ("adamw, world 1", 1, ADAMW),
    ("adamw, world 2, ZeRO-3", 2, ADAMW + ["--zero", "3"]),
    ("lion, world 1", 1, LION),
    ("lion, world 2, ZeRO-1", 2, LION + ["--zero", "1"]),
]

DTYPES = {"F32": torch.float32, "I32": torch.int32, "U8": torch.uint8}


def load_safetensors(path):
    """{name: tensor} from a safetensors file: the package if importable, else by hand."""
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = bytearray(raw[8 + n:])  # writable, so torch.frombuffer does not warn
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        count = (hi - lo) // torch.tensor([], dtype=dtype).element_size()
        t = torch.frombuffer(body, dtype=dtype, count=count, offset=lo) if count else \
            torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def run_ddp_train(ddprun, train, tmp, world, flags):
    """Runs ddp-train; returns (per-step records, parameters, batches)."""
    init, batches, metrics = (os.path.join(tmp, n) for n in
                              ("init.safetensors", "batches.safetensors", "metrics.jsonl"))
    cmd = [train] + COMMON + flags + ["--metrics", metrics, "--dump-init", init,
                                      "--dump-batches", batches]
    if world > 1:
        cmd = [ddprun, "--standalone", "--nproc-per-node", str(world)] + cmd
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stdout}")
    with open(metrics) as f:
        recs = [r for r in map(json.loads, f) if "loss" in r]
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1)), [r["step"] for r in recs]
    return recs, load_safetensors(init), load_safetensors(batches)


def torch_losses(params, batches, optimizer, clip):
    """Replays the batches in PyTorch; returns per-step (loss, gradient norm before clipping)."""
    names = sorted({k.split(".")[0] for k in params}, key=lambda s: int(s[2:]))  # fc1, fc2, ...
    layers = []
    for n in names:
        w = params[f"{n}.weight"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(w)
            lin.bias.copy_(params[f"{n}.bias"])
        layers += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])  # no ReLU after the last layer
    opt = optimizer(model.parameters())
    x, label, lr = batches["x"], batches["label"].long(), batches["lr"]
    assert x.shape[0] == STEPS and lr.shape == (STEPS,), (x.shape, lr.shape)
    out = []
    for s in range(STEPS):
        for g in opt.param_groups:
            g["lr"] = float(lr[s])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[s]), label[s])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        out.append((loss.item(), norm.item()))
    return out


def main():
    if len(sys.argv) != 3:
        print("usage: torch_reference.py DDPRUN DDP_TRAIN", file=sys.stderr)
        return 1
    ddprun, train = sys.argv[1:]
    with open("/proc/cpuinfo") as f:
        if " avx2 " in f.read():
            os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")  # see the header
    if not os.path.exists(f"{DATA}/train-images-idx3-ubyte.gz"):
        print(f"SKIP: {DATA} (Debian's dataset-fashion-mnist) is not installed")
        return 77
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {STEPS} steps, tolerances (relative): loss {LOSS_TOL:g}, "
          f"gradient norm {NORM_TOL:g}")
    optimizers = {
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.0, momentum=0.9, weight_decay=5e-4),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.0, betas=(0.9, 0.999), eps=1e-8,
                                              weight_decay=0.05),
        "lion": lambda ps: Lion(ps, lr=0.0, betas=(0.9, 0.99), weight_decay=1.0),
    }
    clip = float(COMMON[COMMON.index("--clip") + 1])
    fails = 0
    for name, world, flags in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            recs, params, batches = run_ddp_train(ddprun, train, tmp, world, flags)
        ref = torch_losses(params, batches, optimizers[flags[1]], clip)
        dloss = [abs(r["loss"] - l) / abs(l) for r, (l, _) in zip(recs, ref)]
        dnorm = [abs(r["grad_norm"] - n) / abs(n) for r, (_, n) in zip(recs, ref)]
        clipped = sum(n > clip for _, n in ref)
        print(f"{name}: loss {ref[0][0]:.5f} -> {ref[-1][0]:.5f}, {clipped}/{STEPS} steps "
              f"clipped; max relative difference: loss {max(dloss):.2e} (step "
              f"{dloss.index(max(dloss)) + 1}), gradient norm {max(dnorm):.2e}")
        tol = [(LOSS_TOL, NORM_TOL)] * STEPS
        if flags[1] == "lion":
            tol[LION_EXACT_STEPS:] = [LION_LATE_TOL] * (STEPS - LION_EXACT_STEPS)
            print(f"  steps 1-{LION_EXACT_STEPS}: loss {max(dloss[:LION_EXACT_STEPS]):.2e}, "
                  f"gradient norm {max(dnorm[:LION_EXACT_STEPS]):.2e}; steps "
                  f"{LION_EXACT_STEPS + 1}-{STEPS} held to loss {LION_LATE_TOL[0]:g}, "
                  f"gradient norm {LION_LATE_TOL[1]:g}")
        bad = [s for s in range(STEPS) if dloss[s] > tol[s][0] or dnorm[s] > tol[s][1]]
        if bad:
            s = bad[0]
            print(f"FAIL: {name}: step {s + 1}: ddp-train loss {recs[s]['loss']!r} norm "
                  f"{recs[s]['grad_norm']!r}, torch loss {ref[s][0]!r} norm {ref[s][1]!r}",
                  file=sys.stderr)
            fails += 1
        if not 0 < clipped < STEPS:
            print(f"FAIL: {name}: the clip should act on some steps but not all "
                  f"({clipped}/{STEPS})", file=sys.stderr)
            fails += 1
    print("FAIL" if fails else "PASS")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
