#!/usr/bin/env bash
# libcollective's nccl backend on real GPUs, checked by coll-bench (-c 1: every output element
# compared with the expected reduction; "# Out of bounds values : 0 OK" and exit 0 wanted).
#  1. World 1 (one process, its own store): every collective, out of place and in place
#     (-I), f32 sum over 8 B .. 8 MiB; then allreduce and reduce_scatter over the other types
#     and reductions that map onto NCCL differently (bf16 and f16 avg: ncclAvg's pre-multiplied
#     sum; i32 avg: its truncating post-division; f64 max, u8 min, i64 prod).
#  2. With two GPUs or more: the same collectives (f32 sum, bf16 avg) on one rank per GPU
#     under ddprun, where the ranks' blocks and the averaging really differ.
# Exits 77 where coll-bench cannot make an nccl communicator (no GPU, or built without NCCL
# or CUDA). Every run is bounded by timeout(1).
# Usage: run_nccl.sh COLL_BENCH DDPRUN
# Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 COLL_BENCH DDPRUN"; exit 2; }
bench=$(readlink -f "$1")
ddprun=$(readlink -f "$2")
[ -x "$bench" ] && [ -x "$ddprun" ] || { echo "skip: $1 or $2 missing"; exit 77; }
command -v timeout >/dev/null || { echo "skip: no timeout(1)"; exit 77; }
# World 1 runs alone only without the torchrun environment.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

st=0
timeout -k 10 120 "$bench" allreduce -B nccl -b 8 -e 8 -n 1 -w 0 >"$tmp/probe" 2>&1 || st=$?
if [ $st = 3 ] && grep -Eq "Operation not supported|without CUDA" "$tmp/probe"; then
    echo "skip: $(grep -m1 coll-bench: "$tmp/probe")"
    exit 77
fi

# one NAME LAUNCH... -- ARGS: a coll-bench run, which must exit 0 with no wrong element.
one() {
    local name=$1 st=0
    shift
    local launch=()
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    timeout -k 10 300 "${launch[@]}" "$bench" "$@" -B nccl >"$tmp/out" 2>&1 || st=$?
    if [ $st = 0 ] && grep -q "^# Out of bounds values : 0 OK" "$tmp/out"; then
        echo "ok: $name: $(grep -c '^  ' "$tmp/out") sizes, 0 wrong"
    else
        echo "FAIL: $name: exit $st"
        tail -15 "$tmp/out"
        fails=$((fails + 1))
    fi
}

sizes=(-b 8 -e 8M -f 8 -n 5 -w 1)
colls=(allreduce reduce_scatter allgather broadcast reduce)
for c in "${colls[@]}"; do
    one "world 1 $c f32" -- "$c" "${sizes[@]}"
    one "world 1 $c f32 in place" -- "$c" "${sizes[@]}" -I
done
for c in allreduce reduce_scatter; do
    for t in "bf16 avg" "f16 avg" "i32 avg" "f64 max" "u8 min" "i64 prod"; do
        set -- $t
        one "world 1 $c $1 $2" -- "$c" "${sizes[@]}" -d "$1" -o "$2"
    done
done

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -ge 2 ]; then
    run=("$ddprun" --standalone --nproc-per-node "$ngpu" --no-prefix)
    for c in "${colls[@]}"; do
        one "world $ngpu $c f32" "${run[@]}" -- "$c" "${sizes[@]}"
        one "world $ngpu $c f32 in place" "${run[@]}" -- "$c" "${sizes[@]}" -I
    done
    for c in allreduce reduce_scatter; do
        one "world $ngpu $c bf16 avg" "${run[@]}" -- "$c" "${sizes[@]}" -d bf16 -o avg
    done
else
    echo "note: one GPU, so only world 1 ran (NCCL takes one rank per GPU)"
fi
[ $fails = 0 ] || { echo "$fails run(s) failed"; exit 1; }
echo "all passed"
