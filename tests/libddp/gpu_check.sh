#!/usr/bin/env bash
# libddp with the model on GPUs, through ddp-check under ddprun (tests/libddp/ddp-check.c says
# what each scenario checks and its tolerances). Exits 77 where no GPU is visible, or
# ddp-check was built without CUDA. Each run is bounded by timeout(1); a few minutes on one GPU.
#  1. equiv-device: the equivalence and bf16 scenarios with the model in device memory and the
#     cpu backend on device buffers, every ZeRO stage, SGD and AdamW, f32 and bf16, against the
#     same double reference as on the host: world 1, and world 2 (two ranks sharing GPU 0 when
#     there is one GPU: LOCAL_RANK modulo the devices);
#  2. equiv-nccl: the same on the nccl backend, world 1 (when libcollective has NCCL).
# Usage: gpu_check.sh DDPRUN DDP_CHECK
# Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
DDPRUN=${1:?usage}; CHECK=${2:?usage}
ngpu=$("$CHECK" gpu-count) || { echo "FAIL: ddp-check gpu-count"; exit 1; }
[[ $ngpu -gt 0 ]] || { echo "SKIP: no CUDA device visible (or ddp-check built without CUDA)"; exit 77; }
. "$(dirname "$0")/lib.sh"
for job in "equiv-device 1" "equiv-device 2" "equiv-nccl 1"; do
    set -- $job
    out=$(timeout 300 "$DDPRUN" --standalone --nproc-per-node "$2" "$CHECK" "$1" 2>&1)
    if grep -q "ddp-check: SKIP" <<<"$out"; then
        grep -m1 "ddp-check: SKIP" <<<"$out" | sed 's/^\[[0-9]*\]:/  /'
        continue
    fi
    n=$(grep -c "ddp-check: rank [0-9]*/$2 $1: PASS" <<<"$out")
    if [[ $n -ne $2 ]]; then
        fail "ddp-check $1 on $2 ranks: $n of $2 passed"
        sed 's/^/    /' <<<"$out" >&2
    fi
    grep -E "^\[0\]:ddp-check: (equiv|bf16) world [0-9] on GPU.*: worst" <<<"$out" | sed 's/^\[0\]:/  /'
done
finish
