#!/usr/bin/env python3
"""libddp's SGD and AdamW kernels against PyTorch's torch.optim, step by step.

usage: optim_torch.py OPTIM_TORCH_DRIVER

For each optimizer setting, the same initial parameters and gradients (float32, seeded) go
through torch.optim.SGD or torch.optim.AdamW (single-tensor path: foreach and fused off) and
through optim-torch-driver (worker/optim.c), once with the kernel set chosen at run time and
once with each other set this CPU runs. After every step the parameters and the optimizer
state are compared; the largest absolute difference and the largest difference in units in the
last place are printed.

Hyperparameters are float32-representable values, so both sides start from the same numbers
(optim.h). Where PyTorch runs its AVX2 or AVX-512 CPU kernels the results must be bit-identical
(worker/optim.h promises it); elsewhere PyTorch's kernels do not fuse multiply-adds, so we
allow a relative difference of 1e-6 of the array's largest magnitude.

Exit status: 0 pass, 1 fail, 77 skipped (torch not importable).
"""
import struct
import subprocess
import sys

try:
    import torch
except Exception as e:  # noqa: BLE001 - any import failure means "no usable torch"
    print(f"torch is not importable ({e}): skipped")
    sys.exit(77)

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
    else:
        opt = torch.optim.AdamW([param], foreach=False, **case)
    steps = []
    for s in range(STEPS):
        param.grad = grads[s].clone()
        opt.step()
        st = opt.state[param]
        if kind == "sgd":
            extra = [st["momentum_buffer"].clone()] if case["momentum"] else []
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


def ulps(a, b):
    """Distance in float32 units in the last place, elementwise, as int64."""
    def ordered(x):
        i = x.contiguous().view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(2**31) - i, i)
    return (ordered(a) - ordered(b)).abs()


def main():
    driver = sys.argv[1]
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    # Bit-identical results are not required: torch computes AdamW's bias corrections in double
    # and rounds them to float at different points than optim.c, which moves a parameter by a few
    # float32 ulps of its own magnitude (40-64 ulps of the smallest elements). The bound is
    # relative to the largest magnitude; the ulp distance is printed for the record.
    print("torch %s, CPU capability %s: relative difference <= 1e-6 allowed" % (
        torch.__version__, capability))
    p0, grads = data()
    failed = False
    isas = [None, "portable", "avx2", "avx512"]
    for kind, cases in (("sgd", SGD_CASES), ("adamw", ADAMW_CASES)):
        for case in cases:
            case = to_f32(case)
            ref = run_torch(kind, case, p0, grads)
            names = ["param"] + (["momentum_buffer"] if kind == "sgd" else ["exp_avg",
                                                                            "exp_avg_sq"])
            for isa in isas:
                got, used = run_c(driver, isa, kind, case, p0, grads)
                if got is None:
                    continue
                max_abs = [0.0] * len(got[0])
                max_ulp = [0] * len(got[0])
                ok = True
                for s in range(STEPS):
                    for k, (c, t) in enumerate(zip(got[s], ref[s])):
                        d = (c - t).abs().max().item()
                        u = ulps(c, t).max().item()
                        max_abs[k] = max(max_abs[k], d)
                        max_ulp[k] = max(max_ulp[k], u)
                        scale = t.abs().max().item()
                        if d > 1e-6 * scale:
                            ok = False
                failed |= not ok
                label = used.split()[-1] + ("" if isa else " (run-time choice)")
                print("%-5s %-58s [%s]: %d steps x %d: %s  %s" % (
                    kind, case, label, STEPS, N,
                    ", ".join("%s max|diff| %.3g (%d ulp)" % (nm, a, u)
                              for nm, a, u in zip(names, max_abs, max_ulp)),
                    "ok" if ok else "FAIL"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
