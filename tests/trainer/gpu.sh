#!/usr/bin/env bash
# ddp-train on GPUs (--device cuda). Exits 77 where no GPU is visible or ddp-train was built
# without CUDA. Every run is bounded by timeout(1); a few minutes in all on one GPU.
#  1. CUDA f32 against CPU f32: 20 SGD steps, the loss of every step (--log-every 1) within
#     1e-3 relative. Both compute in f32 with f32 accumulation; they differ only in the order
#     of the sums (cuBLAS's kernels against OpenBLAS's), about 1e-6 relative per product, which
#     20 steps on this smooth loss do not grow past 1e-4: 1e-3 is a tenfold margin that a wrong
#     kernel (a missing bias, a transposed product) exceeds at the first step. Also with
#     --grad-accum 4, where each step's gradient is added up over four backward passes: a
#     product that overwrites its gradient instead of adding to it fails from the second step.
#  2. bf16 against f32 on the GPU: test accuracy after 3 epochs within 0.5 points.
#  3. NCCL, world 1 (when libcollective has NCCL): ZeRO-0 and ZeRO-3 against the CPU's losses
#     as in 1.
#  4. Several ranks sharing one GPU (2 ranks on the first GPU: the cpu backend on device
#     buffers, as NCCL allows one rank per GPU), every ZeRO stage, against world 1's losses on
#     the same GPU within 1e-3 relative (the reduction adds in another order). There
#     --backend nccl fails (exit 2) naming the two ranks. With two GPUs or more and NCCL, each
#     rank shown only its own GPU through CUDA_VISIBLE_DEVICES (as Slurm does): the ranks tell
#     by the GPUs' UUIDs that none is shared and take NCCL, against world 1's losses likewise.
#  5. A rank killed mid-step (DDP_TRAIN_TEST_KILL: rank 1 SIGKILLs itself after step 3): the
#     survivor exits 1 naming rank 1 within the communicator's timeout plus a margin. With two
#     GPUs or more the ranks use NCCL (libcollective's watchdog path), else the cpu backend on
#     one GPU. Ranks started by hand on ddp-rendezvous, as tests/libddp/run_ddp.sh does.
# The GPUs used are those CUDA_VISIBLE_DEVICES lists when it is set (a CI job's share of the
# machine), else every GPU nvidia-smi lists; "the first GPU" is the first of them.
# The GPT's GPU checks are gpt_cuda.sh (test ddp-gpt-gpu) and test_gpt_cuda.c (gpt-cuda), in
# the same gpu suite: `meson test -C build --suite gpu` runs them all.
# Usage: gpu.sh DDPRUN DDP_TRAIN DDP_RENDEZVOUS
# Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}; RDZV=${3:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data

need_cuda_trainer "$TRAIN"
if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then
    IFS=, read -ra gpus <<<"$CUDA_VISIBLE_DEVICES"
else
    mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null)
fi
[[ ${#gpus[@]} -gt 0 ]] || gpus=(0) # the probe found one
ngpu=${#gpus[@]}

steps=(--max-steps 20 --log-every 1 --optimizer sgd --lr 0.05 --warmup 0)
run() { # NAME WORLD ARGS...
    local name=$1 world=$2
    shift 2
    local st=0
    timeout 300 "$DDPRUN" --standalone --nproc-per-node "$world" --no-prefix "$TRAIN" \
        --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1 || st=$?
    if [[ $st -ne 0 ]]; then
        fail "ddp-train $name exited with $st"
        tail -5 "$tmp/$name.log" >&2
    fi
}
# compare REF TOL NAME...: every run's per-step losses against REF's.
compare() {
    python3 - "$tmp" "$@" <<'PY'
import json, sys
tmp, ref, tol, names = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
def losses(n):
    return [r["loss"] for r in map(json.loads, open(f"{tmp}/{n}.jsonl")) if "loss" in r]
r = losses(ref)
assert len(r) == 20, (ref, r)
bad = 0
for n in names:
    s = losses(n)
    worst = max(abs(a - b) / abs(b) for a, b in zip(s, r)) if len(s) == len(r) else float("inf")
    ok = worst <= tol
    bad += not ok
    print(f"  {n:14s} 20 steps: max relative loss difference from {ref} {worst:.1e}"
          f"{'' if ok else f'  FAIL (tolerance {tol:g})'}")
sys.exit(1 if bad else 0)
PY
}

# 1.
run cpu 1 --device cpu "${steps[@]}"
run cuda 1 --device cuda "${steps[@]}"
run cuda-accum4 1 --device cuda --grad-accum 4 "${steps[@]}"
compare cpu 1e-3 cuda cuda-accum4 || fail "CUDA f32 against CPU f32"

# 2.
run cuda-f32-e3 1 --device cuda --epochs 3 --log-every 1000
run cuda-bf16-e3 1 --device cuda --epochs 3 --log-every 1000 --precision bf16
python3 - "$tmp" <<'PY' || fail "bf16 against f32 on the GPU"
import json, sys
tmp = sys.argv[1]
acc = lambda n: 100 * [json.loads(l) for l in open(f"{tmp}/{n}.jsonl")][-1]["test_accuracy"]
a, b = acc("cuda-f32-e3"), acc("cuda-bf16-e3")
print(f"  GPU bf16 test accuracy {b:.2f}% against f32's {a:.2f}%: {b - a:+.2f} points")
sys.exit(0 if abs(a - b) <= 0.5 else 1)
PY

# 3.
if grep -q "nccl backend" "$tmp/cuda.log"; then
    run nccl-z0 1 --device cuda --backend nccl "${steps[@]}"
    run nccl-z3 1 --device cuda --backend nccl --zero 3 "${steps[@]}"
    grep -q "nccl backend" "$tmp/nccl-z3.log" || fail "--backend nccl: the first line says otherwise"
    compare cpu 1e-3 nccl-z0 nccl-z3 || fail "NCCL world 1"
else
    echo "  NCCL world 1: not run (libcollective was built without NCCL)"
fi

# 4.
names=()
for z in 0 1 2 3; do
    CUDA_VISIBLE_DEVICES=${gpus[0]} run "share-z$z" 2 --device cuda --zero "$z" "${steps[@]}"
    grep -q "cpu backend" "$tmp/share-z$z.log" || fail "2 ranks on one GPU: not the cpu backend"
    names+=("share-z$z")
done
compare cuda 1e-3 "${names[@]}" || fail "ranks sharing one GPU"
if grep -q "nccl backend" "$tmp/cuda.log"; then
    st=0
    CUDA_VISIBLE_DEVICES=${gpus[0]} timeout 300 "$DDPRUN" --standalone --nproc-per-node 2 \
        --no-prefix "$TRAIN" --device cuda --backend nccl "${steps[@]}" >"$tmp/share-nccl.log" \
        2>&1 || st=$?
    if [[ $st -ne 2 ]] || ! grep -q "nccl: ranks 0 and 1 use the same GPU" "$tmp/share-nccl.log"
    then
        fail "--backend nccl with 2 ranks on one GPU: exit $st, ranks 0 and 1 not named"
        tail -5 "$tmp/share-nccl.log" >&2
    fi
fi
if [[ $ngpu -ge 2 ]] && grep -q "nccl backend" "$tmp/cuda.log"; then
    cat >"$tmp/own-gpu.sh" <<EOF
#!/usr/bin/env bash
gpus=(${gpus[*]:0:2})
CUDA_VISIBLE_DEVICES=\${gpus[LOCAL_RANK]} exec $(printf %q "$TRAIN") "\$@"
EOF
    chmod +x "$tmp/own-gpu.sh"
    TRAIN=$tmp/own-gpu.sh run own-gpu 2 --device cuda "${steps[@]}"
    grep -q "nccl backend" "$tmp/own-gpu.log" || fail "a GPU shown to each rank: not nccl"
    compare cuda 1e-3 own-gpu || fail "a GPU shown to each rank"
fi

# 5.
exec {srv}< <(exec "$RDZV" serve --bind 127.0.0.1 --port 0 2>"$tmp/srv.err")
pids+=($!)
read -r -t 10 port <&"$srv" || { fail "no port from ddp-rendezvous"; exit 1; }
W=2 timeout_ms=10000 margin_ms=5000
backend=cpu vis=${gpus[0]}
[[ $ngpu -ge 2 ]] && backend=nccl vis=${gpus[0]},${gpus[1]}
for r in 0 1; do
    bound=(timeout 120)
    [[ $r -eq 1 ]] && bound=() # the victim's SIGKILL must reach ddp-train itself
    CUDA_VISIBLE_DEVICES=$vis DDP_TRAIN_TEST_KILL=1:3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        RANK=$r WORLD_SIZE=$W LOCAL_RANK=$r LOCAL_WORLD_SIZE=$W TORCHELASTIC_RUN_ID=gpukill \
        ${bound[@]+"${bound[@]}"} "$TRAIN" --device cuda --backend "$backend" --epochs 100 \
        --log-every 1 --timeout-ms "$timeout_ms" >"$tmp/kill$r.out" 2>"$tmp/kill$r.err" &
    pids+=($!)
    kpid[$r]=$!
done
wait "${kpid[1]}"
st=$?
t0=$(date +%s%N)
[[ $st -eq 137 ]] || fail "rank 1 exited $st, not by its SIGKILL (137)"
wait "${kpid[0]}"
st=$?
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
if [[ $st -ne 1 ]] || ! grep -q "rank 1" "$tmp/kill0.err" ||
    [[ $dt -gt $((timeout_ms + margin_ms)) ]]; then
    fail "survivor rank 0 ($backend backend) exited $st ${dt} ms after the kill (want 1," \
        "naming rank 1, within ${timeout_ms} + ${margin_ms} ms):"
    tail -n 3 "$tmp/kill0.err" >&2
else
    echo "  kill ($backend backend): rank 0 exited 2 ${dt} ms after rank 1 died:" \
        "$(grep -m1 'rank 1' "$tmp/kill0.err")"
fi

finish
