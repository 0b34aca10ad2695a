#!/usr/bin/env bash
# ddp-train --tensorboard read back by TensorBoard's own reader (tb_check.py: the Python package
# tensorboard's EventAccumulator), a few seconds:
#  1. two ranks under ddprun, 40 steps, a report every 5, --metrics and --tensorboard into a
#     directory that does not exist yet: one event file, whose tags, steps and values are the
#     metrics' (float32), a live reader's view as each value is written;
#  2. a second run from scratch into the same directory (another seed): a second file, and
#     TensorBoard shows the second run only (the session start its file opens with drops the
#     first run's steps), as the metrics file, emptied by the second run, says;
#  3. a run that diverges (SGD at lr 1e6, alone): a record for every report all the same, the
#     numbers that are not finite null in the metrics and left out of TensorBoard;
#  4. a --tensorboard path under a regular file: the exit status of bad usage (an unknown
#     option's), and a line naming the flag, the path and the reason.
# Usage: tensorboard.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (no Fashion-MNIST, no
# python3 or no tensorboard package).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data
need_python
check=$(dirname "$0")/tb_check.py
python3 -c 'import tensorboard' 2>/dev/null || { echo "SKIP: no tensorboard package"; exit 77; }

# run NAME ARGS...: two ranks, their output in $tmp/NAME.log.
run() {
    local name=$1 st=0
    shift
    timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" --device cpu \
        --hidden 128 --max-steps 40 --log-every 5 --metrics "$tmp/m.jsonl" "$@" \
        >"$tmp/$name.log" 2>&1 || st=$?
    if [[ $st -ne 0 ]]; then
        fail "$name: ddprun exited with $st"
        tail -5 "$tmp/$name.log" >&2
    fi
}

run first --tensorboard "$tmp/runs/x"
python3 "$check" "$tmp/m.jsonl" "$tmp/runs/x" 1 || fail "first run: TensorBoard's view"
run second --tensorboard "$tmp/runs/x" --seed 2
python3 "$check" "$tmp/m.jsonl" "$tmp/runs/x" 2 || fail "second run: TensorBoard's view"

st=0
timeout 60 "$TRAIN" --device cpu --hidden 128 --optimizer sgd --lr 1e6 --warmup 0 --max-steps 6 \
    --log-every 1 --metrics "$tmp/nan.jsonl" --tensorboard "$tmp/nan" >"$tmp/nan.log" 2>&1 || st=$?
[[ $st -eq 0 ]] || fail "the diverging run exited with $st"
python3 - "$tmp/nan.jsonl" <<'PY' || fail "the diverging run's metrics"
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
reports = [r for r in recs if "samples_per_s" in r and "summary" not in r]
assert [r["step"] for r in reports] == [1, 2, 3, 4, 5, 6], reports
nulls = [r["step"] for r in reports if r["loss"] is None]
assert nulls and reports[0]["loss"] is not None, reports
print(f"  diverging run: a record for each of the 6 steps, the loss null at steps {nulls}")
PY
python3 "$check" "$tmp/nan.jsonl" "$tmp/nan" 1 || fail "the diverging run: TensorBoard's view"

: >"$tmp/plain"
usage=0
"$TRAIN" --no-such-option >/dev/null 2>&1 || usage=$?
st=0
timeout 60 "$TRAIN" --device cpu --max-steps 1 --tensorboard "$tmp/plain/x" >"$tmp/bad.log" 2>&1 ||
    st=$?
if [[ $st -ne 0 && $st -eq $usage ]] && line=$(grep -- "--tensorboard $tmp/plain/x: .*Not a directory" "$tmp/bad.log"); then
    echo "  $line"
else
    fail "--tensorboard under a file: exit $st (bad usage: $usage), $(tail -1 "$tmp/bad.log")"
fi
finish
