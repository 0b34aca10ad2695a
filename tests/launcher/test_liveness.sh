#!/usr/bin/env bash
# Node liveness across a flaky link. Two "nodes" in network namespaces (tests/netns_lib.sh);
# while the job runs, node 1's link goes down for 2 s (the sleep is the fault injected, not
# synchronisation) and comes back:
#   1. with the default heartbeat settings the job rides it out: both nodes exit 0, so the
#      nodes' store connections survived the outage and stayed usable afterwards;
#   2. with --rdzv-conf heartbeat_timeout=1 node 0 declares node 1 dead (a line naming it) and
#      both nodes stop, non-zero, well before their workers would have finished;
#   3. a node whose ddprun is SIGKILLed closes its store connection: with the default (long)
#      heartbeat timeout, the other node still stops within 2 s.
# Usage: test_liveness.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip (not root, no ip/netns).
set -uo pipefail
ddprun=$(readlink -f "$1")

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"

netns_test_begin

netns_setup live "$tag" 10.213.9 2 || exit $?
nodes=("${NETNS_NODES[@]}")
addr=("${NETNS_ADDRS[@]}")
veth1=lv1$tag # node 1's end of its link (netns_lib.sh's naming)

now_ms() { echo $(($(date +%s%N) / 1000000)); }

port=29560 # the namespaces are new and empty: nothing else listens there
run_node() { # index logfile args...
  local i=$1 log=$2; shift 2
  ip netns exec "${nodes[$i]}" "$ddprun" "$@" >"$log" 2>&1 &
  pids[$i]=$!
}
wait_up() { # case: both workers running (bounded)
  local n
  for n in $(seq 600); do [ -e "$tmp/up.$1.0" ] && [ -e "$tmp/up.$1.1" ] && return 0; sleep 0.05; done
  return 1
}
finish() { # seconds: waits (bounded) for both nodes; sets rcs
  rcs=""
  for i in 0 1; do timeout "$1" tail -s 0.05 --pid="${pids[$i]}" -f /dev/null; wait "${pids[$i]}"; rcs+="$? "; done
}
link_blip() { # seconds
  ip -n "${nodes[1]}" link set "$veth1" down
  sleep "$1"
  ip -n "${nodes[1]}" link set "$veth1" up
}

# 1. Defaults: a 2 s link-down does not kill the job. The workers outlast the outage by a few
#    seconds, so the nodes also have to talk through their store connections after it.
for i in 0 1; do
  run_node $i "$tmp/a$i" --nnodes 2 --node-rank $i --master-addr "${addr[0]}" --master-port $port \
    --nproc-per-node 1 sh -c "touch $tmp/up.a.\$RANK; while [ ! -e $tmp/blip.a ]; do sleep 0.05; done; sleep 3; echo done"
done
if wait_up a; then
  link_blip 2
  touch "$tmp/blip.a"
  finish 60
  if [ "$rcs" = "0 0 " ] && grep -q 'done' "$tmp/a0" && grep -q 'done' "$tmp/a1"; then
    ok "2 s link-down with the default heartbeat settings: the job completed"
  else
    fail "link-down with defaults: rcs=$rcs; $(cat "$tmp/a0" "$tmp/a1")"
  fi
else
  fail "link-down with defaults: workers did not start; $(cat "$tmp/a0" "$tmp/a1")"
fi

# 2. heartbeat_timeout=1: the same outage stops the job, with node 1 named as dead.
for i in 0 1; do
  run_node $i "$tmp/b$i" --nnodes 2 --node-rank $i --master-addr "${addr[0]}" --master-port $((port + 1)) \
    --rdzv-conf heartbeat_timeout=1 --nproc-per-node 1 sh -c "touch $tmp/up.b.\$RANK; exec sleep 60"
done
if wait_up b; then
  t0=$(now_ms)
  link_blip 2 &
  blip=$!
  timeout 30 tail -s 0.05 --pid="${pids[0]}" -f /dev/null
  ms0=$(($(now_ms) - t0))
  wait $blip
  finish 30
  ms=$(($(now_ms) - t0))
  read -r r0 r1 <<<"$rcs"
  if [ "$r0" != 0 ] && [ "$r1" != 0 ] && grep -Eq 'node 1( \([^)]*\))?: stopped sending heartbeats' "$tmp/b0" &&
     [ $ms0 -le 5000 ] && [ $ms -le 15000 ]; then
    ok "2 s link-down with heartbeat_timeout=1: node 1 declared dead; node 0 stopped in $ms0 ms, node 1 in $ms ms"
  else
    fail "link-down with heartbeat_timeout=1: rcs=$rcs after $ms ms; $(cat "$tmp/b0" "$tmp/b1")"
  fi
else
  fail "heartbeat_timeout=1: workers did not start; $(cat "$tmp/b0" "$tmp/b1")"
fi

# 3. Node 1's ddprun SIGKILLed: its store connection closes, and node 0 stops within 2 s
#    although a silent node would count as dead only after 15 s.
for i in 0 1; do
  run_node $i "$tmp/c$i" --nnodes 2 --node-rank $i --master-addr "${addr[0]}" --master-port $((port + 2)) \
    --nproc-per-node 1 sh -c "touch $tmp/up.c.\$RANK; exec sleep 60"
done
if wait_up c; then
  t0=$(now_ms)
  kill -KILL "${pids[1]}"
  wait "${pids[1]}" 2>/dev/null
  timeout 10 tail -s 0.05 --pid="${pids[0]}" -f /dev/null
  ms=$(($(now_ms) - t0))
  wait "${pids[0]}"; r0=$?
  if [ $r0 != 0 ] && [ $ms -le 2000 ] && grep -q 'node 1' "$tmp/c0"; then
    ok "node 1 SIGKILLed: node 0 stopped in $ms ms"
  else
    fail "node kill: rc $r0 after $ms ms; $(cat "$tmp/c0")"
  fi
else
  fail "node kill: workers did not start; $(cat "$tmp/c0" "$tmp/c1")"
fi

echo "$((3 - fails)) passed, $fails failed"
[ $fails = 0 ]
