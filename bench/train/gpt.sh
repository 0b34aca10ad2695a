#!/usr/bin/env bash
# gpt.sh: ddp-train --model gpt against PyTorch DDP on the same GPT, text, batch, optimizer and
# steps, in one invocation on the CPU (gloo, one thread per rank), with this machine's
# single-thread sgemm rate to read both against (issue 25, point 6).
#
#     bench/train/gpt.sh [BUILD_DIR]              # BUILD_DIR defaults to ./build
#     REPS=3 bench/train/gpt.sh build             # a shared machine: medians of 3
#     QUICK=1 bench/train/gpt.sh build            # the harness only: a tiny GPT, a few steps
#
# It runs build/bench/sgemm --model gpt once (the 2048 square and the model's own GEMMs at each
# rank count's micro-batch), then for every rank count (NPROCS) and repetition (REPS),
# alternating, under `ddprun --standalone --nproc-per-node N --no-prefix`:
#   ours   ddp-train --model gpt --device cpu ARGS --metrics ...
#   torch  python3 bench/train/torch_ddp_gpt.py ARGS   (the same job in torch, see its docstring)
# where ARGS are the options both take alike: --global-batch, --max-steps, --lr, --warmup and
# TRAIN_ARGS. bench/train/gpt_report.py prints the table: per rank count and implementation the
# median tokens/s over the training steps (evaluation and data loading excluded), ddp-train's
# over this row's, the validation loss and bits per byte after the same steps, the model's
# FLOPs/s (flops per token x tokens/s) and that as a fraction of min(ranks, cores) x the
# single-thread sgemm rate (the square's, and the model GEMMs' own), the other processes' CPU;
# then issue 25's targets (reported, not enforced). The model's flops per token are its GEMMs'
# 6 (12 L C^2 + 256 C) + 12 L T C (sgemm.c).
#
# Settings (environment):
#   NPROCS         rank counts (default "1 2")
#   STEPS          optimizer steps of every run (default 300; QUICK=1: 4)
#   GLOBAL_BATCH   sequences per step (default 64)
#   LR, WARMUP     peak learning rate and warmup steps (default 3e-3 and 20)
#   TRAIN_ARGS     more options for both trainers (default ""; QUICK=1: a 1-layer width-32 GPT
#                  on a short context); only --layers, --width, --heads, --seq-len, --seed,
#                  --weight-decay and --data mean the same to both
#   REPS           runs of each trainer per rank count, alternating; the median is shown
#                  (default 1)
#   PYTHON         interpreter with torch (default python3 from PATH)
#   PYTHON_LEGACY  a second one, e.g. /usr/bin/python3 (Debian's torch 1.13, written attention);
#                  default "": not run
#   WAIT_QUIET     seconds to wait for a quiet machine before each run (default 20; QUICK=1: 0)
#   OUT            directory for logs and JSON (default: a new one under ${TMPDIR:-/tmp},
#                  removed at the end with QUICK=1)
#
# Exit status: 0 every run succeeded (the targets are reported, not enforced), 1 a run failed,
# 2 bad usage or missing programs, 77 (QUICK=1 only) no python with torch.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:-build}
usage() { echo "gpt.sh: $*" >&2; exit 2; }
quick=${QUICK:-0}
if [[ $quick == 1 ]]; then
    steps=4 args="--layers 1 --width 32 --heads 2 --seq-len 32" wait_quiet=0
else
    steps=300 args="" wait_quiet=20
fi
NPROCS=${NPROCS:-"1 2"}
STEPS=${STEPS:-$steps}
GLOBAL_BATCH=${GLOBAL_BATCH:-64}
LR=${LR:-3e-3}
WARMUP=${WARMUP:-20}
TRAIN_ARGS=${TRAIN_ARGS-$args}
REPS=${REPS:-1}
PYTHON=${PYTHON:-python3}
PYTHON_LEGACY=${PYTHON_LEGACY:-}
WAIT_QUIET=${WAIT_QUIET:-$wait_quiet}
for v in STEPS GLOBAL_BATCH REPS WAIT_QUIET; do
    [[ ${!v} =~ ^[0-9]+$ ]] || usage "$v=${!v}: not a whole number"
done
((STEPS >= 1 && GLOBAL_BATCH >= 1 && REPS >= 1)) || usage "STEPS, GLOBAL_BATCH and REPS are >= 1"
for n in $NPROCS; do
    [[ $n =~ ^[1-9][0-9]*$ ]] || usage "NPROCS: $n is not a rank count"
    ((GLOBAL_BATCH % n == 0)) || usage "GLOBAL_BATCH=$GLOBAL_BATCH is not a multiple of $n ranks"
done

ddprun=$BUILD/launcher/ddprun
trainer=$BUILD/worker/trainer/ddp-train
sgemm=$BUILD/bench/sgemm
for p in "$ddprun" "$trainer" "$sgemm"; do
    [[ -x $p ]] || usage "$p not found; build first (ninja -C $BUILD)"
done
if [[ -z ${OUT:-} ]]; then
    OUT=$(mktemp -d "${TMPDIR:-/tmp}/train-gpt.XXXXXX")
    # QUICK=1 (meson's smoke test) leaves nothing behind; a failed run's stderr is shown.
    [[ $quick == 1 ]] && trap 'rm -rf "$OUT"' EXIT
fi
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

torches=()
for py in "$PYTHON" "$PYTHON_LEGACY"; do
    [[ -n $py ]] || continue
    if ver=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
        torches+=("$py")
        echo "# torch $ver: $py" >&2
    else
        echo "# skipped: $py has no torch" >&2
        echo "skipped $py (no torch)" >>"$OUT/skipped.txt"
    fi
done
if ((${#torches[@]} == 0)) && [[ $quick == 1 ]]; then
    echo "SKIP: no python with torch" >&2
    exit 77
fi

# run NAME CMD... and the CPU-load bookkeeping (lib.sh).
# shellcheck source=bench/train/lib.sh
. "$here/lib.sh"

# The options both trainers read alike; the model's shape as ddp-train's defaults unless given.
common=(--global-batch "$GLOBAL_BATCH" --max-steps "$STEPS" --lr "$LR" --warmup "$WARMUP")
opt() { sed -n "s/.*$1[ =]\([0-9]*\).*/\1/p" <<<"$TRAIN_ARGS"; }
layers=$(opt --layers) width=$(opt --width) heads=$(opt --heads) seq=$(opt --seq-len)
shape=(--layers "${layers:-4}" --width "${width:-128}" --heads "${heads:-4}" --seq-len "${seq:-128}")

echo "# gpt.sh: NPROCS='$NPROCS', STEPS=$STEPS, GLOBAL_BATCH=$GLOBAL_BATCH, LR=$LR," \
    "WARMUP=$WARMUP, REPS=$REPS, TRAIN_ARGS='$TRAIN_ARGS'; logs in $OUT" >&2
printf '%s\n' "nprocs=$NPROCS" "steps=$STEPS" "global_batch=$GLOBAL_BATCH" "lr=$LR" \
    "warmup=$WARMUP" "reps=$REPS" "ntorch=${#torches[@]}" "train_args=$TRAIN_ARGS" \
    "cores=$(getconf _NPROCESSORS_ONLN)" "load=$(cut -d' ' -f1-3 /proc/loadavg)" \
    "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)" >"$OUT/settings.txt"
: >"$OUT/busy.txt"

batches=$(for n in $NPROCS; do echo $((GLOBAL_BATCH / n)); done | paste -sd,)
sg=(--json --model gpt --batch "$batches" "${shape[@]}")
[[ $quick == 1 ]] && sg+=(--square 256 --reps 1 --ms 20)
run sgemm "$sgemm" "${sg[@]}"
# Every trainer on the OpenBLAS kernels sgemm ran with (see compare.sh).
core=$(sed -n 's/.*"core": "\([A-Za-z0-9]*\)".*/\1/p' "$OUT/sgemm.out")
[[ -n $core ]] && export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-$core}

for ((r = 1; r <= REPS; r++)); do
    for n in $NPROCS; do
        k=$n.$r
        # shellcheck disable=SC2086 # TRAIN_ARGS is a list of options
        run "ours.$k" "$ddprun" --standalone --nproc-per-node "$n" --no-prefix "$trainer" \
            --model gpt --device cpu "${common[@]}" $TRAIN_ARGS --log-every 50 \
            --metrics "$OUT/ours.$k.jsonl"
        for i in "${!torches[@]}"; do
            # shellcheck disable=SC2086
            run "torch$i.$k" "$ddprun" --standalone --nproc-per-node "$n" --no-prefix \
                "${torches[$i]}" "$here/torch_ddp_gpt.py" "${common[@]}" $TRAIN_ARGS
        done
    done
done
echo "load_after=$(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/settings.txt"

python3 "$here/gpt_report.py" "$OUT"
exit $failed
