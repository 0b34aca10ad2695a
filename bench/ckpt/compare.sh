#!/usr/bin/env bash
# compare.sh: libddp's checkpoint save and load against the disk and against PyTorch, in one
# invocation (issue 12, point 7).
#
#     bench/ckpt/compare.sh [BUILD_DIR]           # BUILD_DIR defaults to ./build
#
# First the disk's sequential write rate: dd of DD_MB MiB with oflag=direct and conv=fsync into
# the checkpoint directory. Then, for each model in MODELS ("HIDDEN:LAYERS") and each rank count
# in NPROCS, under `ddprun --standalone --nproc-per-node N --no-prefix`: ckpt-bench (libddp:
# synchronous save, load, and the training stall of an asynchronous save; see ckpt-bench.c),
# then torch_ckpt.py under PYTHON (torch.save and torch.distributed.checkpoint of the same
# tensors; see its docstring). It prints one row per model and rank count: MB/s of each, our
# save rate over dd's, over torch.save's and over dcp's (above 1: ours is faster), and what an
# asynchronous save cost the loop as a share of the synchronous save (the issue's target: at most
# 5%): the loop's time difference (stall%) and the time the calls themselves blocked (blocked%:
# the save call, the step's wait for the writer's copy, the polls, the final wait). On a machine
# with fewer cores than ranks plus writer threads, stall% also holds the writers' CPU time.
#
# Settings (environment):
#   MODELS   "HIDDEN:LAYERS" list (default "256:2 4096:8": ddp-train's default MLP and the
#            larger one)
#   NPROCS   rank counts (default "1 2 4")
#   ZERO     ZeRO stage of ckpt-bench's model (default 3: the least memory per rank; every stage
#            writes the same bytes, each rank its 1/N)
#   REPS     saves and loads timed per cell, best kept (default 3)
#   BATCH    micro-batch of ckpt-bench's forward and backward per step (default 32; 0: constant
#            gradients, no compute, which leaves the copy nothing to hide behind)
#   DD_MB    MiB that dd writes (default 1024)
#   PYTHON   interpreter with torch (default python3); without torch its columns say "-"
#   DIR      where checkpoints are written (default: a new directory under ${TMPDIR:-/tmp},
#            removed at the end)
#
# Exit status: 0 every run succeeded (the target is reported, not enforced), 1 a run failed,
# 2 missing programs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:-build}
MODELS=${MODELS:-"256:2 4096:8"}
NPROCS=${NPROCS:-"1 2 4"}
ZERO=${ZERO:-3}
REPS=${REPS:-3}
BATCH=${BATCH:-32}
DD_MB=${DD_MB:-1024}
PYTHON=${PYTHON:-python3}
ddprun=$BUILD/launcher/ddprun
bench=$BUILD/bench/ckpt-bench
for p in "$ddprun" "$bench"; do
    [[ -x $p ]] || { echo "compare.sh: $p not found; build first (ninja -C $BUILD)" >&2; exit 2; }
done
made_dir=0
if [[ -z ${DIR:-} ]]; then
    DIR=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-compare.XXXXXX")
    made_dir=1
fi
cleanup() { if [[ $made_dir == 1 ]]; then rm -rf "$DIR"; fi; }
trap cleanup EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
have_torch=1
"$PYTHON" -c 'import torch' 2>/dev/null || have_torch=0

# dd prints "... copied, 0.418 s, 1.3 GB/s": convert the rate to MB/s.
dd_line=$(dd if=/dev/zero of="$DIR/dd.bin" bs=1M count="$DD_MB" oflag=direct conv=fsync 2>&1 |
    tail -n 1)
rm -f "$DIR/dd.bin"
dd_mbps=$(awk '{v = $(NF - 1); u = $NF; if (u == "GB/s") v *= 1000; else if (u == "kB/s") v /= 1000;
               print v}' <<<"$dd_line")
echo "disk: dd $DD_MB MiB oflag=direct conv=fsync into $DIR: $dd_mbps MB/s ($dd_line)"
echo "model: ddp-train's MLP with AdamW (3 float32 arrays of the parameters' size); ckpt-bench at ZeRO-$ZERO, micro-batch $BATCH"
echo
printf '%-10s %5s %8s | %9s %9s %9s %7s %8s %7s | %9s %9s %9s %9s | %6s %6s %6s\n' \
    model ranks MB save_MB/s load_MB/s stall_ms stall% blocked% steps \
    tsave tload dcpsave dcpload 'xdd' 'xtorch' 'xdcp'
status=0
for model in $MODELS; do
    h=${model%%:*} l=${model##*:}
    for n in $NPROCS; do
        rm -rf "${DIR:?}"/*
        if ! ours=$("$ddprun" --standalone --nproc-per-node "$n" --no-prefix "$bench" \
                --dir "$DIR/ours" --hidden "$h" --layers "$l" --zero "$ZERO" --reps "$REPS" --batch "$BATCH" |
                tail -n 1); then
            echo "compare.sh: ckpt-bench failed at $n ranks, model $model" >&2
            status=1
            continue
        fi
        rm -rf "${DIR:?}"/*
        theirs='{}'
        if [[ $have_torch == 1 ]]; then
            theirs=$("$ddprun" --standalone --nproc-per-node "$n" --no-prefix "$PYTHON" \
                "$here/torch_ckpt.py" --dir "$DIR/torch" --hidden "$h" --layers "$l" \
                --reps "$REPS" | tail -n 1) || { theirs='{}'; status=1; }
        fi
        "$PYTHON" - "$model" "$n" "$dd_mbps" "$ours" "$theirs" <<'PY'
import json, sys
model, n, dd, ours, theirs = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5])
f = lambda v: "-" if v is None else f"{v:.0f}"
r = lambda a, b: "-" if not a or not b else f"{a / b:.2f}"
o = ours
print(f"{model:<10} {n:>5} {o['mb']:8.1f} | {o['sync_mbps']:9.0f} {o['load_mbps']:9.0f} "
      f"{o['stall_ms']:9.1f} {o['stall_pct_of_sync']:6.1f}% {o['blocked_pct_of_sync']:7.1f}% "
      f"{o['steps']:7d} | "
      f"{f(theirs.get('torch_save_mbps')):>9} {f(theirs.get('torch_load_mbps')):>9} "
      f"{f(theirs.get('dcp_save_mbps')):>9} {f(theirs.get('dcp_load_mbps')):>9} | "
      f"{r(o['sync_mbps'], dd):>6} {r(o['sync_mbps'], theirs.get('torch_save_mbps')):>6} "
      f"{r(o['sync_mbps'], theirs.get('dcp_save_mbps')):>6}")
PY
    done
done
echo
echo "MB: the bytes of one checkpoint (every rank's files). save/load: MB/s (load may come from"
echo "the page cache). stall: what one asynchronous save cost the training loop (ms and share of"
echo "a synchronous save; target <= 5%); blocked: the share the calls themselves blocked (the"
echo "save, the optimizer's wait for the writer's copy, the final wait). tsave/tload/dcpsave/"
echo "dcpload: torch.save/torch.load and torch.distributed.checkpoint MB/s of the same tensors."
echo "x*: our save MB/s over dd's, over torch.save's, over dcp's."
exit $status
