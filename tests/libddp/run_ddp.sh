#!/usr/bin/env bash
# libddp end to end, real processes (about a minute on 2 cores):
#  1. ddp-check under ddprun: misuse errors (on every rank alike, and on rank 1 alone: every
#     rank fails at once, the others naming rank 1), a layout mismatch, a non-finite gradient
#     skipped on every rank, memory against the ZeRO
#     formulas (worlds 2 and 3: uneven padding), the overlap trace, and equivalence at the
#     library's level (worlds 1-4: stages 0-3, SGD and AdamW, clipping, 1 or 4 micro-steps,
#     against a serial double reference within 1e-5 relative; ddp-check.c says why; and
#     ddp_model_get_params() against the parameters the units give);
#  2. equivalence through ddp-train's per-step metrics (loss and gradient norm, 12 steps, on the
#     host: --device cpu, whatever GPU the machine has; tests/trainer/gpu.sh checks the GPU):
#     worlds 1, 2 and 4 on the same global batch, ZeRO stages 0-3, SGD with momentum
#     and AdamW with clipping, and 4 micro-steps x 64 against 1 x 256, all against world 1's
#     stage 0 within 1e-5 relative (the reductions add in other orders: float32 sums of a few
#     hundred terms differ by ~1e-7 relative, and a dozen steps do not grow that past 1e-6);
#  3. a rank SIGKILLed mid-training, ranks started by hand on ddp-rendezvous (no launcher
#     teardown to race): every survivor exits 1, naming the dead rank, within the
#     communicator's timeout it was started with (--timeout-ms) plus a second's margin for the
#     settlement and the exit (a death on one host is seen in milliseconds).
# Usage: run_ddp.sh DDPRUN DDP_CHECK DDP_TRAIN DDP_RENDEZVOUS
set -uo pipefail
DDPRUN=${1:?usage}; CHECK=${2:?usage}; TRAIN=${3:?usage}; RDZV=${4:?usage}
. "$(dirname "$0")/lib.sh"
need_python

# 1. ddp-check.
for job in "misuse 2" "misuse 3" "layout 3" "nonfinite 3" "memory 2" "memory 3" "overlap 2" \
    "equiv 1" "equiv 2" "equiv 3" "equiv 4" "bf16 1" "bf16 3"; do
    set -- $job
    out=$(timeout 120 "$DDPRUN" --standalone --nproc-per-node "$2" "$CHECK" "$1" 2>&1)
    n=$(grep -c "ddp-check: rank [0-9]*/$2 $1: PASS" <<<"$out")
    if [[ $n -ne $2 ]]; then
        fail "ddp-check $1 on $2 ranks: $n of $2 passed"
        sed 's/^/    /' <<<"$out" >&2
    fi
    grep -E "^\[0\]:ddp-check: (misuse|overlap|memory .* stage|rank 0 layout|(equiv|bf16) world [0-9]: worst)" <<<"$out" | sed 's/^\[0\]:/  /'
done

# 2. Equivalence: metrics of every configuration against the reference.
common=(--device cpu --max-steps 12 --log-every 1 --global-batch 256 --hidden 128 --warmup 2 --clip 1.0)
run() { # NAME WORLD ARGS...
    local name=$1 world=$2
    shift 2
    if ! timeout 120 "$DDPRUN" --standalone --nproc-per-node "$world" "$TRAIN" "${common[@]}" \
        --metrics "$tmp/$name.jsonl" "$@" >"$tmp/$name.log" 2>&1; then
        fail "ddp-train $name"
        tail -5 "$tmp/$name.log" >&2
    fi
}
for opt in "sgd --lr 0.05 --momentum 0.9" "adamw --lr 0.002 --weight-decay 0.01"; do
    set -- $opt
    o=$1
    shift
    run "$o-w1-z0" 1 --optimizer "$o" "$@"
    run "$o-w1-accum4" 1 --optimizer "$o" --grad-accum 4 "$@"
    for z in 0 1 2 3; do run "$o-w2-z$z" 2 --optimizer "$o" --zero "$z" "$@"; done
    for z in 0 3; do run "$o-w4-z$z" 4 --optimizer "$o" --zero "$z" "$@"; done
done
python3 - "$tmp" <<'PY' || fail "equivalence"
import glob, json, os, sys
tmp = sys.argv[1]
def series(path):
    recs = [json.loads(l) for l in open(path)]
    return [(r["loss"], r["grad_norm"]) for r in recs if "loss" in r]
bad = 0
for opt in ("sgd", "adamw"):
    ref = series(f"{tmp}/{opt}-w1-z0.jsonl")
    assert len(ref) == 12, ref
    for path in sorted(glob.glob(f"{tmp}/{opt}-*.jsonl")):
        s = series(path)
        worst = max(abs(a - b) / abs(b) for x, y in zip(s, ref) for a, b in zip(x, y))
        name = os.path.basename(path)[:-6]
        ok = len(s) == len(ref) and worst <= 1e-5
        bad += not ok
        print(f"  {name:16s} 12 steps: max relative difference from {opt}-w1-z0 (loss, norm) {worst:.1e}"
              f"{'' if ok else '  FAIL'}")
sys.exit(1 if bad else 0)
PY

# 3. A rank killed mid-training.
exec {srv}< <(exec "$RDZV" serve --bind 127.0.0.1 --port 0 2>"$tmp/srv.err")
pids+=($!)
read -r -t 10 port <&"$srv" || { fail "no port from ddp-rendezvous"; exit 1; }
W=3
timeout_ms=5000 margin_ms=1000
for r in 0 1 2; do
    # The victim runs without timeout(1), so that SIGKILL reaches ddp-train itself.
    bound=(timeout 60)
    [[ $r -eq 2 ]] && bound=()
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$W LOCAL_RANK=$r \
        LOCAL_WORLD_SIZE=$W TORCHELASTIC_RUN_ID=kill \
        ${bound[@]+"${bound[@]}"} "$TRAIN" --device cpu --epochs 1000 --log-every 1 --global-batch 240 \
        --hidden 64 --timeout-ms "$timeout_ms" >"$tmp/kill$r.out" 2>"$tmp/kill$r.err" &
    pids+=($!)
    kpid[$r]=$!
done
# Rank 0 prints a line per step (buffered: the first block shows after some dozens of steps):
# once training is under way, rank 2 dies.
for _ in $(seq 600); do
    [[ -s $tmp/kill0.out || -s $tmp/kill0.err ]] && grep -q "step [0-9]" "$tmp/kill0.out" \
        "$tmp/kill0.err" && break
    sleep 0.05 # polling for the condition above, bounded by the loop
done
kill -KILL "${kpid[2]}"
t0=$(date +%s%N)
# Survivors are waited for in turn: a time measured is when that survivor had exited, at the latest.
for r in 0 1; do
    wait "${kpid[$r]}"
    st=$?
    dt=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [[ $st -ne 1 ]] || ! grep -q "rank 2" "$tmp/kill$r.err" ||
        [[ $dt -gt $((timeout_ms + margin_ms)) ]]; then
        fail "survivor rank $r exited $st ${dt} ms after the kill (want 1, naming rank 2," \
            "within ${timeout_ms} + ${margin_ms} ms), stderr and stdout:"
        tail -n 3 "$tmp/kill$r.err" "$tmp/kill$r.out" >&2
    else
        echo "  kill: rank $r exited 2 ${dt} ms after rank 2 was killed: $(grep -m1 'rank 2' "$tmp/kill$r.err")"
    fi
done

finish
