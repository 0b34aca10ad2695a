#!/usr/bin/env bash
# compare.sh: ddp-train against PyTorch DDP on the same model, data, batch, optimizer and epochs,
# in one invocation: on the CPU (gloo) with this machine's single-thread sgemm rate to read both
# against (issue 9), or on GPUs (NCCL) in f32 and bf16 (issue 13).
#
#     bench/train/compare.sh [BUILD_DIR]          # BUILD_DIR defaults to ./build
#     FULL=1 bench/train/compare.sh               # ddp-train's default 15 epochs
#     DEVICE=cuda bench/train/compare.sh          # every GPU: f32 and bf16, both models
#
# DEVICE=cpu (the default) runs build/bench/sgemm once per model, then for every model
# (SHAPES), precision (PRECISIONS) and rank count (NPROCS), under `ddprun --standalone`:
# ddp-train --device cpu with its defaults and --epochs EPOCHS, then torch_ddp_mlp.py (the same job written for torch DDP, see its docstring) under
# current torch (PYTHON) and under Debian's torch 1.13 (PYTHON_LEGACY), each with one thread per
# rank. An interpreter without torch is reported as skipped. It prints one row per rank count,
# precision and implementation: samples/s over the training steps (evaluation and data loading
# excluded), ddp-train's samples/s over this row's (above 1: ddp-train is faster), the test
# accuracy after the last epoch, the model's GEMM FLOPs/s (flops per sample x samples/s) and
# that as a fraction of the limit, min(ranks, cores) x the single-thread sgemm rate (the 2048
# square, and the model's own GEMMs at the micro-batch 256 / ranks), then issue 9's targets.
#
# DEVICE=cuda passes --device cuda to both trainers (one GPU per rank, NCCL; see
# torch_ddp_mlp.py) and runs neither sgemm (its two limit columns read "-") nor an interpreter
# whose torch has no CUDA (PYTHON_LEGACY is off: Debian's 1.13 has none). The header names the
# GPUs, and the targets are issue 13's: ddp-train >= torch's samples/s at equal accuracy
# (within 0.5 points), per model, precision and rank count. No visible GPU: exit 2 before any
# run.
#
# bench/train/report.py prints the table from the logs in OUT (and prints it again later, e.g.
# for an OUT directory copied back from a GPU machine: python3 bench/train/report.py OUT).
#
# Before each run it waits (WAIT_QUIET) for other processes to use at most 10% of the CPU, and
# after it reports the share of the machine's CPU that processes other than the run used while
# it ran (from /proc/stat minus the run's own CPU time): above 10% the row is marked noisy.
#
# Settings (environment):
#   DEVICE         cpu or cuda (default cpu)
#   NPROCS         rank counts (default "1 2 4"; cuda: the number of visible GPUs)
#   PRECISIONS     precisions, f32 and/or bf16 (default "f32"; cuda: "f32 bf16")
#   SHAPES         models: "default" (784-512-512-10, or TRAIN_ARGS's --hidden and --layers)
#                  and/or HxL for --hidden H --layers L (default "default"; cuda:
#                  "default 4096x8"); HxL overrides TRAIN_ARGS's --hidden and --layers
#   EPOCHS         epochs of every run (default 2, cuda 5; FULL=1 makes it 15, ddp-train's
#                  default)
#   PYTHON         interpreter with current torch (default python3 from PATH)
#   PYTHON_LEGACY  interpreter with Debian's torch 1.13 (default /usr/bin/python3, cuda "";
#                  "" skips it)
#   TRAIN_ARGS     extra options for both trainers, e.g. "--lr 3e-4" (default ""); only
#                  --hidden, --layers, --seed, --lr, --warmup, --global-batch and --data mean
#                  the same to both
#   REPS           runs of each trainer per cell, alternating, the fastest shown (default 1;
#                  2 or 3 on a shared machine)
#   WAIT_QUIET     seconds to wait for a quiet machine before each run (default 20; cuda 0: a
#                  GPU's rate hardly depends on the host's other load, which is still reported)
#   OUT            directory for logs and JSON (default: a new one under ${TMPDIR:-/tmp})
#
# Exit status: 0 every run succeeded (the targets are reported, not enforced), 1 a run failed,
# 2 bad usage, missing programs or (cuda) no visible GPU.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:-build}
DEVICE=${DEVICE:-cpu}
usage() { echo "compare.sh: $*" >&2; exit 2; }
case $DEVICE in
cpu) precisions=f32 shapes=default epochs=2 legacy=/usr/bin/python3 wait_quiet=20 ;;
cuda) precisions="f32 bf16" shapes="default 4096x8" epochs=5 legacy="" wait_quiet=0 ;;
*) usage "DEVICE=$DEVICE: cpu or cuda" ;;
esac
PRECISIONS=${PRECISIONS:-$precisions}
SHAPES=${SHAPES:-$shapes}
if [[ ${FULL:-0} == 1 ]]; then EPOCHS=${EPOCHS:-15}; else EPOCHS=${EPOCHS:-$epochs}; fi
PYTHON=${PYTHON:-python3}
PYTHON_LEGACY=${PYTHON_LEGACY-$legacy}
TRAIN_ARGS=${TRAIN_ARGS:-}
WAIT_QUIET=${WAIT_QUIET:-$wait_quiet}
REPS=${REPS:-1}
for p in $PRECISIONS; do
    [[ $p == f32 || $p == bf16 ]] || usage "PRECISIONS: $p is not f32 or bf16"
done
for s in $SHAPES; do
    [[ $s == default || $s =~ ^[1-9][0-9]*x[1-9][0-9]*$ ]] ||
        usage "SHAPES: $s is not default or HxL"
done

ddprun=$BUILD/launcher/ddprun
trainer=$BUILD/worker/trainer/ddp-train
sgemm=$BUILD/bench/sgemm
needed=("$ddprun" "$trainer")
[[ $DEVICE == cpu ]] && needed+=("$sgemm")
for p in "${needed[@]}"; do
    [[ -x $p ]] || usage "$p not found; build first (ninja -C $BUILD)"
done
# The visible GPUs' names, one a line: from PYTHON's torch when it was built with CUDA (it counts
# as the trainers do, CUDA_VISIBLE_DEVICES applied), else from nvidia-smi -L.
gpus=
if [[ $DEVICE == cuda ]]; then
    if "$PYTHON" -c 'import torch, sys; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
        how="$PYTHON's torch.cuda.device_count()"
        gpus=$("$PYTHON" -c 'import torch
for i in range(torch.cuda.device_count()): print(torch.cuda.get_device_name(i))' 2>/dev/null) || :
    elif command -v nvidia-smi >/dev/null; then
        how="nvidia-smi -L"
        gpus=$(nvidia-smi -L 2>/dev/null | sed -n 's/^GPU [0-9]*: \(.*\) (UUID.*/\1/p') || :
    else
        how="no torch with CUDA in $PYTHON, no nvidia-smi"
    fi
    [[ -n $gpus ]] || usage "DEVICE=cuda: no GPU is visible ($how)"
    NPROCS=${NPROCS:-$(wc -l <<<"$gpus")}
    echo "# GPUs ($how): $(paste -sd, <<<"$gpus")" >&2
fi
NPROCS=${NPROCS:-"1 2 4"}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/train-compare.XXXXXX")}
mkdir -p "$OUT"
echo "$gpus" >"$OUT/gpus.txt"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

# The torch interpreters to run; one without torch (or, for cuda, without a GPU) is skipped.
torches=()
check='import torch; print(torch.__version__)'
[[ $DEVICE == cuda ]] && check="import torch; assert torch.cuda.is_available(); ${check#*; }"
for py in "$PYTHON" "$PYTHON_LEGACY"; do
    [[ -n $py ]] || continue
    if ver=$("$py" -c "$check" 2>/dev/null); then
        torches+=("$py")
        echo "# torch $ver: $py" >&2
    else
        why="no torch"
        [[ $DEVICE == cuda ]] && why="no torch that sees a GPU"
        echo "# skipped: $py has $why" >&2
        echo "skipped $py ($why)" >>"$OUT/skipped.txt"
    fi
done

# run NAME CMD... and the CPU-load bookkeeping (lib.sh).
# shellcheck source=bench/train/lib.sh
. "$here/lib.sh"

echo "# compare.sh: DEVICE=$DEVICE, NPROCS='$NPROCS', PRECISIONS='$PRECISIONS', SHAPES='$SHAPES'," \
    "EPOCHS=$EPOCHS, REPS=$REPS, TRAIN_ARGS='$TRAIN_ARGS'; logs in $OUT" >&2
# What the report needs to know besides the runs' own output (report.py reads it).
printf '%s\n' "device=$DEVICE" "nprocs=$NPROCS" "precisions=$PRECISIONS" "epochs=$EPOCHS" \
    "reps=$REPS" "ntorch=${#torches[@]}" "cores=$(getconf _NPROCESSORS_ONLN)" \
    "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)" >"$OUT/settings.txt"
: >"$OUT/busy.txt"
opt() { sed -n "s/.*$1[ =]\([0-9]*\).*/\1/p" <<<"$TRAIN_ARGS"; }
gb=$(opt --global-batch)
# "label hidden layers" of each model, for the report.
: >"$OUT/shapes.txt"
for s in $SHAPES; do
    if [[ $s == default ]]; then h=$(opt --hidden) l=$(opt --layers); else h=${s%x*} l=${s#*x}; fi
    echo "$s ${h:-512} ${l:-2}" >>"$OUT/shapes.txt"
done
mapfile -t models <"$OUT/shapes.txt"
if [[ $DEVICE == cpu ]]; then
    # The model rows of sgemm: the micro-batch of each rank count at the global batch.
    batches=$(for n in $NPROCS; do echo $((${gb:-256} / n)); done | paste -sd,)
    for sh in "${models[@]}"; do
        read -r s h l <<<"$sh"
        run "sgemm.$s" "$sgemm" --json --batch "$batches" --hidden "$h" --layers "$l"
    done
    # Every trainer on the OpenBLAS kernels sgemm ran with: ddp-train picks fast ones where
    # OpenBLAS does not know the CPU (worker/trainer/mlp.h), and Debian's torch 1.13 computes on the
    # same OpenBLAS, which would otherwise run its slow fallback there.
    core=$(sed -n 's/.*"core": "\([A-Za-z0-9]*\)".*/\1/p' "$OUT"/sgemm.*.out | tail -n 1)
    [[ -n $core ]] && export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$core}
fi
for sh in "${models[@]}"; do
    read -r s h l <<<"$sh"
    shape=()
    [[ $s == default ]] || shape=(--hidden "$h" --layers "$l")
    for p in $PRECISIONS; do
        for n in $NPROCS; do
            for ((r = 1; r <= REPS; r++)); do
                k=$s.$p.$n.$r
                # shellcheck disable=SC2086 # TRAIN_ARGS is a list of options
                run "ours.$k" "$ddprun" --standalone --nproc-per-node "$n" --no-prefix "$trainer" \
                    --device "$DEVICE" --precision "$p" --epochs "$EPOCHS" $TRAIN_ARGS \
                    "${shape[@]}" --metrics "$OUT/ours.$k.jsonl"
                for i in "${!torches[@]}"; do
                    # shellcheck disable=SC2086
                    run "torch$i.$k" "$ddprun" --standalone --nproc-per-node "$n" --no-prefix \
                        "${torches[$i]}" "$here/torch_ddp_mlp.py" --device "$DEVICE" \
                        --precision "$p" --epochs "$EPOCHS" $TRAIN_ARGS "${shape[@]}"
                done
            done
        done
    done
done

python3 "$here/report.py" "$OUT"
exit $failed
