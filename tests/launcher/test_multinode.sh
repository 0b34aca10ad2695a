#!/usr/bin/env bash
# Three "nodes" in network namespaces with their own addresses, joined by a bridge that lives in
# a fourth namespace; the test creates and removes all of them and touches nothing in the host's
# own network namespace. Checks static and dynamic (c10d) rendezvous across the nodes, and that
# killing one node's ddprun mid-run makes the others stop within 2 s.
# Usage: test_multinode.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip (not root, no ip/netns).
set -uo pipefail
ddprun=$(readlink -f "$1")

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"

netns_test_begin

netns_setup ddp "$tag" 10.213.7 3 || exit $? # exist only inside the test's namespaces
nodes=("${NETNS_NODES[@]}")
addr=("${NETNS_ADDRS[@]}")

# The namespaces are new and empty, so a fixed port cannot collide with anything there.
port=29555

# run_nodes NAME ARGS-PER-NODE... : starts ddprun in each namespace; fills pids[].
run_node() { # index logfile args...
  local i=$1 log=$2; shift 2
  ip netns exec "${nodes[$i]}" "$ddprun" "$@" >"$log" 2>&1 &
  pids[$i]=$!
}

# 1. Static: 3 nodes with 1, 2 and 3 workers; ranks are prefix sums.
for i in 0 1 2; do
  run_node $i "$tmp/s$i" --nnodes 3 --node-rank $i --master-addr "${addr[0]}" --master-port $port \
    --nproc-per-node $((i + 1)) sh -c 'echo "rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK master=$MASTER_ADDR"'
done
rcs=""
for i in 0 1 2; do timeout 30 tail --pid="${pids[$i]}" -f /dev/null; wait "${pids[$i]}"; rcs+="$? "; done
ranks=$(cat "$tmp"/s0 "$tmp"/s1 "$tmp"/s2 | grep -o 'rank=[0-9]* world=6' | sort -t= -k2 -n | tr '\n' ' ')
if [ "$rcs" = "0 0 0 " ] && [ "$ranks" = "rank=0 world=6 rank=1 world=6 rank=2 world=6 rank=3 world=6 rank=4 world=6 rank=5 world=6 " ] &&
   grep -q 'rank=3 world=6 group=2 master=10.213.7.1' "$tmp/s2"; then
  ok "static rendezvous across 3 namespaces"
else
  fail "static: rcs=$rcs ranks=$ranks; $(cat "$tmp"/s0 "$tmp"/s1 "$tmp"/s2)"
fi

# 2. Dynamic (c10d): --nnodes 2:3, all three join; node ranks and world size agree.
for i in 0 1 2; do
  run_node $i "$tmp/d$i" --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint "${addr[0]}:$((port + 1))" \
    --rdzv-id dyn$tag --nproc-per-node 2 sh -c 'echo "rank=$RANK world=$WORLD_SIZE groups=$GROUP_WORLD_SIZE"'
done
rcs=""
for i in 0 1 2; do timeout 60 tail --pid="${pids[$i]}" -f /dev/null; wait "${pids[$i]}"; rcs+="$? "; done
n=$(cat "$tmp"/d0 "$tmp"/d1 "$tmp"/d2 | grep -c 'world=6 groups=3')
distinct=$(cat "$tmp"/d0 "$tmp"/d1 "$tmp"/d2 | grep -o 'rank=[0-9]*' | sort -u | wc -l)
if [ "$rcs" = "0 0 0 " ] && [ "$n" = 6 ] && [ "$distinct" = 6 ]; then
  ok "dynamic rendezvous: 3 nodes joined 2:3, 6 distinct ranks"
else
  fail "dynamic: rcs=$rcs lines=$n distinct=$distinct; $(cat "$tmp"/d0 "$tmp"/d1 "$tmp"/d2)"
fi

# 3. A node killed mid-run: the others stop within 2 s.
for i in 0 1 2; do
  run_node $i "$tmp/k$i" --nnodes 3 --node-rank $i --master-addr "${addr[0]}" --master-port $((port + 2)) \
    --nproc-per-node 1 sh -c "echo up > $tmp/up.\$RANK; exec sleep 120"
done
for _ in $(seq 400); do [ -e "$tmp/up.0" ] && [ -e "$tmp/up.1" ] && [ -e "$tmp/up.2" ] && break; sleep 0.05; done
t0=$(date +%s%N)
kill -KILL "${pids[2]}"
wait "${pids[2]}" 2>/dev/null
timeout 10 tail --pid="${pids[0]}" -f /dev/null
timeout 10 tail --pid="${pids[1]}" -f /dev/null
t1=$(date +%s%N)
ms=$(((t1 - t0) / 1000000))
wait "${pids[0]}"; r0=$?
wait "${pids[1]}"; r1=$?
if [ $r0 != 0 ] && [ $r1 != 0 ] && [ $ms -le 2000 ]; then
  ok "node 2 killed: nodes 0 and 1 stopped in $ms ms"
else
  fail "node kill: rc $r0/$r1 after $ms ms; $(cat "$tmp"/k0 "$tmp"/k1)"
fi

# 4. Elastic growth: nodes 0 and 1 start a 2:3 job; node 2 arrives later and is admitted: the
#    running nodes see it waiting, stop their workers and re-rendezvous with it (no restart used).
for i in 0 1; do
  run_node $i "$tmp/g$i" --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint "${addr[0]}:$((port + 3))" \
    --rdzv-id grow$tag --rdzv-conf last_call_timeout=0.5 --nproc-per-node 1 \
    sh -c "echo \$WORLD_SIZE > $tmp/grow.\$RANK.\$WORLD_SIZE; [ \$WORLD_SIZE = 3 ] || exec sleep 120"
done
for _ in $(seq 400); do [ -e "$tmp/grow.0.2" ] && [ -e "$tmp/grow.1.2" ] && break; sleep 0.05; done
run_node 2 "$tmp/g2" --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint "${addr[0]}:$((port + 3))" \
  --rdzv-id grow$tag --rdzv-conf last_call_timeout=0.5 --nproc-per-node 1 \
  sh -c "echo \$WORLD_SIZE > $tmp/grow.\$RANK.\$WORLD_SIZE; [ \$WORLD_SIZE = 3 ] || exec sleep 120"
rcs=""
for i in 0 1 2; do timeout 60 tail --pid="${pids[$i]}" -f /dev/null; wait "${pids[$i]}"; rcs+="$? "; done
if [ "$rcs" = "0 0 0 " ] && [ -e "$tmp/grow.0.2" ] && [ -e "$tmp/grow.0.3" ] && [ -e "$tmp/grow.2.3" ]; then
  ok "elastic growth: a late node was admitted (world 2 -> 3)"
else
  fail "growth: rcs=$rcs files=$(ls "$tmp" | grep grow | tr '\n' ' '); $(cat "$tmp"/g0 "$tmp"/g1 "$tmp"/g2)"
fi

# 5. A restart across nodes: rank 1 (node 1) fails on attempt 0; both nodes meet again, node 0
#    clears the old attempt's keys before anyone spawns, and attempt 1 succeeds everywhere.
for i in 0 1; do
  run_node $i "$tmp/r$i" --nnodes 2 --node-rank $i --master-addr "${addr[0]}" --master-port $((port + 4)) \
    --nproc-per-node 1 --max-restarts 1 \
    sh -c '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && exit 4; echo "attempt=$TORCHELASTIC_RESTART_COUNT"; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || exec sleep 60'
done
rcs=""
for i in 0 1; do timeout 60 tail --pid="${pids[$i]}" -f /dev/null; wait "${pids[$i]}"; rcs+="$? "; done
if [ "$rcs" = "0 0 " ] && grep -q '\[0\]:attempt=1' "$tmp/r0" && grep -q '\[1\]:attempt=1' "$tmp/r1"; then
  ok "restart across two nodes"
else
  fail "restart across nodes: rcs=$rcs; $(cat "$tmp"/r0 "$tmp"/r1)"
fi

echo "$((5 - fails)) passed, $fails failed"
[ $fails = 0 ]
