#!/usr/bin/env python3
"""libddp's SGD, AdamW and Lion kernels against PyTorch, step by step.

usage: optim_torch.py OPTIM_TORCH_DRIVER

For each optimizer setting, the same initial parameters and gradients (float32, seeded) go
through torch.optim.SGD or torch.optim.AdamW (single-tensor path: foreach and fused off), or
the Lion of lion_torch.py beside this file (torch has none: the few lines of the common PyTorch
implementation, shared with tests/trainer/torch_reference.py), and through optim-torch-driver
(worker/libddp/optim.c) with the kernel set chosen at run time. After every step the
parameters and the optimizer state are compared; the largest absolute difference (also as a
fraction of the array's largest magnitude) and the number of differing elements are printed.
Every other kernel set this CPU runs must reproduce the chosen one's bits.

Hyperparameters are float32-representable values, so both sides start from the same numbers
(optim.h). Where PyTorch runs its AVX2 or AVX-512 CPU kernels, SGD's parameters and momentum
buffer, AdamW's moments and Lion's parameters and momentum must be bit-identical
(worker/libddp/optim.h promises it). AdamW's
parameters may differ by an ulp here and there, because PyTorch's CPU float sqrt is not
correctly rounded (1 ulp off for about a fifth of inputs with MKL) and ours is; and where
PyTorch's kernels are its portable ones they do not fuse multiply-adds. Those comparisons allow
a difference of 1e-6 of the array's largest magnitude (about 8 ulps of it) over the 10 steps.

Exit status: 0 pass, 1 fail, 77 skipped (torch not importable).
"""
import os
import struct
import subprocess
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no usable torch"
    print(f"torch is not importable ({e}): skipped")
    sys.exit(77)

if int(torch.__version__.split(".")[0]) < 2:
    # torch 1.x updates AdamW's first moment as mul_ then add_, not lerp_: other roundings.
    print(f"torch {torch.__version__} predates the operation order optim.c follows: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lion_torch import Lion  # noqa: E402 - after the skip on no torch

N = 4099  # 256 vectors of 16, and a tail of 3
STEPS = 10


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


SGD_CASES = [
    dict(lr=0.05, momentum=0.0, nesterov=False, weight_decay=0.0),
    dict(lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.0),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
    dict(lr=0.1, momentum=0.5, nesterov=False, weight_decay=1e-2),
]
ADAMW_CASES = [
    dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
    dict(lr=3e-3, betas=(0.95, 0.98), eps=1e-6, weight_decay=0.0),
    dict(lr=1e-2, betas=(0.3, 0.5), eps=1e-8, weight_decay=0.1),  # lerp's other branch
]

LION_CASES = [
    dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0),
    dict(lr=3e-4, betas=(0.95, 0.98), weight_decay=1.0),
]


def to_f32(case):
    out = {}
    for k, v in case.items():
        if isinstance(v, tuple):
            out[k] = tuple(f32(x) for x in v)
        elif isinstance(v, float):
            out[k] = f32(v)
        else:
            out[k] = v
    return out


def data():
    gen = torch.Generator().manual_seed(20240901)
    p0 = torch.randn(N, generator=gen, dtype=torch.float32)
    grads = torch.randn(STEPS, N, generator=gen, dtype=torch.float32) * 0.1
    return p0, grads


def run_torch(kind, case, p0, grads):
    """Per step: [param, state...] as float32 tensors."""
    param = torch.nn.Parameter(p0.clone())
    if kind == "sgd":
        opt = torch.optim.SGD([param], foreach=False, **case)
    elif kind == "lion":
        opt = Lion([param], **case)
    else:
        opt = torch.optim.AdamW([param], foreach=False, **case)
    steps = []
    for s in range(STEPS):
        param.grad = grads[s].clone()
        opt.step()
        st = opt.state[param]
        if kind == "sgd":
            extra = [st["momentum_buffer"].clone()] if case["momentum"] else []
        elif kind == "lion":
            extra = [st["exp_avg"].clone()]
        else:
            extra = [st["exp_avg"].clone(), st["exp_avg_sq"].clone()]
        steps.append([param.detach().clone()] + extra)
    return steps


def run_c(driver, isa, kind, case, p0, grads):
    if kind == "sgd":
        header = "sgd %d %d %s %s %d %s\n" % (
            N, STEPS, case["lr"].hex(), case["momentum"].hex(), int(case["nesterov"]),
            case["weight_decay"].hex())
        per_step = 2 if case["momentum"] else 1
    elif kind == "lion":
        header = "lion %d %d %s %s %s %s\n" % (
            N, STEPS, case["lr"].hex(), case["betas"][0].hex(), case["betas"][1].hex(),
            case["weight_decay"].hex())
        per_step = 2
    else:
        header = "adamw %d %d %s %s %s %s %s\n" % (
            N, STEPS, case["lr"].hex(), case["betas"][0].hex(), case["betas"][1].hex(),
            case["eps"].hex(), case["weight_decay"].hex())
        per_step = 3
    # Through struct rather than numpy, which may be absent.
    body = struct.pack("%df" % N, *p0.tolist())
    for s in range(STEPS):
        body += struct.pack("%df" % N, *grads[s].tolist())
    payload = header.encode() + body
    args = [driver] + ([isa] if isa else [])
    r = subprocess.run(args, input=payload, capture_output=True, timeout=120)
    if r.returncode == 3:
        return None, r.stderr.decode().strip()
    if r.returncode != 0:
        raise SystemExit("driver failed (%d): %s" % (r.returncode, r.stderr.decode()))
    out = r.stdout
    want = STEPS * per_step * N * 4
    if len(out) != want:
        raise SystemExit("driver wrote %d bytes, expected %d" % (len(out), want))
    vals = struct.unpack("%df" % (STEPS * per_step * N), out)
    t = torch.tensor(vals, dtype=torch.float32).view(STEPS, per_step, N)
    return [[t[s, k] for k in range(per_step)] for s in range(STEPS)], r.stderr.decode().strip()


def compare(kind, got, ref, exact):
    """One line per state array, and whether the comparison passes."""
    names = ["param"] + {"sgd": ["momentum_buffer"], "lion": ["exp_avg"]}.get(
        kind, ["exp_avg", "exp_avg_sq"])
    names = names[:len(ref[0])]  # SGD without momentum has no buffer
    ok = True
    parts = []
    for k, name in enumerate(names):
        max_abs = max_rel = 0.0
        differing = 0
        for s in range(STEPS):
            c, t = got[s][k], ref[s][k]
            d = (c - t).abs().max().item()
            scale = t.abs().max().item()
            max_abs = max(max_abs, d)
            max_rel = max(max_rel, d / scale if scale else 0.0)
            differing = max(differing, (c != t).sum().item())
            must_match = exact and not (kind == "adamw" and name == "param")
            if (must_match and differing) or d > 1e-6 * scale:
                ok = False
        parts.append("%s: max|diff| %.3g (%.2g of its largest), %d of %d differ"
                     % (name, max_abs, max_rel, differing, N))
    return ok, parts


def main():
    driver = sys.argv[1]
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    exact = capability in ("AVX2", "AVX512")
    print("torch %s, CPU capability %s: %s; %d elements, %d steps, worst step shown" % (
        torch.__version__, capability,
        "SGD, AdamW's moments and Lion must be bit-identical" if exact else
        "differences up to 1e-6 of each array's largest allowed", N, STEPS))
    p0, grads = data()
    failed = False
    for kind, cases in (("sgd", SGD_CASES), ("adamw", ADAMW_CASES), ("lion", LION_CASES)):
        for case in cases:
            case = to_f32(case)
            ref = run_torch(kind, case, p0, grads)
            got, used = run_c(driver, None, kind, case, p0, grads)
            ok, parts = compare(kind, got, ref, exact)
            # Every other kernel set must give the run-time choice's bits.
            same = []
            for isa in ("portable", "avx2", "avx512"):
                other, _ = run_c(driver, isa, kind, case, p0, grads)
                if other is None or isa == used.split()[-1]:
                    continue
                identical = all(torch.equal(a, b) for sa, sb in zip(other, got)
                                for a, b in zip(sa, sb))
                same.append(isa + ("" if identical else " DIFFERS"))
                ok &= identical
            failed |= not ok
            print("%s %s\n    [%s; %s]: %s\n    %s" % (
                kind, " ".join("%s=%.9g" % (k, v) if isinstance(v, float) else
                               "%s=%s" % (k, v) for k, v in case.items()),
                used.split()[-1], "identical: " + ", ".join(same) if same else "no other set",
                "ok" if ok else "FAIL", "\n    ".join(parts)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
