#!/usr/bin/env bash
# The node that serves the rendezvous store dies (every process in its network namespace
# SIGKILLed, tests/netns_lib.sh): the store's control plane went with it, so the surviving
# agents must say so and stop, not announce a restart that cannot happen.
#   1. c10d, --nnodes 2:3 --max-restarts 1, three nodes, the endpoint on node 0: nodes 1 and 2
#      print "the rendezvous store at ADDR:PORT is gone with its node", no "restarting it"
#      line, exit non-zero within 10 s and leave no process in their namespaces;
#   2. static, two nodes, --max-restarts 1: node 1 says the same of node 0's store.
# Usage: store_node_loss.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip (not root, no ip/netns).
set -uo pipefail
ddprun=$(readlink -f "$1")

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"

netns_test_begin

netns_setup sgone "$tag" 10.213.31 3 || exit $?

port=29570 # the namespaces are new and empty: nothing else listens there
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); } # a date +%s%N
wait_up() { # case count: that many workers running (bounded)
  local n
  for n in $(seq 600); do
    [ "$(ls "$tmp" | grep -c "^up\.$1\.")" -ge "$2" ] && return 0
    sleep 0.05
  done
  return 1
}
# Kills node 0 (its ddprun and workers, everything in its namespace), then checks nodes 1..n-1.
check_survivors() { # case name endpoint n
  local c=$1 name=$2 ep=$3 n=$4 i t0 ms rc left bad=""
  t0=$(date +%s%N)
  ip netns pids "${NETNS_NODES[0]}" | xargs -r kill -KILL 2>/dev/null
  wait "${pids[0]}" 2>/dev/null
  for ((i = 1; i < n; i++)); do
    timeout 10 tail -s 0.05 --pid="${pids[$i]}" -f /dev/null
    ms=$(ms_since "$t0")
    wait "${pids[$i]}"; rc=$?
    left=$(ip netns pids "${NETNS_NODES[$i]}" | wc -l)
    if [ $rc = 0 ] || [ $ms -gt 10000 ] || [ "$left" != 0 ] ||
       ! grep -qF "the rendezvous store at $ep is gone with its node" "$tmp/$c$i" ||
       grep -q 'restarting it' "$tmp/$c$i"; then
      bad+=" node $i: rc $rc after $ms ms, $left processes left; $(cat "$tmp/$c$i")"
    fi
  done
  if [ -z "$bad" ]; then
    ok "$name: the survivors named the lost store $ep and stopped (last after $ms ms)"
  else
    fail "$name:$bad"
  fi
}

# 1. c10d, three nodes, endpoint on node 0.
ep="${NETNS_ADDRS[0]}:$port"
for i in 0 1 2; do
  netns_run_node $i "$tmp/a$i" --nnodes 2:3 --rdzv-backend c10d --rdzv-endpoint "$ep" --rdzv-id gone \
    --max-restarts 1 --nproc-per-node 1 sh -c "touch $tmp/up.a.\$RANK; exec sleep 60"
done
if wait_up a 3; then
  check_survivors a "c10d, the endpoint's node killed" "$ep" 3
else
  fail "c10d: workers did not start; $(cat "$tmp/a0" "$tmp/a1" "$tmp/a2")"
fi

# 2. static, two nodes, node 0 serves the store.
ep="${NETNS_ADDRS[0]}:$((port + 1))"
for i in 0 1; do
  netns_run_node $i "$tmp/b$i" --nnodes 2 --node-rank $i --master-addr "${NETNS_ADDRS[0]}" \
    --master-port $((port + 1)) --max-restarts 1 --nproc-per-node 1 \
    sh -c "touch $tmp/up.b.\$RANK; exec sleep 60"
done
if wait_up b 2; then
  check_survivors b "static, node 0 killed" "$ep" 2
else
  fail "static: workers did not start; $(cat "$tmp/b0" "$tmp/b1")"
fi

echo "$((2 - fails)) passed, $fails failed"
[ -n "${SHOW_LOGS:-}" ] && cat "$tmp"/a1 "$tmp"/b1
[ $fails = 0 ]
