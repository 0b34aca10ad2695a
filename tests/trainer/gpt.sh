#!/usr/bin/env bash
# ddp-train --model gpt under ddprun (about a minute on 2 cores), on a small text corpus of its
# own (2160 bytes of words, no "%" records: 127 training windows of 17 bytes at --seq-len 16)
# and a small GPT (2 layers, width 32, 4 heads):
#  1. stages: 20 AdamW steps (clipped, cosine after a warmup) at world 2, ZeRO-0, 1, 2 and 3,
#     and at world 1 with 2 micro-steps, against world 1's per-step metrics (loss, gradient
#     norm) within 1e-5 relative. Only the order of float sums differs (the reductions, the
#     split of the batch): ~1e-7 per step, ~5e-7 after 20 steps (measured). --recompute at
#     world 1 gives world 1's numbers exactly. The loss falls by a fifth at least; --precision bf16 at world 2, ZeRO-3 stays within 2% of f32's loss at
#     every step (measured: 3.6e-4).
#  2. checkpoints: 20 steps at world 2, ZeRO-0 saving at step 10; its step-10 checkpoint
#     resumed at world 2, ZeRO-0 ends with the same parameters byte for byte; resumed at
#     world 1, ZeRO-3 (resharded) its parameters right after the load are the saved ones byte
#     for byte, and its metrics for steps 11-20 are the uninterrupted run's within 1e-5;
#     resuming with another --heads (no shape changes) is refused, naming it; resuming at the
#     last step takes none and says so (its summary record has a rate of 0, not NaN).
#  3. export and import: `ddp-ckpt export` writes the model's metadata (model gpt, layers,
#     width, heads, seq_len, vocab; input: bytes, no image normalisation), `ddp-ckpt import` takes the file back as a GPT's, and
#     --init-from the imported checkpoint loads the exported parameters, and so does
#     --init-from the export file itself (at world 2, ZeRO-3); a file of another --heads (in
#     its metadata) or --width (in its shapes: the file without metadata) is refused, naming
#     the difference.
#  4. --generate: the same seed gives the same text (from the checkpoint and from the export
#     file), another seed another; at temperature 0
#     the text is printable; world 2 at ZeRO-3 (every rank runs the passes, rank 0 prints)
#     gives world 1's text.
# Usage: gpt.sh DDPRUN DDP_TRAIN DDP_CKPT. Exit 0 pass, 1 fail, 77 skip (no python3).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}; CKPT=${3:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_python

python3 "$(dirname "$0")/gpt_corpus.py" "$tmp/corpus.txt" # 2160 bytes of word soup
common=(--model gpt --device cpu --data "$tmp/corpus.txt" --layers 2 --width 32 --heads 4
    --seq-len 16 --global-batch 32 --max-steps 20 --epochs 15 --log-every 1 --optimizer adamw
    --lr 1e-2 --weight-decay 0.1 --warmup 3 --clip 1.0 --seed 4)
# train NAME WORLD ARGS...: a run under ddprun that must succeed; its output in $tmp/NAME.log.
train() {
    local name=$1 world=$2
    shift 2
    if ! timeout 120 "$DDPRUN" --standalone --nproc-per-node "$world" --no-prefix "$TRAIN" \
        "${common[@]}" "$@" >"$tmp/$name.log" 2>&1; then
        fail "$name: ddp-train exited with $?"
        tail -5 "$tmp/$name.log" >&2
    fi
}
# compare REF FIRST_STEP NAME...: each run's metrics from FIRST_STEP on against REF's, 1e-5.
compare() {
    python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, ref, first, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def series(name):
    recs = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in recs if "loss" in r and r["step"] >= first}
r, bad = series(ref), 0
for name in names:
    s = series(name)
    worst = max(abs(a - b) / abs(b) for k in r for a, b in zip(s.get(k, (0, 0)), r[k]))
    ok = s.keys() == r.keys() and worst <= 1e-5
    bad += not ok
    print(f"  {name:10s} steps {first}-{max(r)}: max relative difference from {ref} (loss, norm) "
          f"{worst:.1e}{'' if ok else '  FAIL'}")
sys.exit(1 if bad else 0)
PY
}

# 1. Every stage at world 2 and accumulation at world 1 against world 1.
train w1 1 --metrics "$tmp/w1.jsonl"
train w1-accum2 1 --grad-accum 2 --metrics "$tmp/w1-accum2.jsonl"
train w1-recompute 1 --recompute --metrics "$tmp/w1-recompute.jsonl"
python3 -c "
import json, sys
a, b = ([(r['loss'], r['grad_norm']) for r in map(json.loads, open(f)) if 'loss' in r]
        for f in sys.argv[1:])
sys.exit(0 if a == b else 1)" "$tmp/w1.jsonl" "$tmp/w1-recompute.jsonl" ||
    fail "--recompute: other losses or norms than without it"
for z in 0 1 2 3; do train "w2-z$z" 2 --zero $z --metrics "$tmp/w2-z$z.jsonl"; done
compare w1 1 w1-accum2 w2-z0 w2-z1 w2-z2 w2-z3 || fail "stages against world 1"
train w2-bf16 2 --zero 3 --precision bf16 --metrics "$tmp/w2-bf16.jsonl"
python3 -c "
import json, sys
def losses(n):
    return [json.loads(x)['loss'] for x in open(f'$tmp/{n}.jsonl') if '\"loss\"' in x]
l, b = losses('w1'), losses('w2-bf16')
worst = max(abs(x - y) / y for x, y in zip(b, l))
print(f'  world 1: loss {l[0]:.3f} -> {l[-1]:.3f}; bf16 at world 2 ZeRO-3 {b[0]:.3f} -> {b[-1]:.3f}'
      f' (at most {worst:.1e} relative from f32)')
sys.exit(0 if l[-1] < 0.8 * l[0] and len(b) == len(l) and worst < 2e-2 else 1)" ||
    fail "the loss did not fall, or bf16 strays from f32"

# 2. Checkpoints: resumed at the same layout bit for bit, resharded within 1e-5.
train whole 2 --dump-final "$tmp/whole.st" --metrics "$tmp/whole.jsonl"
train first 2 --checkpoint-dir "$tmp/ck" --checkpoint-every 10 --dump-final "$tmp/first.st"
ck10=$tmp/ck/step-000000000010
[[ -d $ck10 ]] || fail "no checkpoint at step 10"
cp -r "$tmp/ck" "$tmp/ck-copy"
rm -rf "$tmp/ck-copy/step-000000000020"
train same 2 --resume "$ck10" --dump-final "$tmp/same.st"
cmp -s "$tmp/whole.st" "$tmp/same.st" && echo "  world 2 ZeRO-0: 20 steps = 10 + resume + 10, byte for byte" ||
    fail "resumed at the same layout: the final parameters differ"
train saved10 1 --init-from "$ck10" --max-steps 1 --dump-init "$tmp/saved10.st"
train reshard 1 --zero 3 --resume "$ck10" --dump-init "$tmp/reshard-init.st" \
    --metrics "$tmp/reshard.jsonl"
grep -q "resuming from $ck10 at step 10" "$tmp/reshard.log" || fail "reshard: no resume line"
if n=$(python3 "$(dirname "$0")/same_tensors.py" "$tmp/saved10.st" "$tmp/reshard-init.st"); then
    echo "  loaded at world 1 ZeRO-3 = saved at world 2 ZeRO-0: $n tensors, byte for byte"
else
    fail "parameters after a resharded load"
fi
compare whole 11 reshard || fail "resharded resume against the uninterrupted run"
out=$(timeout 60 "$TRAIN" "${common[@]}" --heads 2 --resume "$ck10" 2>&1)
[[ $? -eq 2 && $out == *"--heads 4, this run has 2"* ]] ||
    fail "resuming with another --heads: not refused naming it: $out"

# A resume with no step left: the summary says so, and its record has no NaN (jansson refuses
# one, and the record was lost).
train done20 1 --resume "$tmp/ck/step-000000000020" --metrics "$tmp/done20.jsonl"
grep -q "after 20 steps (none of them in this run)" "$tmp/done20.log" &&
    grep -q '"summary": *"done".*"samples_per_s": *0' "$tmp/done20.jsonl" &&
    echo "  resumed at its last step: no steps, a summary without a rate" ||
    fail "resumed at its last step: $(tail -2 "$tmp/done20.log") $(tail -1 "$tmp/done20.jsonl")"

# 3. Export, metadata, import, --init-from.
if "$CKPT" export "$tmp/ck" -o "$tmp/gpt.safetensors" >"$tmp/export.log" 2>&1; then
    python3 - "$tmp/gpt.safetensors" <<'PY' || fail "the export's metadata"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]
want = {"model": "gpt", "layers": "2", "width": "32", "heads": "4", "seq_len": "16", "vocab": "256"}
bad = {k: meta.get(k) for k in want if meta.get(k) != want[k]}
print(f"  export metadata: {', '.join(f'{k} {meta[k]}' for k in want if k in meta)}")
bad = bad or "input_mean" in meta or not meta.get("input", "").startswith("text as bytes")
sys.exit(1 if bad else 0)
PY
    if "$CKPT" import "$tmp/gpt.safetensors" -o "$tmp/imported" >"$tmp/import.log" 2>&1; then
        imp=$(ls -d "$tmp/imported"/step-* | head -1)
        train from-import 1 --init-from "$imp" --max-steps 1 --dump-init "$tmp/imported.st"
        train from-final 1 --init-from "$tmp/ck/step-000000000020" --max-steps 1 \
            --dump-init "$tmp/final.st"
        python3 "$(dirname "$0")/same_tensors.py" "$tmp/final.st" "$tmp/imported.st" >/dev/null &&
            echo "  ddp-ckpt import of the export, --init-from it: the exported parameters" ||
            fail "--init-from the imported export: other parameters"
        train from-file 2 --zero 3 --init-from "$tmp/gpt.safetensors" --max-steps 1 \
            --dump-init "$tmp/fromfile.st"
        python3 "$(dirname "$0")/same_tensors.py" "$tmp/final.st" "$tmp/fromfile.st" >/dev/null &&
            grep -q "parameters from $tmp/gpt.safetensors" "$tmp/from-file.log" &&
            echo "  --init-from the export itself (world 2, ZeRO-3): the exported parameters" ||
            fail "--init-from the export file: other parameters"
    else
        fail "ddp-ckpt import of a GPT's export"
        cat "$tmp/import.log" >&2
    fi
else
    fail "ddp-ckpt export"
    cat "$tmp/export.log" >&2
fi

# 4. Generation.
gen() { # WORLD ARGS...: the text on stdout
    local world=$1
    shift
    timeout 60 "$DDPRUN" --standalone --nproc-per-node "$world" --no-prefix "$TRAIN" \
        "${common[@]}" --init-from "$tmp/ck/step-000000000020" --max-new 60 "$@" 2>"$tmp/gen.err"
}
a=$(gen 1 --generate "the " --seed 7) || fail "--generate exited with $?"
b=$(gen 1 --generate "the " --seed 7 --init-from "$tmp/gpt.safetensors")
c=$(gen 1 --generate "the " --seed 8)
g=$(gen 1 --generate "the " --temperature 0)
z=$(gen 2 --zero 3 --generate "the " --temperature 0)
printf '  seed 7: "%s"\n  temperature 0: "%s"\n' "$a" "$g"
[[ -n $a && $a == "$b" ]] || fail "--generate: the same seed (from the export) gave other text"
[[ $a != "$c" ]] || fail "--generate: another seed gave the same text"
[[ $a == "the "* && ${#a} -eq 64 ]] || fail "--generate: not the prompt and 60 bytes"
[[ $g =~ ^[[:print:][:space:]]+$ ]] || fail "--generate at temperature 0: not printable"
[[ $g == "$z" ]] || fail "--generate at world 2 ZeRO-3 differs from world 1"
expect_exit() { # CODE PATTERN ARGS...
    local code=$1 pattern=$2 out rc
    shift 2
    out=$("$TRAIN" "$@" 2>&1)
    rc=$?
    [[ $rc -eq $code && $out == *"$pattern"* ]] || fail "ddp-train $*: exit $rc, wanted $code and '$pattern': $out"
}
expect_exit 2 "--generate needs a trained model" --model gpt --generate x
expect_exit 2 "this --model does not generate text" --generate x --init-from "$tmp/ck"
expect_exit 2 "its heads is 4, this run's 2" "${common[@]}" --heads 2 \
    --init-from "$tmp/gpt.safetensors"
python3 - "$tmp/gpt.safetensors" "$tmp/bare.safetensors" <<'PY' # the export without metadata
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
del head["__metadata__"]
text = json.dumps(head).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
expect_exit 2 "tensor 'emb.wte' is (256, 32), this run's (256, 64)" "${common[@]}" --width 64 \
    --init-from "$tmp/bare.safetensors"
expect_exit 1 "--width 30 is not a multiple of --heads 4" --model gpt --data "$tmp/corpus.txt" \
    --seq-len 16 --global-batch 32 --width 30 --max-steps 1
finish
