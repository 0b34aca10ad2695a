#!/usr/bin/env bash
# Metrics that survive a restart: two ranks under `ddprun --max-restarts 1`, 60 steps, a report
# every 5, a checkpoint every 20, --resume auto, --metrics and --tensorboard; rank 1 SIGKILLed
# right after step 50 on the first attempt (ddp-train's test-only DDP_TRAIN_TEST_KILL, as in
# resume_kill.sh). The metrics file then holds, in order:
#   attempt 0: its start (fresh, step 0) and every report up to step 50;
#   attempt 1: its start (resumed at the checkpoint's step S: 40, or 20 when step 40's save
#   was still being written when rank 1 died), reports from S + 5 to 60 continuing the step
#   numbering, the evaluation and the summary;
# every record with time (non-decreasing), elapsed, attempt and world. The steps both attempts
# trained have the same losses (a resume at the same world size is bit for bit). TensorBoard's
# reader (tb_check.py; skipped without the tensorboard package) sees two event files merged
# into one curve per tag: attempt 0's steps past S replaced by attempt 1's.
# Usage: metrics_restart.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (no Fashion-MNIST or
# no python3).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data
need_python

st=0
DDP_TRAIN_TEST_KILL=1:50 timeout 150 "$DDPRUN" --standalone --nproc-per-node 2 --max-restarts 1 \
    --no-prefix "$TRAIN" --device cpu --hidden 128 --max-steps 60 --log-every 5 \
    --checkpoint-dir "$tmp/ck" --checkpoint-every 20 --resume auto \
    --metrics "$tmp/m.jsonl" --tensorboard "$tmp/tb" >"$tmp/run.log" 2>&1 || st=$?
if [[ $st -ne 0 ]]; then
    fail "ddprun exited with $st"
    tail -5 "$tmp/run.log" >&2
fi
grep -q "resuming from" "$tmp/run.log" || fail "the second attempt did not resume"

python3 - "$tmp/m.jsonl" <<'PY' || fail "the metrics file"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
common = ["time", "elapsed", "attempt", "world"]
for r in recs:
    assert list(r)[:4] == common and r["world"] == 2 and r["elapsed"] >= 0, r
times = [r["time"] for r in recs]
assert times == sorted(times), "time goes back"
attempts = [r["attempt"] for r in recs]
assert attempts == sorted(attempts) and set(attempts) == {0, 1}, attempts
a0 = [r for r in recs if r["attempt"] == 0]
a1 = [r for r in recs if r["attempt"] == 1]
assert a0[0]["start"] == "fresh" and a0[0]["step"] == 0, a0[0]
assert [r["step"] for r in a0 if "loss" in r] == list(range(5, 51, 5)), a0
assert a1[0]["start"] == "resumed" and a1[0]["step"] in (20, 40), a1[0]
s = a1[0]["step"]
assert [r["step"] for r in a1 if "loss" in r] == list(range(s + 5, 61, 5)), a1
assert [r["step"] for r in a1 if "test_loss" in r] == [60], a1
assert a1[-1].get("summary") == "done" and a1[-1]["steps"] == 60, a1[-1]
for r in a0 + a1:
    if "loss" in r:
        assert {"step", "epoch", "loss", "lr", "grad_norm", "samples_per_s", "rss_bytes"} <= set(r), r
loss0 = {r["step"]: r["loss"] for r in a0 if "loss" in r}
both = [(r["step"], loss0[r["step"]], r["loss"]) for r in a1 if r.get("step") in loss0 and "loss" in r]
assert both and all(a == b for _, a, b in both), both
print(f"  attempt 0: {len(a0)} records (reports to step 50); attempt 1 resumed at step {s}: "
      f"{len(a1)} records (reports {s + 5} to 60); steps {[b[0] for b in both]} reported by "
      f"both with the same loss")
PY
python3 "$(dirname "$0")/tb_check.py" "$tmp/m.jsonl" "$tmp/tb" 2
case $? in
0) ;;
77) echo "  (TensorBoard's view not checked: no tensorboard package)" ;;
*) fail "TensorBoard's view of the restarted run" ;;
esac
finish
