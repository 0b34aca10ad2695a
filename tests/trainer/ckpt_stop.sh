#!/usr/bin/env bash
# ddp-train's final and SIGTERM checkpoints under ddprun, two ranks (ddp-train(1), CHECKPOINTS):
#  1. the last step is saved: 23 steps with --checkpoint-every 10 leave step-10, step-20 and
#     step-23, each complete; a resume at the last step trains nothing and saves nothing more;
#     --checkpoint-dir alone saves the last step only;
#  2. SIGTERM to ddprun mid-run (sent once rank 0's progress line shows step 200: polled, not
#     timed): both ranks stop after the same step N, save step-N (complete: both shards and
#     the manifest), rank 0 says so, and the job ends as a stop, not a failure (ddprun exits
#     143 with no failure summary); --resume auto then continues from step N to N + 20;
#  3. a peer's death: rank 1 SIGKILLed after step 30 (DDP_TRAIN_TEST_KILL) while rank 0 has
#     SIGTERM handling on: ddprun's SIGTERM reaches rank 0 in the teardown, whose per-step
#     agreement fails at once on the dead peer, and the job ends within 30 s (--timeout-ms is
#     60 s: a hang would show), the root cause rank 1's SIGKILL.
# Usage: ckpt_stop.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (no Fashion-MNIST).
set -uo pipefail
DDPRUN=${1:?usage: ckpt_stop.sh DDPRUN DDP_TRAIN}
TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data

common=(--device cpu --hidden 32 --threads 1 --schedule constant --warmup 5 --timeout-ms 60000)
# run NAME ARGS...: ddp-train on two ranks under ddprun; its output in $tmp/NAME.log, its
# status in $status.
run() {
    local name=$1
    shift
    status=0
    timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 "$TRAIN" "${common[@]}" "$@" \
        >"$tmp/$name.log" 2>&1 || status=$?
}
# complete DIR: a checkpoint with its manifest and both shards.
complete() { [[ -f $1/manifest.json && -f $1/shard-00000-of-00002.bin && -f $1/shard-00001-of-00002.bin ]]; }
steps() { (cd "$1" && ls -d step-* 2>/dev/null | tr '\n' ' '); }

# 1. The last step.
run final --max-steps 23 --checkpoint-every 10 --checkpoint-dir "$tmp/final"
[[ $status -eq 0 ]] || { fail "final: exit $status"; tail -5 "$tmp/final.log"; }
have=$(steps "$tmp/final")
if [[ $have == "step-000000000010 step-000000000020 step-000000000023 " ]] &&
    complete "$tmp/final/step-000000000023"; then
    ok "23 steps, --checkpoint-every 10: $have(the last complete)"
else
    fail "23 steps, --checkpoint-every 10 left: $have"
fi
run again --max-steps 23 --checkpoint-dir "$tmp/final" --resume auto
[[ $status -eq 0 && $(steps "$tmp/final") == "$have" ]] &&
    grep -q "resuming from $tmp/final/step-000000000023 at step 23" "$tmp/again.log" &&
    ok "a resume at the last step trains and saves nothing" ||
    fail "a resume at the last step: exit $status, checkpoints $(steps "$tmp/final")"
run only --max-steps 7 --checkpoint-dir "$tmp/only"
[[ $status -eq 0 && $(steps "$tmp/only") == "step-000000000007 " ]] &&
    ok "--checkpoint-dir alone: the last step only" ||
    fail "--checkpoint-dir alone: exit $status, checkpoints $(steps "$tmp/only")"

# 2. SIGTERM to ddprun once training is under way.
"$DDPRUN" --standalone --nproc-per-node 2 "$TRAIN" "${common[@]}" --epochs 40 --log-every 50 \
    --checkpoint-every 1000 --checkpoint-dir "$tmp/stop" >"$tmp/stop.log" 2>&1 &
job=$!
pids+=("$job")
if ! wait_for 60 grep -q "step 200/" "$tmp/stop.log"; then
    fail "no progress line for step 200 within 60 s"
    tail -5 "$tmp/stop.log"
    finish
fi
kill -TERM "$job"
status=0
wait "$job" || status=$?
n=$(sed -n 's/.*SIGTERM: all ranks stopped after step \([0-9]*\) of .*/\1/p' "$tmp/stop.log")
saved=$tmp/stop/$(printf 'step-%012d' "${n:-0}")
if [[ -n $n ]] && ((n >= 200)) && complete "$saved" &&
    grep -q "checkpoint $saved saved" "$tmp/stop.log"; then
    ok "SIGTERM after step 200: both ranks stopped after step $n and saved it"
else
    fail "SIGTERM: no complete checkpoint of an agreed step (step '${n}'): $(steps "$tmp/stop")"
    tail -8 "$tmp/stop.log"
fi
[[ $status -eq 143 ]] && ! grep -qiE "failed|root cause" "$tmp/stop.log" &&
    ok "ddprun exits 143 and reports no failure" ||
    { fail "SIGTERM: ddprun exit $status (expected 143), or a failure reported:"; tail -8 "$tmp/stop.log"; }
if [[ -n $n ]]; then
    run resumed --epochs 40 --max-steps $((n + 20)) --checkpoint-dir "$tmp/stop" --resume auto
    [[ $status -eq 0 ]] && grep -q "resuming from $saved at step $n " "$tmp/resumed.log" &&
        grep -q "after $((n + 20)) steps" "$tmp/resumed.log" &&
        complete "$tmp/stop/$(printf 'step-%012d' $((n + 20)))" &&
        ok "--resume auto continues from step $n to $((n + 20))" ||
        { fail "resume after SIGTERM: exit $status"; tail -5 "$tmp/resumed.log"; }
fi

# 3. A dead peer: rank 0 does not wait for it.
start=$SECONDS
status=0
DDP_TRAIN_TEST_KILL=1:30 timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 "$TRAIN" \
    "${common[@]}" --epochs 40 --checkpoint-dir "$tmp/dead" >"$tmp/dead.log" 2>&1 || status=$?
took=$((SECONDS - start))
[[ $status -eq 137 ]] && ((took < 30)) && grep -qE "rank 1 .*(KILL|signal 9)" "$tmp/dead.log" &&
    ok "rank 1 killed: the job ended in $took s, exit $status (rank 1's SIGKILL)" ||
    { fail "dead peer: exit $status after $took s"; tail -8 "$tmp/dead.log"; }

finish
