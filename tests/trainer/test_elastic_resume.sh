#!/usr/bin/env bash
# Elastic training that outlives a lost node: three "nodes" in network namespaces (netns_lib.sh;
# created and removed here) run ddp-train under `ddprun --nnodes 2:3 --rdzv-backend c10d
# --max-restarts 1`, checkpointing every 40 steps into a directory they share, with
# --global-batch 384 --micro-batch 64 (2 micro-steps per rank at world 3, 3 at world 2: the
# same global batch). First the job runs undisturbed (the reference accuracy and time). Then
# node 2's worker stops itself (SIGSTOP, ddp-train's test-only DDP_TRAIN_TEST_KILL=*:80:STOP)
# right after the save of step 80 returned, which leaves that checkpoint torn (its manifest
# needs the stopped rank) and step 40's complete (each save waits for the previous one); the
# test then SIGKILLs everything in node 2's namespace, ddprun included. Nodes 0 and 1 see their
# peer gone, restart, meet again as a world of 2, and ddp-train resumes, resharded, from step
# 40 (the torn step 80 ignored with a line), then finishes. Checked: both exit 0, the resume
# line, the final test accuracy within 0.5 percentage points of the undisturbed run's (only
# float sums differ between layouts, see tests/trainer/resume.sh). Printed: accuracies and the
# time lost.
# Usage: test_elastic_resume.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (not root, no
# ip netns, no Fashion-MNIST).
set -uo pipefail
ddprun=$(readlink -f "$1")
train=$(readlink -f "$2")
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "skip: Fashion-MNIST is not installed"; exit 77; }

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"
. "$(dirname "$(readlink -f "$0")")/elastic_lib.sh"

netns_test_begin

netns_setup dde "$tag" 10.213.9 3 || exit $?
nodes=("${NETNS_NODES[@]}")
addr=("${NETNS_ADDRS[@]}")

# The namespaces are new and empty, so a fixed port cannot collide with anything there.
port=29555

# start NAME NODE [KILL]: ddprun on node NODE of job NAME; its output in $tmp/NAME.NODE.
start() {
  local name=$1 i=$2
  ip netns exec "${nodes[$i]}" env DDP_TRAIN_TEST_KILL="${3:-}" "$ddprun" --nnodes 2:3 \
    --rdzv-backend c10d --rdzv-endpoint "${addr[0]}:$port" --rdzv-id "$name$tag" \
    --rdzv-conf last_call_timeout=2 --nproc-per-node 1 --max-restarts 1 \
    "$train" --device cpu --zero 2 --hidden 128 --global-batch 384 --micro-batch 64 --epochs 2 \
    --timeout-ms 10000 --checkpoint-dir "$tmp/ck-$name" --checkpoint-every 40 --resume auto \
    >"$tmp/$name.$i" 2>&1 &
  pids[$i]=$!
}

# 1. Undisturbed: three nodes, world 3, two epochs.
t0=$(date +%s%N)
for i in 0 1 2; do start whole $i; done
finish 0 1 2
whole_ms=$((($(date +%s%N) - t0) / 1000000))
ref=$(accuracy whole)
if [ "$rcs" = "0 0 0 " ] && [ -n "$ref" ] && grep -q "3 ranks" "$tmp"/whole.*; then
  ok "undisturbed 3-node job: test accuracy $ref% in $whole_ms ms"
else
  fail "undisturbed: rcs=$rcs; $(tail -n 3 "$tmp"/whole.*)"
fi

# 2. Node 2 lost after step 80's save.
t0=$(date +%s%N)
for i in 0 1; do start lose $i; done
start lose 2 '*:80:STOP'
stopped=
for _ in $(seq 1200); do # polls for the stopped worker, bounded (60 s)
  for p in $(ip netns pids "${nodes[2]}" 2>/dev/null); do
    [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" = T ] && stopped=$p
  done
  [ -n "$stopped" ] && break
  sleep 0.05
done
[ -n "$stopped" ] || fail "node 2's worker never stopped itself at step 80"
ip netns pids "${nodes[2]}" | xargs -r kill -KILL
wait "${pids[2]}" 2>/dev/null
finish 0 1
lose_ms=$((($(date +%s%N) - t0) / 1000000))
acc=$(accuracy lose)
resumed=$(grep -h -m1 "resuming from" "$tmp"/lose.0 "$tmp"/lose.1 | head -1)
torn=$(grep -h "step-000000000080" "$tmp"/lose.0 "$tmp"/lose.1 | grep -v resuming | head -1)
if [ "$rcs" = "0 0 " ] && [ -n "$acc" ] &&
   grep -q "resuming from $tmp/ck-lose/step-000000000040 at step 40 .*saved by 3 ranks" \
     <<<"$resumed" && [ -n "$torn" ] && grep -q "2 ranks" "$tmp"/lose.0 "$tmp"/lose.1 &&
   python3 -c "import sys; sys.exit(abs($acc - $ref) > 0.5)"; then
  ok "node 2 lost at step 80: $resumed"
  ok "torn checkpoint ignored: $torn"
  ok "finished at world 2: test accuracy $acc% (undisturbed $ref%), $lose_ms ms (time lost $((lose_ms - whole_ms)) ms)"
else
  fail "lost node: rcs=$rcs acc=$acc ref=$ref resumed='$resumed' torn='$torn'; $(tail -n 5 "$tmp"/lose.0 "$tmp"/lose.1)"
fi

[ $fails = 0 ] && echo "PASS" || echo "FAIL: $fails check(s)"
[ $fails = 0 ]
