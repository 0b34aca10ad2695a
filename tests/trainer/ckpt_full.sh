#!/usr/bin/env bash
# A full checkpoint disk does not stop ddp-train (a few seconds): world 2 under ddprun,
# --checkpoint-every 10, the checkpoint root a small tmpfs this test mounts. A checkpoint of
# this model (--hidden 128, AdamW) takes about 1.4 MiB.
#  1. full: 2 MiB, room for one checkpoint. Step 10's save completes; 20, 30, ..., 60 fail with
#     ENOSPC. Training goes on to step 60 and the test accuracy; each failure is logged on both
#     ranks naming its own step and "No space left on device"; no torn step directory remains;
#     step 10's checkpoint is untouched, and a run resumes from it (and exits 3: its own last
#     save, of step 11, fails on the full disk too); the last save failed, so
#     ddp-train exits 3, which ddprun passes on, and the failure table's message column holds
#     ddp-train's error (its TORCHELASTIC_ERROR_FILE record).
#  2. retry: 3600 KiB, part of it taken by a filler file (--keep 1). Step 10's save completes,
#     step 20's fails. Both ranks stop themselves right after step 30's save started (the
#     test-only DDP_TRAIN_TEST_KILL=*:30:STOP; a save first completes the previous one, so step
#     20's failure is settled by then); the test frees the filler and continues them. Whatever
#     step 30's save met, the saves of steps 40, 50 and 60 succeed: the job exits 0 and step
#     60's checkpoint is the one left, complete, and loads.
# Usage: ckpt_full.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (not root, no tmpfs
# mount, no Fashion-MNIST).
set -uo pipefail
DDPRUN=${1:?usage}; TRAIN=${2:?usage}
. "$(dirname "$0")/../libddp/lib.sh"
need_data

mnt=$tmp/mnt
mkdir -p "$mnt"
cleanup_hook() { umount "$mnt" 2>/dev/null; }
mount_tmpfs() { # SIZE: a fresh tmpfs of SIZE on $mnt
    umount "$mnt" 2>/dev/null
    mount -t tmpfs -o "size=$1" tmpfs "$mnt" 2>/dev/null ||
        { echo "SKIP: cannot mount a tmpfs (not root?)"; exit 77; }
}

common=(--device cpu --hidden 128 --global-batch 384 --micro-batch 64 --epochs 1 --max-steps 60
    --checkpoint-dir "$mnt/ck")
# torn: the step directories without a manifest.
torn() {
    local d
    for d in "$mnt"/ck/step-*; do [[ -d $d && ! -e $d/manifest.json ]] && echo "${d##*/}"; done
}
# trained NAME WANT WHY: the run in $log, which exited $st, trained to step 60 and exited WANT.
trained() {
    if [[ $st -eq $2 ]] && grep -q "epoch 1/1 (step 60): test loss" "$log"; then
        ok "$1: trained to step 60 and exited $2 ($3)"
    else
        fail "$1: exit $st, want $2 after step 60's evaluation"
        tail -8 "$log"
    fi
}
# resumes NAME STEP WANT: a run that resumes from step STEP's checkpoint, trains one more step
# and exits WANT (3 where the save of its last step cannot succeed).
resumes() {
    local log=$tmp/$1-resume.log st=0
    timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" \
        "${common[@]}" --resume auto --max-steps $(($2 + 1)) >"$log" 2>&1 || st=$?
    if [[ $st -eq $3 ]] && grep -q "resuming from $mnt/ck/step-0*$2 at step $2 " "$log"; then
        ok "$1: a run resumes from step $2's checkpoint (exit $st)"
    else
        fail "$1: no resume from step $2's checkpoint, or exit $st (want $3)"
        tail -5 "$log"
    fi
}

# 1. Full from step 20 on.
mount_tmpfs 2m
log=$tmp/full.log
timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 --no-prefix "$TRAIN" "${common[@]}" \
    --checkpoint-every 10 >"$log" 2>&1
st=$?
trained full 3 "the last save failed"
missing=
for s in 20 30 40 50 60; do
    for r in 0 1; do
        grep -qE "^ddp-train: rank $r: checkpoint of step $s failed: .*No space left on device" \
            "$log" || missing+=" step $s on rank $r"
    done
done
[[ -z $missing ]] && ok "full: each failed save logged on both ranks, with its step and ENOSPC" ||
    fail "full: no failure line for$missing"
grep -m1 "checkpoint of step 20 failed" "$log" | sed 's/^/    /'
[[ -z $(torn) ]] && ok "full: no torn step directory left" || fail "full: torn: $(torn)"
if [[ $(cd "$mnt/ck" && echo step-*) == step-000000000010 && -e $mnt/ck/step-000000000010/manifest.json ]]; then
    ok "full: step 10's complete checkpoint kept"
else
    fail "full: the checkpoints left are $(cd "$mnt/ck" && echo step-*)"
fi
row=$(grep -E '^root .* exit 3 ' "$log")
if grep -q "checkpoint of step 60 failed: .*No space left on device" <<<"$row"; then
    ok "full: the failure table's message column holds ddp-train's error"
    echo "    ${row:0:200}..."
else
    fail "full: the failure table's root row has no message: '$row'"
fi
resumes full 10 3

# 2. Full at step 20, space freed by step 30.
mount_tmpfs 3600k
head -c $((1500 * 1024)) /dev/zero >"$mnt/filler"
log=$tmp/retry.log
DDP_TRAIN_TEST_KILL='*:30:STOP' timeout 120 "$DDPRUN" --standalone --nproc-per-node 2 \
    --no-prefix "$TRAIN" "${common[@]}" --checkpoint-every 10 --keep 1 >"$log" 2>&1 &
job=$!
pids+=("$job")
# stopped: the ddp-train processes under ddprun that are stopped, one line each.
stopped() {
    ps -e -o pid=,ppid=,stat=,comm= | awk -v root="$job" '
        { pid[NR] = $1; ppid[NR] = $2; st[NR] = $3; comm[NR] = $4 }
        END {
            under[root] = 1
            for (changed = 1; changed;) {
                changed = 0
                for (i = 1; i <= NR; i++)
                    if (under[ppid[i]] && !under[pid[i]]) { under[pid[i]] = 1; changed = 1 }
            }
            for (i = 1; i <= NR; i++)
                if (under[pid[i]] && comm[i] == "ddp-train" && st[i] ~ /^T/) print pid[i]
        }'
}
# both_stopped: true once both ranks stopped themselves, or the job ended without that.
both_stopped() { [[ $(stopped | wc -l) -eq 2 ]] || ! kill -0 "$job" 2>/dev/null; }
if wait_for 60 both_stopped && kill -0 "$job" 2>/dev/null; then
    rm -f "$mnt/filler"
else
    fail "retry: the ranks did not both stop after step 30's save"
fi
stopped | xargs -r kill -CONT
wait "$job"
st=$?
trained retry 0 "the last save succeeded"
if [[ $(grep -c "rank [01]: checkpoint of step 20 failed: .*No space left on device" "$log") -ne 2 ]]; then
    fail "retry: step 20's failure not logged on both ranks"
elif grep -qE "checkpoint of step (40|50|60) failed" "$log" || [[ $st -ne 0 ]]; then
    fail "retry: a save after the space was freed failed"
else
    ok "retry: step 20's save failed, the saves after the filler was freed succeeded" \
        "(step 30's: $(grep -q 'checkpoint of step 30 failed' "$log" && echo failed || echo succeeded))"
fi
[[ -z $(torn) ]] || fail "retry: torn: $(torn)"
[[ $(cd "$mnt/ck" && echo step-*) == step-000000000060 ]] ||
    fail "retry: the checkpoints left are $(cd "$mnt/ck" && echo step-*), want step 60's (--keep 1)"
resumes retry 60 0

finish
