#!/usr/bin/env bash
# A rank SIGKILLed mid-training under `ddprun --max-restarts 1`, with ddp-train's
# --checkpoint-dir, --checkpoint-every 50 and --resume auto (a few seconds):
#  1. rank 1 dies after step 120: ddprun restarts the job, which resumes from the newest
#     complete checkpoint (its log line says which) and finishes the epoch (234 steps). That is
#     step 100's unless its writers were still busy 20 steps later (a slow disk), then step
#     50's: a save completes asynchronously, so either is right; the one it took is printed;
#  2. rank 1 dies right after the save of step 150 returned: that checkpoint is torn (its
#     manifest needs every rank's writer to be known done, which takes a collective rank 1
#     never joins), so the restarted job ignores it with a line naming it and resumes from 100.
# Same world size and stage, so both end with the uninterrupted run's parameters byte for byte
# (--dump-final) and its accuracy, on the host (--device cpu) whatever GPU the machine has. The kill is deterministic: ddp-train's test-only
# DDP_TRAIN_TEST_KILL=RANK:STEP makes the rank raise SIGKILL at that step, on the first attempt
# only. The time lost is the difference of the wall-clock times, printed (not asserted).
# Usage: resume_kill.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (no Fashion-MNIST).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data

# run NAME [KILL]: the job, with rank 1 killed at KILL when given; the wall time in $tmp/NAME.s.
run() {
    local name=$1 t0 st=0
    t0=$(date +%s%N)
    DDP_TRAIN_TEST_KILL=${2:-} timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 \
        --max-restarts 1 --no-prefix "$TRAIN" --device cpu --hidden 128 --epochs 1 --zero 1 \
        --checkpoint-dir "$tmp/ck-$name" --checkpoint-every 50 --resume auto \
        --dump-final "$tmp/$name.st" >"$tmp/$name.log" 2>&1 || st=$?
    echo $((($(date +%s%N) - t0) / 1000000)) >"$tmp/$name.ms"
    if [[ $st -ne 0 ]]; then
        fail "$name: ddprun exited with $st"
        tail -5 "$tmp/$name.log" >&2
    fi
}

run whole
echo "  uninterrupted: test accuracy $(accuracy whole)% in $(cat "$tmp/whole.ms") ms"
for job in "mid 1:120 100|50" "torn 1:150 100"; do
    set -- $job
    name=$1 kill=$2 from=$3
    run "$name" "$kill"
    log=$tmp/$name.log
    at=$(grep -oE "resuming from $tmp/ck-$name/step-0*($from) at step ($from) " "$log" |
        grep -oE "at step [0-9]+" | grep -oE "[0-9]+")
    [[ -n $at ]] || fail "$name: the restarted job did not resume from step $from"
    from=$at
    if [[ $name == torn ]]; then
        torn=$(grep -m1 "step-000000000150" "$log" | grep -v resuming)
        if [[ -n $torn ]]; then
            echo "  torn checkpoint ignored: $torn"
        else
            fail "torn: no line about the torn checkpoint of step 150"
        fi
    fi
    [[ $(grep -c "test accuracy" "$log") -ge 1 ]] || fail "$name: no accuracy"
    if cmp -s "$tmp/whole.st" "$tmp/$name.st"; then
        echo "  rank 1 killed at step ${kill#*:}: resumed from step $from, test accuracy $(accuracy "$name")%," \
            "final parameters identical to the uninterrupted run's;" \
            "time lost $(($(cat "$tmp/$name.ms") - $(cat "$tmp/whole.ms"))) ms"
    else
        fail "$name: final parameters differ from the uninterrupted run's"
    fi
done

finish
