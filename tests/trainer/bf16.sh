#!/usr/bin/env bash
# ddp-train --precision bf16 on the host (mixed precision emulated as the GPU computes it:
# mlp.h), against f32: the same model, data order and epochs; the test accuracy after them
# within 0.5 points of f32's. Three configurations in bf16: one rank with f32 reductions, and
# two ranks reducing in bf16 (--reduce-dtype bf16) at ZeRO-1 and ZeRO-3. About half a minute.
#
# Why 0.5 points: bf16 rounds the parameters' compute copy and the activations to 8 bits of
# mantissa, while the master weights, optimizer state and gradients stay f32, so the run
# follows f32's to within the noise of a different rounding: a few tenths of a point on the
# 10,000 test images after 3 epochs.
#
# Usage: bf16.sh DDPRUN DDP_TRAIN
# Exit: 0 pass, 1 fail, 77 skipped (Fashion-MNIST is not installed).
set -uo pipefail
DDPRUN=${1:?usage: bf16.sh DDPRUN DDP_TRAIN}
TRAIN=${2:?usage: bf16.sh DDPRUN DDP_TRAIN}
. "$(dirname "$0")/../libddp/lib.sh"
need_data

common=(--device cpu --epochs 3 --log-every 1000 --timeout-ms 60000)
run() { # NAME WORLD ARGS...
    local name=$1 world=$2
    shift 2
    local st=0
    timeout 240 "$DDPRUN" --standalone --nproc-per-node "$world" --no-prefix "$TRAIN" \
        "${common[@]}" --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1 || st=$?
    if [[ $st -ne 0 ]]; then
        fail "ddp-train $name exited with $st"
        tail -5 "$tmp/$name.log" >&2
    fi
}
run f32 1
run bf16 1 --precision bf16
run bf16-w2-z1-rbf16 2 --precision bf16 --reduce-dtype bf16 --zero 1
run bf16-w2-z3-rbf16 2 --precision bf16 --reduce-dtype bf16 --zero 3
grep -q ", bf16 (reduced in bf16); OpenBLAS" "$tmp/bf16-w2-z1-rbf16.log" ||
    fail "the first line does not say bf16, reduced in bf16"

python3 - "$tmp" <<'PY' || fail "accuracy"
import json, sys
tmp = sys.argv[1]
def acc(name):
    recs = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    s = recs[-1]
    assert s.get("summary") == "done", s
    return 100 * s["test_accuracy"]
ref = acc("f32")
bad = 0
for name in ("bf16", "bf16-w2-z1-rbf16", "bf16-w2-z3-rbf16"):
    a = acc(name)
    ok = abs(a - ref) <= 0.5
    bad += not ok
    print(f"  {name:18s} test accuracy {a:.2f}% against f32's {ref:.2f}%: {a - ref:+.2f} points"
          f"{'' if ok else '  FAIL (more than 0.5)'}")
sys.exit(1 if bad else 0)
PY

finish
