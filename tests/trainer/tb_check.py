#!/usr/bin/env python3
"""Reads ddp-train's TensorBoard event files back with TensorBoard's own reader and checks them
against the run's JSON Lines metrics.

Usage: tb_check.py METRICS LOGDIR FILES
  METRICS  the --metrics file; LOGDIR the --tensorboard directory; FILES the event files
  expected in LOGDIR.

What TensorBoard should show is derived from the metrics alone: each record's numbers under
their tags (ddp-train(1), TENSORBOARD; memory in MiB) at the record's step (null, a number that
is not finite, has none), where an attempt's
start record at step S drops what came before from step S + 1 on (the session start each event
file opens with), and a later value of a step replaces an earlier one. TensorBoard's view
(EventAccumulator, purging as it does by default) must have exactly those tags and steps, each
value the float32 of the metrics' number (relative 1e-6: the JSON holds 15 digits), written
within a second of the record's time. Prints what it compared.
Exit: 0 pass, 1 fail, 77 skipped (the tensorboard package is not importable).
"""
import json
import logging
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("SKIP: the tensorboard Python package is not importable")
    sys.exit(77)

MIB = 1.0 / 1048576
TAGS = {  # metrics key: (tag, scale), as train_report.c's tb_tags[]
    "loss": ("train/loss", 1.0),
    "lr": ("train/lr", 1.0),
    "grad_norm": ("train/grad_norm", 1.0),
    "samples_per_s": ("train/samples_per_s", 1.0),
    "test_loss": ("test/loss", 1.0),
    "test_accuracy": ("test/accuracy", 1.0),
    "test_bpb": ("test/bpb", 1.0),
    "tokens_per_s": ("train/tokens_per_s", 1.0),
    "rss_bytes": ("memory/host_rss_mib", MIB),
    "gpu_used_bytes": ("memory/gpu_used_mib", MIB),
}


def expected(metrics):
    """{tag: {step: (value, time)}} as TensorBoard should show it."""
    want = {}
    with open(metrics) as f:
        for rec in map(json.loads, f):
            if "start" in rec:
                for steps in want.values():
                    for s in [s for s in steps if s > rec["step"]]:
                        del steps[s]
                continue
            if "summary" in rec:
                continue
            for key, (tag, scale) in TAGS.items():
                if rec.get(key) is not None:  # null: not finite, no scalar
                    want.setdefault(tag, {})[rec["step"]] = (rec[key] * scale, rec["time"])
    return want


def main():
    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # its line about each purge
    metrics, logdir, nfiles = sys.argv[1], sys.argv[2], int(sys.argv[3])
    files = sorted(f for f in os.listdir(logdir) if f.startswith("events.out.tfevents."))
    bad = []
    if len(files) != nfiles:
        bad.append(f"{len(files)} event files in {logdir}, expected {nfiles}: {files}")
    ea = EventAccumulator(logdir, size_guidance={"scalars": 0})
    ea.Reload()
    want = expected(metrics)
    have = set(ea.Tags()["scalars"])
    if have != set(want):
        bad.append(f"tags {sorted(have)}, expected {sorted(want)}")
    worst, count = 0.0, 0
    for tag in sorted(have & set(want)):
        got = [(e.step, e.value, e.wall_time) for e in ea.Scalars(tag)]
        steps = sorted(want[tag])
        if [g[0] for g in got] != steps:
            bad.append(f"{tag}: steps {[g[0] for g in got]}, expected {steps}")
            continue
        for step, value, wall in got:
            ref, t = want[tag][step]
            rel = abs(value - ref) / max(abs(ref), 1e-30)
            worst = max(worst, rel)
            count += 1
            if rel > 1e-6:
                bad.append(f"{tag} at step {step}: {value}, expected {ref}")
            if abs(wall - t) > 1.0:
                bad.append(f"{tag} at step {step}: written at {wall}, the record's time is {t}")
    print(f"  TensorBoard's reader: {count} scalars under {len(have)} tags in {len(files)} "
          f"file(s) match the metrics (largest relative difference {worst:.1e})")
    for b in bad[:20]:
        print(f"  {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
