#!/usr/bin/env python3
"""report.py: the table of bench/train/compare.sh from its OUT directory.

    python3 bench/train/report.py OUT

compare.sh runs it after its runs; run alone, it prints an earlier run's table again, e.g. of
an OUT directory copied back from a GPU machine. It reads OUT/settings.txt (device, nprocs,
precisions, epochs, reps, ntorch: the number of torch interpreters run, cores and cpu: the
host's), shapes.txt ("label hidden layers" per model), gpus.txt (the GPUs' names), busy.txt
(each run's other CPU load), sgemm.MODEL.out (DEVICE=cpu), ours.MODEL.PRECISION.RANKS.REP.jsonl
(ddp-train's metrics) and torchI.MODEL.PRECISION.RANKS.REP.out (torch_ddp_mlp.py's JSON line),
and writes OUT/compare.json. See bench/train/README.md for the columns and the targets.
"""
import json, os, sys

from benchjson import last_json

if len(sys.argv) != 2:
    sys.exit(__doc__.split("\n\n")[1].strip())
out = sys.argv[1]
with open(os.path.join(out, "settings.txt")) as f:
    settings = dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
device = settings["device"]
nprocs = [int(x) for x in settings["nprocs"].split()]
precisions, epochs = settings["precisions"].split(), settings["epochs"]
reps, ntorch = int(settings["reps"]), int(settings["ntorch"])
cores, cpu = int(settings["cores"]), settings["cpu"]
busy = {}
with open(os.path.join(out, "busy.txt")) as f:
    for line in f:
        k, before, during = line.split()
        busy[k] = (int(before), int(during))
with open(os.path.join(out, "shapes.txt")) as f:
    shapes = [(s, int(h), int(l)) for s, h, l in (line.split() for line in f)]
with open(os.path.join(out, "gpus.txt")) as f:
    gpus = [g for g in f.read().splitlines() if g]


def flops_per_sample(hidden, layers, dim=784, classes=10):
    """GEMM flops of a training step per sample, as sgemm counts them: per layer 2 x in x out for
    the forward, the weight gradient and, except for the first layer, the input gradient."""
    dims = [dim] + [hidden] * layers + [classes]
    macs = sum(a * b for a, b in zip(dims, dims[1:]))
    return 2 * (3 * macs - dims[0] * dims[1])


sgemm = {}
if device == "cpu":
    for s, _, _ in shapes:
        sgemm[s] = last_json(os.path.join(out, f"sgemm.{s}.out"))
        if not sgemm[s]:
            sys.exit(f"report.py: {out}: no sgemm figures")


def sgemm_rates(sg):
    return ", ".join([f"{sg['square_gflops']:.1f} GFLOP/s at {sg['square_n']}^3"]
                     + [f"{m['gflops']:.1f} at the model's GEMMs (micro-batch {m['batch']})"
                        for m in sg["model"]])


if device == "cpu":
    sg0 = sgemm[shapes[0][0]]
    print(f"# {cpu}, {cores} cores; {epochs} epochs; OpenBLAS {sg0.get('core', '?')} kernels "
          "for all" + (f"; single-thread sgemm: {sgemm_rates(sg0)}" if len(shapes) == 1 else ""))
    limit = f"the limit of n ranks is min(n, {cores} cores) x the single-thread rate"
    if len(shapes) == 1:
        print(f"# model GEMM flops per sample (forward + backward): {sg0['flops_per_sample']:.0f}; "
              + limit)
    else:
        print("# " + limit)
else:
    names = sorted(set(gpus), key=gpus.index)
    print("# GPU: " + ", ".join(f"{g} (x{gpus.count(g)})" for g in names)
          + f"; host: {cpu}, {cores} cores; {epochs} epochs")

show_prec = precisions != ["f32"]
cols = [("ranks", "{:>5}")] + ([("prec", "{:<4}")] if show_prec else []) + [
    ("impl", "{:<18}"), ("samples/s", "{:>9}"), ("ours/this", "{:>9}"), ("test acc", "{:>8}"),
    ("GFLOP/s", "{:>8}"), ("% sq limit", "{:>10}"), ("% model limit", "{:>13}"),
    ("other CPU", "{:>9}")]
fmt = "  ".join(f for _, f in cols[:2]) + " " + " ".join(f for _, f in cols[2:])


def best(names_results):
    """The repetition with the most samples/s: (name, result) or (first name, None)."""
    ok = [(k, v) for k, v in names_results if v]
    return max(ok, key=lambda kv: kv[1]["samples_per_s"]) if ok else (names_results[0][0], None)


rows = []
cells = []  # (model, precision, ranks, [(impl, ran)]) of every cell, failed runs included
for s, hidden, layers in shapes:
    sg = sgemm.get(s)
    fps = sg["flops_per_sample"] if sg else flops_per_sample(hidden, layers)
    if device != "cpu" or len(shapes) > 1:
        arch = "-".join(["784"] + [str(hidden)] * layers + ["10"])
        if s == shapes[0][0]:
            print()  # later models follow a table's blank line
        print(f"# model {arch} ({s}): GEMM flops per sample (forward + backward) {fps:.0f}"
              + (f"; single-thread sgemm {sgemm_rates(sg)}" if sg else ""))
    print()
    print(fmt.format(*(c for c, _ in cols)))
    model_rate = {m["batch"]: m["gflops"] for m in sg["model"]} if sg else {}
    for n in nprocs:
        same = sg and len(sg["model"]) == len(nprocs)  # a sgemm row per rank count
        mb = sg["model"][nprocs.index(n)]["batch"] if same else None
        for p in precisions:
            k = f"{s}.{p}.{n}"
            name, ours = best([(f"ours.{k}.{r}", last_json(os.path.join(out, f"ours.{k}.{r}.jsonl"),
                                                           "summary"))
                               for r in range(1, reps + 1)])
            runs = [("ddp-train", name, ours)]
            for i in range(ntorch):
                name, t = best([(f"torch{i}.{k}.{r}",
                                 last_json(os.path.join(out, f"torch{i}.{k}.{r}.out")))
                                for r in range(1, reps + 1)])
                runs.append((f"torch {t['torch']}" if t else f"torch #{i}", name, t))
            cells.append((s, p, n, [(impl, bool(r)) for impl, _, r in runs]))
            for impl, name, r in runs:
                b = busy.get(name, (0, 0))
                noisy = f"{b[1]}%" + (" noisy" if b[1] > 10 else "")
                lead = [n] + ([p] if show_prec else []) + [impl]
                if not r:
                    print(fmt.format(*lead, "FAILED", "", "", "", "", "", noisy))
                    continue
                sps, acc = r["samples_per_s"], r["test_accuracy"]
                gf = sps * fps / 1e9
                lim = min(n, cores)
                sq = 100 * gf / (lim * sg["square_gflops"]) if sg else None
                mr = model_rate.get(mb) if mb else None
                ml = f"{100 * gf / (lim * mr):.1f}%" if mr else "-"
                ratio = "-"
                if impl != "ddp-train" and ours:
                    ratio = f"{ours['samples_per_s'] / sps:.2f}x"
                print(fmt.format(*lead, f"{sps:.0f}", ratio, f"{100 * acc:.2f}%", f"{gf:.2f}",
                                 f"{sq:.1f}%" if sq is not None else "-", ml, noisy))
                rows.append({"shape": s, "hidden": hidden, "layers": layers, "precision": p,
                             "ranks": n, "impl": impl, "samples_per_s": sps, "test_accuracy": acc,
                             "model_gflops": gf,
                             "frac_square_limit": sq / 100 if sq is not None else None,
                             "frac_model_limit": (gf / (lim * mr)) if mr else None,
                             "other_cpu_pct": b[1], "other_cpu_before_pct": b[0],
                             **{k: r[k] for k in ("device_name", "optimizer", "backend")
                                if k in r}})
            print()


def row(s, p, n, impl):
    key = (s, p, n, impl)
    return next((r for r in rows
                 if (r["shape"], r["precision"], r["ranks"], r["impl"]) == key), None)


tag = (lambda s: f"{s}, ") if len(shapes) > 1 else (lambda s: "")
if device == "cpu":
    print("targets (from issue 9; reported, not enforced):")
    for s, _, _ in shapes:
        o2 = row(s, "f32", 2, "ddp-train")
        for r in rows:
            if (r["shape"], r["precision"], r["ranks"]) != (s, "f32", 2) \
                    or r["impl"] == "ddp-train" or not o2:
                continue
            ratio = o2["samples_per_s"] / r["samples_per_s"]
            dacc = 100 * (o2["test_accuracy"] - r["test_accuracy"])
            ok = ratio >= 1.5 and dacc >= -1.0
            print(f"  {tag(s)}2 ranks, >= 1.5x {r['impl']}'s samples/s at equal accuracy "
                  "(within 1 point): "
                  f"{ratio:.2f}x, accuracy {dacc:+.2f} points: {'met' if ok else 'NOT met'}")
        for r in rows:
            if r["shape"] == s and r["precision"] == "f32" and r["impl"] == "ddp-train":
                ok = r["frac_square_limit"] >= 0.85
                print(f"  {tag(s)}{r['ranks']} rank(s), >= 85% of the sgemm limit in model FLOPs: "
                      f"{100 * r['frac_square_limit']:.1f}% of the square rate"
                      + (f", {100 * r['frac_model_limit']:.1f}% of the model-shape rate"
                         if r["frac_model_limit"] else "")
                      + f": {'met' if ok else 'NOT met'}")
else:
    print("targets (from issue 13; reported, not enforced):")
    for s, p, n, impls in cells:
        o = row(s, p, n, "ddp-train")
        for impl, ran in impls[1:]:
            what = (f"  {s}, {p}, {n} rank(s): ddp-train >= {impl}'s samples/s at equal accuracy "
                    "(within 0.5 points): ")
            if not o or not ran:
                print(what + f"not measured ({'ddp-train' if not o else impl} failed)")
                continue
            r = row(s, p, n, impl)
            ratio = o["samples_per_s"] / r["samples_per_s"]
            dacc = 100 * (o["test_accuracy"] - r["test_accuracy"])
            ok = ratio >= 1.0 and dacc >= -0.5
            print(what + f"{ratio:.2f}x, accuracy {dacc:+.2f} points: {'met' if ok else 'NOT met'}")
with open(os.path.join(out, "compare.json"), "w") as f:
    json.dump({"device": device, "gpus": gpus, "sgemm": sgemm, "epochs": int(epochs),
               "cores": cores, "rows": rows}, f, indent=1)
print(f"\n# JSON: {os.path.join(out, 'compare.json')}")
