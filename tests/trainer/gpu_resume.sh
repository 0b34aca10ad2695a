#!/usr/bin/env bash
# ddp-train's checkpoints on the GPU (--device cuda), every run on the first GPU: libddp's
# asynchronous save of device state, whose completion each ddp_step() polls without waiting
# for the device (libddp(3), THE DEVICE PATH), and the load back into device memory at the
# same and at other world sizes and stages. Exits 77 where no GPU is visible or ddp-train was
# built without CUDA. Every run is bounded by timeout(1); about a minute on one GPU.
# The settings are tests/trainer/resume.sh's: --hidden 128, a global batch of 384 in micro-batches
# of 64 (6, 3 or 2 micro-steps per rank at worlds 1, 2 and 3), one epoch (156 steps), AdamW at
# a constant rate after 10 warmup steps (a cosine decay would span each leg's own length).
#  1. World 1 (NCCL when libcollective has it, else the cpu backend on device buffers):
#     --checkpoint-every 50 under `ddprun --max-restarts 1` with the rank SIGKILLed after step
#     140 (DDP_TRAIN_TEST_KILL, first attempt only), so that no ddp_checkpoint_wait() ran
#     between the save of step 100 and the kill: the restarted job resumes from step 100 when
#     that save was completed by the polls of the 40 steps after it, else (a disk too slow to
#     write 1.4 MB in 40 steps) from step 50, which the save of step 100 waited for; either is
#     right, the one taken is printed.
#  2. The same at world 2 and ZeRO-2, the two ranks sharing the GPU through the cpu backend on
#     device buffers (NCCL allows one rank per GPU), rank 1 killed.
#     In 1 and 2 the final parameters (--dump-final) must equal the uninterrupted run's byte
#     for byte: the load restores the state exactly (step count, optimizer moments, the data
#     order's position), and the steps after it are deterministic on one GPU: cuBLAS gives the
#     same bits run after run on the same GPU and toolkit (with CUBLAS_WORKSPACE_CONFIG fixed,
#     as its documentation asks when several streams are active), libddp's kernels and the
#     gradient norm sum in a fixed order, and the reductions of the cpu backend and of NCCL at
#     world 1 do not depend on timing. The only atomics (the loss sums) feed the printed loss,
#     not the gradients.
#  3. Resharded: a checkpoint saved at world 2, ZeRO-2 (step 78) resumes at world 3, ZeRO-3 and
#     at world 1, ZeRO-1, on the same GPU: the parameters right after the load (--dump-init)
#     are exactly the saved ones (--dump-final of the saving run), and the test accuracy at the
#     end is the uninterrupted world-2 run's within 0.5 percentage points: the layouts only
#     change the order of float sums (micro-steps, reduction), ~1e-7 relative per step, ~1e-5
#     in the parameters after 78 AdamW steps, which moves a handful of the 10,000 test images
#     across a decision boundary (0.01 points each).
# Usage: gpu_resume.sh DDPRUN DDP_TRAIN
# Exit: 0 pass, 1 fail, 77 skipped (no GPU, a build without CUDA, no Fashion-MNIST, no python3).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data
need_python

need_cuda_trainer "$TRAIN"
# The first GPU (as tests/trainer/gpu.sh chooses it) for every run.
if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then
    export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%%,*}
else
    gpu=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | head -1)
    export CUDA_VISIBLE_DEVICES=${gpu:-0}
fi
export CUBLAS_WORKSPACE_CONFIG=:4096:8

common=(--device cuda --hidden 128 --global-batch 384 --micro-batch 64 --epochs 1
    --schedule constant --warmup 10 --optimizer adamw --lr 0.002)
# train NAME WORLD ARGS...: a job under ddprun that must succeed (restarted once when
# DDP_TRAIN_TEST_KILL kills a rank); its output in $tmp/NAME.log.
train() {
    local name=$1 world=$2 st=0
    shift 2
    timeout 300 "$DDPRUN" --standalone --nproc-per-node "$world" \
        --max-restarts "$([[ -n ${DDP_TRAIN_TEST_KILL:-} ]] && echo 1 || echo 0)" --no-prefix \
        "$TRAIN" "${common[@]}" "$@" >"$tmp/$name.log" 2>&1 || st=$?
    if [[ $st -ne 0 ]]; then
        fail "$name: ddprun exited with $st"
        tail -5 "$tmp/$name.log" >&2
    fi
}

# 1. and 2.: kill_resume NAME WORLD VICTIM ARGS...
kill_resume() {
    local name=$1 world=$2 victim=$3
    shift 3
    train "whole-$name" "$world" "$@" --dump-final "$tmp/whole-$name.st"
    DDP_TRAIN_TEST_KILL=$victim:140 train "kill-$name" "$world" "$@" \
        --checkpoint-dir "$tmp/ck-$name" --checkpoint-every 50 --resume auto \
        --dump-final "$tmp/kill-$name.st"
    local log=$tmp/kill-$name.log from backend
    from=$(grep -oE "resuming from $tmp/ck-$name/step-0*(100|50) at step (100|50) " "$log" |
        grep -oE "at step [0-9]+" | grep -oE "[0-9]+")
    backend=$(grep -m1 -oE "(nccl|cpu) backend" "$log")
    if [[ -z $from ]]; then
        fail "$name: the restarted job did not resume from step 100 or 50"
        grep -m3 -E "resum|checkpoint" "$log" >&2
    elif ! cmp -s "$tmp/whole-$name.st" "$tmp/kill-$name.st"; then
        fail "$name ($backend): the resumed run's final parameters differ from the uninterrupted run's"
    else
        echo "  $name ($backend): rank $victim killed at step 140, resumed from step $from" \
            "$([[ $from == 100 ]] && echo "(completed by the steps' polls alone)"):" \
            "final parameters identical to the uninterrupted run's, byte for byte"
    fi
}
kill_resume w1 1 0
kill_resume w2z2 2 1 --zero 2
grep -q "cpu backend" "$tmp/kill-w2z2.log" || fail "2 ranks on one GPU: not the cpu backend"

# 3. Resharded: saved at world 2, ZeRO-2; loaded at world 3, ZeRO-3 and world 1, ZeRO-1.
train save-w2z2 2 --zero 2 --max-steps 78 --checkpoint-dir "$tmp/ck" --checkpoint-every 78 \
    --dump-final "$tmp/saved.st"
# Each resume on its own copy: a run saves its last step, which the next --resume auto would take.
cp -r "$tmp/ck" "$tmp/ck-w3"
train resume-w3z3 3 --zero 3 --checkpoint-dir "$tmp/ck-w3" --resume auto --dump-init "$tmp/w3.st"
train resume-w1z1 1 --zero 1 --checkpoint-dir "$tmp/ck" --resume auto --dump-init "$tmp/w1.st"
for run in resume-w3z3 resume-w1z1; do
    grep -q "resuming from $tmp/ck[-w3]*/step-000000000078 at step 78 " "$tmp/$run.log" ||
        fail "$run: no line saying it resumes from step 78"
done
if n=$(python3 "$(dirname "$0")/same_tensors.py" "$tmp/saved.st" "$tmp/w3.st" "$tmp/w1.st"); then
    echo "  parameters loaded into the GPU at world 3 (ZeRO-3) and world 1 (ZeRO-1) = saved at" \
        "world 2 (ZeRO-2): $n tensors, byte for byte"
else
    fail "parameters after a resharded load"
fi
ref=$(accuracy whole-w2z2)
for run in resume-w3z3 resume-w1z1; do
    acc=$(accuracy $run)
    if [[ -n $ref && -n $acc ]] &&
        python3 -c "import sys; sys.exit(abs($acc - $ref) > 0.5)"; then
        echo "  $run: test accuracy $acc% (uninterrupted world 2, ZeRO-2: $ref%)"
    else
        fail "$run: test accuracy '$acc'% vs '$ref'% uninterrupted (tolerance 0.5 points)"
    fi
done

finish
