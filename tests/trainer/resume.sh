#!/usr/bin/env bash
# ddp-train's checkpoints and --resume under ddprun (about half a minute on 2 cores):
#  1. bit for bit: 156 steps in one go, or 78 with --checkpoint-every 78 and then --resume auto
#     to 156, at world 2 with AdamW, ZeRO-0 and ZeRO-3: the final parameters (--dump-final) are
#     the same bytes. The first leg's --resume auto finds nothing and says it starts afresh.
#  2. resharded: a checkpoint saved at world 2, ZeRO-1 resumes at world 3, ZeRO-3 and at
#     world 1, ZeRO-0 (--micro-batch 64 keeps the global batch of 384: 3, 2 and 6 micro-steps
#     per rank): the parameters right after the load (--dump-init) are exactly the saved ones,
#     and the test accuracy at the end is that of the uninterrupted world-2 run within 0.5
#     percentage points. Only the order of float sums differs between the layouts (~1e-7
#     relative per step); after 78 AdamW steps the parameters differ by ~1e-5 relative, which
#     moves a handful of the 10,000 test images across a decision boundary (0.01 pp each).
#     --init-from loads the same parameters (only).
#  3. refusals: resuming with another --hidden, --seed or --global-batch, or from a path that
#     is no checkpoint, exits 2 naming the setting or the file; so do option combinations
#     that make no sense (--micro-batch with --grad-accum, --checkpoint-every without a
#     directory, a --micro-batch that does not divide the global batch).
# On the host (--device cpu), whatever GPU the machine has: bit for bit is the CPU's promise.
# The schedule is constant (with warmup) because the legs' --max-steps differ: a cosine decay
# spans the run's length, so a longer second leg would change every learning rate (ddp-train
# warns about that on resume).
# Usage: resume.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (no Fashion-MNIST, no python3).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data
need_python

common=(--device cpu --hidden 128 --global-batch 384 --micro-batch 64 --epochs 1 --schedule constant
    --warmup 10 --optimizer adamw --lr 0.002)
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
# accuracy NAME: the last test accuracy the run printed.

# 1. Bit for bit at the same world size and stage.
for z in 0 3; do
    train "whole-z$z" 2 --zero $z --max-steps 156 --dump-final "$tmp/whole-z$z.st"
    train "first-z$z" 2 --zero $z --max-steps 78 --checkpoint-dir "$tmp/ck-z$z" \
        --checkpoint-every 78 --resume auto
    grep -q "no complete checkpoint under $tmp/ck-z$z: starting from scratch" "$tmp/first-z$z.log" ||
        fail "first-z$z: no line saying it starts from scratch"
    train "second-z$z" 2 --zero $z --max-steps 156 --checkpoint-dir "$tmp/ck-z$z" --resume auto \
        --dump-final "$tmp/second-z$z.st"
    grep -q "resuming from $tmp/ck-z$z/step-000000000078 at step 78 (epoch 1, step 78 of it), saved by 2 ranks at ZeRO-$z" \
        "$tmp/second-z$z.log" || fail "second-z$z: no line naming the checkpoint and step"
    if cmp -s "$tmp/whole-z$z.st" "$tmp/second-z$z.st"; then
        echo "  ZeRO-$z, world 2: 156 steps = 78 + resume + 78, final parameters identical byte for byte"
    else
        fail "ZeRO-$z: the resumed run's final parameters differ from the uninterrupted run's"
    fi
done

# 2. Resharded: saved at world 2, ZeRO-1; loaded at world 3, ZeRO-3 and world 1, ZeRO-0.
train whole-w2z1 2 --zero 1
train save-w2z1 2 --zero 1 --max-steps 78 --checkpoint-dir "$tmp/ck" --checkpoint-every 78 \
    --dump-final "$tmp/saved.st"
# Each resume on its own copy: a run saves its last step, which the next --resume auto would take.
cp -r "$tmp/ck" "$tmp/ck-w3"
train resume-w3z3 3 --zero 3 --checkpoint-dir "$tmp/ck-w3" --resume auto --dump-init "$tmp/w3.st"
train resume-w1z0 1 --zero 0 --checkpoint-dir "$tmp/ck" --resume auto --dump-init "$tmp/w1.st"
# --init-from: the parameters only (training starts at step 0 with a fresh optimizer).
train init-w2z2 2 --zero 2 --init-from "$tmp/ck/step-000000000078" --max-steps 1 \
    --dump-init "$tmp/init.st"
grep -q "parameters from $tmp/ck/step-000000000078; optimizer state from scratch" \
    "$tmp/init-w2z2.log" || fail "--init-from: no line naming the checkpoint"
if n=$(python3 "$(dirname "$0")/same_tensors.py" "$tmp/saved.st" "$tmp/w3.st" "$tmp/w1.st" \
    "$tmp/init.st") && [[ $n -eq 6 ]]; then
    echo "  parameters loaded at world 3 (ZeRO-3), world 1 (ZeRO-0) and by --init-from at world 2" \
        "(ZeRO-2) = saved at world 2 (ZeRO-1): $n tensors, byte for byte"
else
    fail "parameters after a resharded load"
fi
ref=$(accuracy whole-w2z1)
for run in resume-w3z3 resume-w1z0; do
    acc=$(accuracy $run)
    if [[ -n $ref && -n $acc ]] &&
        python3 -c "import sys; sys.exit(abs($acc - $ref) > 0.5)"; then
        echo "  $run: test accuracy $acc% (uninterrupted world 2: $ref%)"
    else
        fail "$run: test accuracy '$acc'% vs '$ref'% uninterrupted (tolerance 0.5 pp)"
    fi
done

# 3. Refusals: another model or data order, or no checkpoint at all.
refuse() { # PATTERN ARGS...
    local pattern=$1
    shift
    local st=0
    timeout 60 "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" "${common[@]}" \
        --checkpoint-dir "$tmp/ck" "$@" >"$tmp/refuse.log" 2>&1 || st=$?
    if [[ $st -ne 2 ]] || ! grep -qE -- "$pattern" "$tmp/refuse.log"; then
        fail "$* exited with $st (want 2) or lacks /$pattern/:"
        tail -3 "$tmp/refuse.log" >&2
    else
        echo "  refused: $(grep -m1 -E -- "$pattern" "$tmp/refuse.log")"
    fi
}
refuse "seed 1, this run has 2" --resume auto --seed 2
refuse "global-batch 384, this run has 256" --resume auto --global-batch 256
refuse "fc1" --resume auto --hidden 64
refuse "$tmp/none" --resume "$tmp/none"
# Combinations parse_args() refuses, before any rank starts work.
for bad in "--micro-batch 64 --grad-accum 2|exclude each other" \
    "--checkpoint-every 10|needs --checkpoint-dir" "--resume auto|needs --checkpoint-dir" \
    "--micro-batch 100|not a multiple of world size x micro-batch"; do
    st=0
    "$TRAIN" ${bad%|*} >"$tmp/bad.log" 2>&1 || st=$?
    grep -q -- "${bad#*|}" "$tmp/bad.log" && [[ $st -eq 2 ]] || fail "ddp-train ${bad%|*}: exit $st"
done

finish
