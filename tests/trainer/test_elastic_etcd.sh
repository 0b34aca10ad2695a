#!/usr/bin/env bash
# Elastic training with no single point of failure: ddprun's etcd rendezvous backend against a
# real 3-member etcd cluster. Six network namespaces (netns_lib.sh, created and removed here):
# nodes 0-2 run ddprun with ddp-train, namespaces 3-5 one etcd member each (etcd_lib.sh). Every
# job is `--nnodes 2:3` with checkpoints every 40 steps in a directory the nodes share and
# --resume auto, as in test_elastic_resume.sh. The scenarios:
#   1. undisturbed, 3 nodes: the reference accuracy and time; then its finished job's
#      --rdzv-id is refused to a new job;
#   2. the node serving the workers' store (the one that says so) SIGKILLed with everything in
#      its namespace after step 40's checkpoint: the other two re-rendezvous, the new rank 0
#      serves a fresh store, ddp-train resumes and finishes within 0.5 points of the reference;
#      the time lost is printed;
#   3. a late node: two nodes train (--max-restarts 0), a third arrives after step 40: admitted
#      (no restart used), the world grows to 3, ddp-train resumes from a checkpoint, all finish
#      (before it comes, a job with other --nnodes under the same id is refused);
#   4. the etcd leader SIGKILLed mid-run: the job finishes without a restart;
#   5. every etcd member stopped mid-run: each node stops, saying it lost the rendezvous, within
#      the lease's TTL and a few seconds, and leaves no process;
#   6. the same job with --rdzv-backend c10d and the store's host (node 0) killed: the survivors
#      say the store is gone with its node and stop, no hang.
# Before them, etcd out of reach at the start: ddprun stops at once, naming every member it tried.
# Usage: test_elastic_etcd.sh DDPRUN DDP_TRAIN. Exit 0 pass, 1 fail, 77 skip (not root, no ip
# netns, no etcd or curl, no Fashion-MNIST).
set -uo pipefail
ddprun=$(readlink -f "$1")
train=$(readlink -f "$2")
[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
  { echo "skip: Fashion-MNIST is not installed"; exit 77; }
"$ddprun" --rdzv-backend etcd --rdzv-endpoint 127.0.0.1:1 --nnodes 1:2 true 2>&1 |
  grep -q "no etcd backend\|expected 'static' or 'c10d'" &&
  { echo "skip: this ddprun was built without libcurl (no etcd backend)"; exit 77; }

here=$(dirname "$(readlink -f "$0")")
. "$here/../netns_lib.sh"
. "$here/../etcd_lib.sh"
. "$here/elastic_lib.sh"

netns_test_begin
trap 'etcd_cluster_stop; netns_test_end' EXIT

netns_setup ee "$tag" 10.213.43 6 || exit $?
nodes=("${NETNS_NODES[@]:0:3}")
addr=("${NETNS_ADDRS[@]:0:3}")
etcd_cluster_start "$tmp/etcd" "${NETNS_NODES[3]}:${NETNS_ADDRS[3]}:2379:2380" \
  "${NETNS_NODES[4]}:${NETNS_ADDRS[4]}:2379:2380" \
  "${NETNS_NODES[5]}:${NETNS_ADDRS[5]}:2379:2380" || exit $?

# Liveness: a lease of 5 s (etcd elects a new leader well within it); the last call 2 s.
conf=heartbeat_timeout=5,last_call_timeout=2
# start NAME NODE [ARGS...]: ddprun on node NODE of job NAME (etcd unless ARGS say otherwise);
# its output in $tmp/NAME.NODE.
start() {
  local name=$1 i=$2
  shift 2
  ip netns exec "${nodes[$i]}" "$ddprun" --nnodes 2:3 --rdzv-backend etcd \
    --rdzv-endpoint "$ETCD_ENDPOINTS" --rdzv-id "$name$tag" --rdzv-conf "$conf" \
    --nproc-per-node 1 "$@" \
    "$train" --device cpu --zero 2 --hidden 128 --global-batch 384 --micro-batch 64 \
    --epochs "$epochs" --timeout-ms 10000 --checkpoint-dir "$tmp/ck-$name" \
    --checkpoint-every 40 --resume auto >"$tmp/$name.$i" 2>&1 &
  pids[$i]=$!
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# wait_step NAME STEP: until the job's checkpoint of STEP is complete (its manifest; 120 s).
wait_step() {
  local m
  m="$tmp/ck-$1/step-$(printf %012d "$2")/manifest.json"
  for _ in $(seq 1200); do
    [ -e "$m" ] && return 0
    sleep 0.1
  done
  fail "$1: no checkpoint of step $2 within 120 s; $(tail -n 3 "$tmp/$1".*)"
  return 1
}
# store_node NAME: the node whose ddprun serves round 0's workers' store.
store_node() {
  local i
  for i in 0 1 2; do
    grep -q "round 0: node rank 0 of .*serving the workers' store" "$tmp/$1.$i" 2>/dev/null &&
      { echo $i; return 0; }
  done
  return 1
}
# refused NODE NAME NNODES TEXT WHAT: a one-node attempt to use job NAME's id with --nnodes
# NNODES exits 1 saying TEXT.
refused() {
  local out rc
  out=$(timeout 30 ip netns exec "${nodes[$1]}" "$ddprun" --nnodes "$3" --rdzv-backend etcd \
    --rdzv-endpoint "$ETCD_ENDPOINTS" --rdzv-id "$2$tag" true 2>&1)
  rc=$?
  if [ $rc = 1 ] && grep -qF "$4" <<<"$out"; then ok "$5"; else fail "$5: rc=$rc: $out"; fi
}
kill_node() { # NODE: everything in its namespace
  ip netns pids "${nodes[$1]}" | xargs -r kill -KILL 2>/dev/null
  wait "${pids[$1]}" 2>/dev/null
}

# etcd out of reach at the start: ddprun names every member it tried, with why and how long.
t1=$(now_ms)
out=$(timeout 30 ip netns exec "${nodes[0]}" "$ddprun" --nnodes 2:3 --rdzv-backend etcd \
  --rdzv-endpoint "${NETNS_ADDRS[3]}:2399,${NETNS_ADDRS[4]}:2399" --rdzv-id none$tag true 2>&1)
rc=$?
ms=$(($(now_ms) - t1))
if [ $rc = 1 ] && grep -qF "cannot reach the etcd rendezvous at ${NETNS_ADDRS[3]}:2399,${NETNS_ADDRS[4]}:2399: no etcd member answered in" <<<"$out" &&
   grep -qF "${NETNS_ADDRS[4]}:2399 (" <<<"$out"; then
  ok "etcd out of reach: stopped in $ms ms, naming both members"
else
  fail "etcd out of reach: rc=$rc after $ms ms: $out"
fi

# 1. Undisturbed. (Four epochs, 624 steps, leave the later scenarios time to act after step 40.)
epochs=4
t0=$(now_ms)
for i in 0 1 2; do start whole $i; done
finish 0 1 2
whole_ms=$(($(now_ms) - t0))
ref=$(accuracy whole)
if [ "$rcs" = "0 0 0 " ] && [ -n "$ref" ] && grep -q "3 ranks" "$tmp"/whole.* &&
   [ "$(cat "$tmp"/whole.* | grep -c "serving the workers' store")" = 1 ]; then
  ok "undisturbed 3-node job over etcd: test accuracy $ref% in $whole_ms ms"
else
  fail "undisturbed: rcs=$rcs; $(tail -n 3 "$tmp"/whole.*)"
fi

# The finished job's id is refused to a new job, and a running job's to one with other --nnodes.
refused 0 whole 2:3 "the rendezvous id 'whole$tag' belongs to a job that already finished" \
  "a finished job's rendezvous id is refused"

# 2. The node serving the workers' store dies.
t0=$(now_ms)
for i in 0 1 2; do start host $i --max-restarts 1; done
victim=
wait_step host 40 && victim=$(store_node host)
if [ -n "$victim" ]; then
  kill_node "$victim"
  killed_ms=$(now_ms)
  others=$(for i in 0 1 2; do [ "$i" != "$victim" ] && echo $i; done)
  finish $others
  host_ms=$(($(now_ms) - t0))
  acc=$(accuracy host)
  logs=$(for i in $others; do echo "$tmp/host.$i"; done)
  resumed=$(cat $logs | grep -m1 "resuming from")
  newhost=$(cat $logs | grep -m1 "round 1: node rank 0 of 2: serving the workers' store")
  again=$(grep -h "^\[[0-9]*\]:" $logs | grep -m1 -n "resuming from" | cut -d: -f1)
  if [ "$rcs" = "0 0 " ] && [ -n "$acc" ] && [ -n "$resumed" ] && [ -n "$newhost" ] &&
     python3 -c "import sys; sys.exit(abs($acc - $ref) > 0.5)"; then
    ok "store's node $victim killed after step 40: $newhost"
    ok "survivors $resumed"
    ok "finished at world 2: test accuracy $acc% (undisturbed $ref%), $host_ms ms (time lost $((host_ms - whole_ms)) ms)"
  else
    fail "store's node killed: rcs=$rcs acc=$acc ref=$ref resumed='$resumed' newhost='$newhost'; $(tail -n 8 $logs)"
  fi
else
  fail "no node said it serves the store; $(tail -n 3 "$tmp"/host.*)"
  kill_node 0; kill_node 1; kill_node 2
fi

# 3. A late node joins a 2-node job (MAX 3), which uses no restart (--max-restarts 0) to admit it.
# (Meanwhile a job with other --nnodes under the same id is refused.)
for i in 0 1; do start late $i --max-restarts 0; done
if wait_step late 40; then
  refused 2 late 1:2 "the rendezvous id 'late$tag' is in use by another job, with --nnodes 2:3" \
    "a running job's rendezvous id is refused to a job with other --nnodes"
  start late 2 --max-restarts 0
  finish 0 1 2
  acc=$(accuracy late)
  if [ "$rcs" = "0 0 0 " ] && grep -q "nodes are waiting to join: re-rendezvous" "$tmp"/late.0 &&
     grep -q "resuming from .* at step" "$tmp"/late.2 && grep -q "3 ranks" "$tmp"/late.2 &&
     ! grep -q "restarting it" "$tmp"/late.*; then
    ok "late node admitted without a restart: $(grep -m1 "resuming from" "$tmp"/late.2); finished at world 3, test accuracy $acc%"
  else
    fail "late node: rcs=$rcs; $(tail -n 6 "$tmp"/late.*)"
  fi
else
  kill_node 0; kill_node 1
fi

# 4. The etcd leader dies mid-run: nothing restarts. (Longer runs: the job must outlast the
# election, and in 5 the lease.)
epochs=8
for i in 0 1 2; do start leader $i --max-restarts 1; done
if wait_step leader 40; then
  lead=$(etcd_leader)
  etcd_kill "${lead:-0}"
  t1=$(now_ms)
  new=
  for _ in $(seq 100); do # bounded: 10 s for the survivors to elect a leader
    new=$(etcd_leader) && [ "$new" != "$lead" ] && break
    new=
    sleep 0.1
  done
  elected_ms=$(($(now_ms) - t1))
  finish 0 1 2
  if [ -n "$lead" ] && [ -n "$new" ] && [ "$rcs" = "0 0 0 " ] &&
     ! grep -q "restarting it\|round 1" "$tmp"/leader.*; then
    ok "etcd leader (member $lead) killed mid-run, member $new elected in $elected_ms ms: the job finished, no restart"
  else
    fail "etcd leader killed: lead=$lead new=$new rcs=$rcs; $(tail -n 5 "$tmp"/leader.*)"
  fi
else
  kill_node 0; kill_node 1; kill_node 2
fi

# 5. Every etcd member stops mid-run: every node stops, saying so, and leaves nothing behind.
epochs=20
for i in 0 1 2; do start lost $i --max-restarts 3; done
if wait_step lost 40; then
  etcd_cluster_stop
  t1=$(now_ms)
  finish 0 1 2
  ms=$(($(now_ms) - t1))
  left=$(for i in 0 1 2; do ip netns pids "${nodes[$i]}"; done | wc -l)
  # A node stops when its lease lapses, or, when its workers failed first (a peer stopped), when
  # the restart finds no etcd member: either way the line names etcd's members.
  said=$(grep -l "lost the rendezvous (etcd at .*): this node's lease could not be renewed\|rendezvous failed: .*no etcd member answered" \
    "$tmp"/lost.* | wc -l)
  if [[ "$rcs" != *"0 "* ]] && [ "$said" = 3 ] && [ "$left" = 0 ] && [ $ms -lt 20000 ] &&
     grep -q "lost the rendezvous (etcd" "$tmp"/lost.*; then
    ok "etcd lost: every node stopped in $ms ms; the first with: $(grep -h -m1 -o "lost the rendezvous.*renewed for [0-9]* s" "$tmp"/lost.* | head -1)"
  else
    fail "etcd lost: rcs=$rcs said=$said left=$left after $ms ms; $(tail -n 4 "$tmp"/lost.*)"
  fi
else
  kill_node 0; kill_node 1; kill_node 2
fi

# 6. c10d: the store's host dies; the survivors say so and stop.
epochs=4
port=29572 # the namespaces are new and empty: nothing else listens there
ep="${addr[0]}:$port"
for i in 0 1 2; do
  start c10d $i --max-restarts 1 --rdzv-backend c10d --rdzv-endpoint "$ep" \
    --rdzv-conf last_call_timeout=2
done
if wait_step c10d 40; then
  kill_node 0
  t1=$(now_ms)
  finish 1 2
  ms=$(($(now_ms) - t1))
  left=$(for i in 1 2; do ip netns pids "${nodes[$i]}"; done | wc -l)
  if [[ "$rcs" != *"0 "* ]] && [ $ms -lt 15000 ] && [ "$left" = 0 ] &&
     ! grep -q "restarting it" "$tmp"/c10d.1 "$tmp"/c10d.2 &&
     [ "$(grep -l "the rendezvous store at $ep is gone with its node" "$tmp"/c10d.1 "$tmp"/c10d.2 | wc -l)" = 2 ]; then
    ok "c10d, the store's host killed: both survivors named the lost store and stopped in $ms ms"
  else
    fail "c10d store host: rcs=$rcs after $ms ms, $left left; $(tail -n 6 "$tmp"/c10d.1 "$tmp"/c10d.2)"
  fi
else
  kill_node 0; kill_node 1; kill_node 2
fi

[ $fails = 0 ] && echo "PASS" || echo "FAIL: $fails check(s)"
[ $fails = 0 ]
