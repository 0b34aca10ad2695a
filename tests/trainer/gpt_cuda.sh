#!/usr/bin/env bash
# ddp-train --model gpt on a GPU (--device cuda) against the host (--device cpu), on gpt.sh's
# corpus and small GPT (2 layers, width 32, 4 heads, context 16), 20 AdamW steps (clipped,
# cosine after a warmup), the loss and gradient norm of every step (--log-every 1) compared.
# Exits 77 where no GPU is visible or ddp-train was built without CUDA; a minute or two on one
# GPU, every run bounded by timeout(1).
#  1. f32: the GPU at world 1, with --grad-accum 2, and at world 2 ZeRO-3 (two ranks on the first
#     GPU: the cpu backend on device buffers) against the host at world 1 within 1e-4 relative.
#     Both compute in f32 with f32 accumulation; the kernels sum in the host's order, so they
#     differ in the products' order of sums and the exponential's last bits (~1e-6 per step,
#     tests/trainer/test_gpt_cuda.c measures each kernel's), which 20 steps do not grow past
#     1e-5 on this model (gpt.sh: the reduction's order alone gives ~5e-7): a wrong kernel,
#     transposed product or a gradient overwritten instead of added fails at the first step.
#  2. --recompute on the GPU gives the GPU's numbers within 1e-6 (the same kernels and products
#     again).
#  3. bf16: the GPU at world 1 and at world 2 ZeRO-3 against the host's bf16 (which rounds at the
#     same places) within 1e-2 relative: a value on the other side of a bf16 rounding boundary
#     (2^-8) propagates; the loss still falls by a fifth.
#  4. --generate on the GPU from the GPU's checkpoint: the prompt and 40 printable bytes at
#     temperature 0; the same text at world 2 ZeRO-3.
# Usage: gpt_cuda.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip.
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_python

python3 "$(dirname "$0")/gpt_corpus.py" "$tmp/corpus.txt" # 2160 bytes of word soup
common=(--model gpt --data "$tmp/corpus.txt" --layers 2 --width 32 --heads 4 --seq-len 16
    --global-batch 32 --max-steps 20 --epochs 15 --log-every 1 --optimizer adamw --lr 1e-2
    --weight-decay 0.1 --warmup 3 --clip 1.0 --seed 4)

if ! timeout 120 "$TRAIN" "${common[@]}" --device cuda --max-steps 1 >/dev/null 2>"$tmp/probe"; then
    if grep -q -- "--device cuda: " "$tmp/probe"; then
        echo "SKIP: $(head -1 "$tmp/probe")"
        exit 77
    fi
    echo "FAIL: ddp-train --model gpt --device cuda --max-steps 1:" >&2
    cat "$tmp/probe" >&2
    exit 1
fi
# The first GPU (of CUDA_VISIBLE_DEVICES when it is set), which the world-2 runs share.
if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then
    first=${CUDA_VISIBLE_DEVICES%%,*}
else
    first=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | head -1)
fi
first=${first:-0}

# train NAME WORLD ARGS...: a run under ddprun that must succeed; its output in $tmp/NAME.log.
train() {
    local name=$1 world=$2
    shift 2
    if ! timeout 180 "$DDPRUN" --standalone --nproc-per-node "$world" --no-prefix "$TRAIN" \
        "${common[@]}" --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1; then
        fail "$name: ddp-train exited with $?"
        tail -5 "$tmp/$name.log" >&2
    fi
}
# compare REF TOL NAME...: each run's per-step (loss, gradient norm) against REF's.
compare() {
    python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, ref, tol, names = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
def series(name):
    try:
        recs = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    except OSError:
        return {}
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in recs if "loss" in r}
r, bad = series(ref), 0
assert len(r) == 20, (ref, len(r))
for name in names:
    s = series(name)
    worst = (max(abs(a - b) / abs(b) for k in r for a, b in zip(s[k], r[k]))
             if s.keys() == r.keys() else float("inf"))
    ok = worst <= tol
    bad += not ok
    print(f"  {name:16s} 20 steps: max relative difference from {ref} (loss, norm) {worst:.1e}"
          f"{'' if ok else f'  FAIL (tolerance {tol:g})'}")
sys.exit(1 if bad else 0)
PY
}
head -1 "$tmp/probe" | sed 's/^/  /'

# 1. f32.
train cpu 1 --device cpu
train cuda 1 --device cuda --checkpoint-dir "$tmp/ck" --checkpoint-every 10
train cuda-accum2 1 --device cuda --grad-accum 2
CUDA_VISIBLE_DEVICES=$first train cuda-w2-z3 2 --device cuda --zero 3
compare cpu 1e-4 cuda cuda-accum2 cuda-w2-z3 || fail "the GPU's f32 against the host's"

# 2. --recompute.
train cuda-recompute 1 --device cuda --recompute
compare cuda 1e-6 cuda-recompute || fail "--recompute on the GPU"

# 3. bf16.
train cpu-bf16 1 --device cpu --precision bf16
train cuda-bf16 1 --device cuda --precision bf16
CUDA_VISIBLE_DEVICES=$first train cuda-bf16-w2-z3 2 --device cuda --precision bf16 --zero 3
compare cpu-bf16 1e-2 cuda-bf16 cuda-bf16-w2-z3 || fail "the GPU's bf16 against the host's"
python3 -c "
import json, sys
l = [json.loads(x)['loss'] for x in open('$tmp/cuda-bf16.jsonl') if '\"loss\"' in x]
print(f'  GPU bf16: loss {l[0]:.3f} -> {l[-1]:.3f}')
sys.exit(0 if len(l) == 20 and l[-1] < 0.8 * l[0] else 1)" || fail "bf16 on the GPU: the loss did not fall"

# 4. --generate on the GPU.
gen() { # WORLD ARGS...: the text on stdout
    local world=$1
    shift
    CUDA_VISIBLE_DEVICES=$first timeout 60 "$DDPRUN" --standalone --nproc-per-node "$world" \
        --no-prefix "$TRAIN" "${common[@]}" --device cuda --init-from "$tmp/ck/step-000000000020" \
        --max-new 40 --generate "the " --temperature 0 "$@" 2>"$tmp/gen.err"
}
g=$(gen 1) || { fail "--generate on the GPU exited with $?"; cat "$tmp/gen.err" >&2; }
z=$(gen 2 --zero 3) || fail "--generate on the GPU at world 2 ZeRO-3 exited with $?"
printf '  GPU, temperature 0: "%s"\n' "$g"
[[ $g == "the "* && ${#g} -eq 44 && $g =~ ^[[:print:][:space:]]+$ ]] ||
    fail "--generate on the GPU: not the prompt and 40 printable bytes"
[[ $g == "$z" ]] || fail "--generate on the GPU at world 2 ZeRO-3 differs from world 1"
finish
