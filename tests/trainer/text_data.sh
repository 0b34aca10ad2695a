#!/usr/bin/env bash
# ddp-train on text (a model whose data is bytes: the first such row of --help, gpt), tiny so
# that the whole file takes well under a minute on 2 cores:
#  1. the windows: --dump-batches' tok rows are the windows of the training stream that the
#     split rule of ddp-train(1), TEXT DATA, makes of two --data files (one comma list), as
#     python recomputes it from the files: window i = stream[i*T, i*T + T + 1).
#  2. resume at the same window: 40 steps in one go, or 20 with a checkpoint and --resume auto
#     to 40, at world 2 (ZeRO-0 and ZeRO-3), mid-epoch: the final parameters are the same bytes.
#  3. the reports: the epoch line and the summary give the validation loss, bits per byte
#     (= loss / ln 2 in the metrics record, test_bpb) and next-byte accuracy, rates in tok/s;
#     TensorBoard has test/bpb (tb_check.py, when the tensorboard package is there).
#  4. refusals: a missing --data file, an empty name in a list, a text too short for one
#     window exit 2 naming it; an image model given two --data exits 2.
# The default corpus is Debian's fortunes package (the last step reads it).
# Usage: text_data.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (no text model, no
# fortunes, no python3).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_python
FORTUNES=/usr/share/games/fortunes
[[ -r $FORTUNES/fortunes ]] || { echo "SKIP: $FORTUNES is not installed (Debian's fortunes)"; exit 77; }
"$TRAIN" --help | grep -q '^  gpt$' || { echo "SKIP: this ddp-train has no text model (gpt)"; exit 77; }

T=16
model=(--device cpu --model gpt --layers 1 --width 16 --heads 2 --seq-len $T)
common=("${model[@]}" --global-batch 16 --epochs 15 --schedule constant --warmup 5 --lr 0.003)
# train NAME WORLD ARGS...: a run under ddprun that must succeed; its stderr in $tmp/NAME.log.
train() {
    local name=$1 world=$2
    shift 2
    if ! timeout 120 "$DDPRUN" --standalone --nproc-per-node "$world" --no-prefix "$TRAIN" \
        "${common[@]}" "$@" >"$tmp/$name.log" 2>&1; then
        fail "$name: ddp-train exited with $?"
        tail -5 "$tmp/$name.log" >&2
    fi
}

# 1. The windows of two files, one with fortune records, one without.
python3 - "$tmp" <<'PY'
import sys
d = sys.argv[1]
with open(d + "/a.txt", "w") as f:
    for i in range(400):
        f.write("Record %d says %s.\n%%\n" % (i, "xyz" * (i % 7)))
with open(d + "/b.txt", "w") as f:
    for i in range(300):
        f.write("plain line %d without separators\n" % i)
PY
train dump 1 --data "$tmp/a.txt,$tmp/b.txt" --max-steps 12 --dump-batches "$tmp/batches.st"
if out=$(python3 - "$tmp" $T <<'PY'
import json, struct, sys
d, T = sys.argv[1], int(sys.argv[2])
def cut(b):  # ddp-train(1), TEXT DATA: the first record at or after 95%, else 95%
    at = len(b) * 19 // 20
    for q in range(max(at, 2), len(b)):
        if b[q - 1:q] == b"\n" and b[q - 2:q - 1] == b"%" and (q == 2 or b[q - 3:q - 2] == b"\n"):
            return q
    return at
stream = b"".join(open(d + "/" + n, "rb").read()[:cut(open(d + "/" + n, "rb").read())]
                  for n in ("a.txt", "b.txt"))
raw = open(d + "/batches.st", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
def tensor(name):
    h = head[name]
    lo, hi = h["data_offsets"]
    return h["shape"], raw[8 + n + lo:8 + n + hi]
(S, G), index = tensor("index")
shape, tok = tensor("tok")
assert shape == [S, G, T + 1], shape
idx = struct.unpack("<%di" % (S * G), index)
nwin = (len(stream) - 1) // T
for r, i in enumerate(idx):
    assert 0 <= i < nwin, (i, nwin)
    assert tok[r * (T + 1):(r + 1) * (T + 1)] == stream[i * T:i * T + T + 1], r
print("%d steps x %d windows of %d bytes = stream[i*T, i*T+T+1) of %d training bytes (%d windows)"
      % (S, G, T + 1, len(stream), nwin))
PY
); then
    echo "  --dump-batches: $out"
else
    fail "--dump-batches' windows are not those of the split rule"
fi

# 2. Resume at the same window, bit for bit, mid-epoch.
for z in 0 3; do
    train "whole-z$z" 2 --zero $z --max-steps 40 --log-every 10 --dump-final "$tmp/whole-z$z.st"
    train "first-z$z" 2 --zero $z --max-steps 20 --checkpoint-dir "$tmp/ck-z$z" \
        --checkpoint-every 20
    train "second-z$z" 2 --zero $z --max-steps 40 --log-every 10 --checkpoint-dir "$tmp/ck-z$z" \
        --resume auto --dump-final "$tmp/second-z$z.st"
    grep -q "at step 20 (epoch 1, step 20 of it)" "$tmp/second-z$z.log" ||
        fail "second-z$z: no line naming step 20 of epoch 1"
    if cmp -s "$tmp/whole-z$z.st" "$tmp/second-z$z.st"; then
        echo "  ZeRO-$z, world 2: 40 steps = 20 + resume + 20 on text, final parameters identical"
    else
        fail "ZeRO-$z: the resumed text run's final parameters differ from the uninterrupted run's"
    fi
    # The same training losses from step 30 on (the same windows).
    a=$(grep -o 'step 40/40 | epoch 1 | loss [0-9.]*' "$tmp/whole-z$z.log")
    b=$(grep -o 'step 40/40 | epoch 1 | loss [0-9.]*' "$tmp/second-z$z.log")
    [[ -n $a && $a == "$b" ]] || fail "ZeRO-$z: step 40's loss '$a' vs '$b' resumed"
done

# 3. The reports: default corpus, metrics and TensorBoard.
train report 2 --max-steps 30 --log-every 10 --metrics "$tmp/m.jsonl" --tensorboard "$tmp/tb"
grep -E "^epoch 1/1 \(step 30\): validation loss [0-9.]+ \([0-9.]+ bits per byte\), next-byte accuracy [0-9.]+%$" \
    "$tmp/report.log" | sed 's/^/  /' | grep . ||
    fail "no epoch line with the validation loss, bits per byte and accuracy"
grep -qE "^step 10/30 \| .* [0-9]+ tok/s \|" "$tmp/report.log" || fail "no report in tok/s"
grep -E "validation loss .* after 30 steps .* tokens/s\); model state" "$tmp/report.log" |
    sed 's/^/  /' | grep . || fail "no summary with the validation loss"
if python3 - "$tmp/m.jsonl" <<'PY'
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
ep = [r for r in recs if "test_bpb" in r and "summary" not in r][-1]
assert abs(ep["test_bpb"] - ep["test_loss"] / math.log(2)) < 1e-9 * ep["test_bpb"], ep
assert 0 <= ep["test_accuracy"] <= 1 and ep["test_loss"] < math.log(256), ep
steps = [r for r in recs if "tokens_per_s" in r and "loss" in r]
assert steps and all(abs(r["tokens_per_s"] - 16 * r["samples_per_s"]) < 1e-6 * r["tokens_per_s"]
                     for r in steps)
s = recs[-1]
assert s["summary"] == "done" and s["test_bpb"] == ep["test_bpb"] and "tokens_per_s" in s, s
print("  metrics: test_loss %.4f nats = test_bpb %.4f bits per byte, next-byte accuracy %.4f"
      % (ep["test_loss"], ep["test_bpb"], ep["test_accuracy"]))
PY
then :; else fail "the metrics records of a text run"; fi
st=0
python3 "$(dirname "$0")/tb_check.py" "$tmp/m.jsonl" "$tmp/tb" 1 >"$tmp/tb.log" 2>&1 || st=$?
if [[ $st -eq 0 ]]; then # the metrics hold test_bpb: TensorBoard must have test/bpb
    sed 's/^/  /' "$tmp/tb.log"
elif [[ $st -ne 77 ]]; then
    fail "tb_check.py exited with $st"
    tail -5 "$tmp/tb.log" >&2
fi

# 4. Refusals, before training.
printf 'too short\n' >"$tmp/short.txt"
for bad in "--data $tmp/none|$tmp/none: cannot open" "--data $tmp/a.txt,,$tmp/b.txt|an empty name" \
    "--data $tmp/short.txt|fewer than one window"; do
    st=0
    timeout 60 "$TRAIN" "${model[@]}" ${bad%|*} >"$tmp/bad.log" 2>&1 || st=$?
    grep -q -- "${bad#*|}" "$tmp/bad.log" && [[ $st -eq 2 ]] ||
        fail "ddp-train ${bad%|*}: exit $st, $(head -1 "$tmp/bad.log")"
done
st=0
timeout 60 "$TRAIN" --data /a --data /b >"$tmp/bad.log" 2>&1 || st=$?
grep -q "an image model reads one directory" "$tmp/bad.log" && [[ $st -eq 2 ]] ||
    fail "the mlp with two --data: exit $st"

finish
