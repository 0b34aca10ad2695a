#!/usr/bin/env bash
# Node-level failures name the node by rank and host name. Nodes in network namespaces
# (tests/netns_lib.sh), each with a host name of its own (a UTS namespace, unshare(1)):
#   1. node 1's ddprun SIGKILLed while its worker runs: node 0 says "node 1 (<node 1's host>):
#      closed its connection to the store ...", its summary's root row is that sentence, and no
#      row says node "?", rank -1 or pid 0;
#   2. three nodes, node 2 with another token: node 2 exits at once saying the tokens differ;
#      node 0's store logs the failed authentication with node 2's address (10.x.x.3:PORT);
#      node 0 (serving the store) and node 1 (waiting at the rendezvous) each say within 5 s
#      that this address failed to authenticate, and give up at their join timeout.
# Usage: failure_nodes.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip (not root, no ip/netns/unshare).
set -uo pipefail
ddprun=$(readlink -f "$1")

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"

netns_test_begin
command -v unshare >/dev/null || { echo "skip: no unshare(1)"; exit 77; }

netns_setup fnode "$tag" 10.213.47 3 || exit $?

port=29590 # the namespaces are new and empty: nothing else listens there
now_ms() { echo $(($(date +%s%N) / 1000000)); }
hosts=(fnode0-$tag fnode1-$tag fnode2-$tag)
run_named() { # index logfile env args...: ddprun in node i's namespace, under its host name
  local i=$1 log=$2 env=$3
  shift 3
  ip netns exec "${NETNS_NODES[$i]}" unshare --uts sh -c \
    'hostname "$1"; shift; exec env "$@"' sh "${hosts[$i]}" $env "$ddprun" "$@" >"$log" 2>&1 &
  pids[$i]=$!
}
unshare --uts true 2>/dev/null || { echo "skip: unshare --uts not permitted"; exit 77; }

# 1. Node 1 killed.
for i in 0 1; do
  run_named $i "$tmp/k$i" "X=1" --nnodes 2 --node-rank $i --master-addr "${NETNS_ADDRS[0]}" \
    --master-port $port --nproc-per-node 1 --no-python sh -c "touch $tmp/up.\$GROUP_RANK; exec sleep 60"
done
for n in $(seq 600); do [ -e "$tmp/up.0" ] && [ -e "$tmp/up.1" ] && break; sleep 0.05; done
if [ -e "$tmp/up.0" ] && [ -e "$tmp/up.1" ]; then
  ip netns pids "${NETNS_NODES[1]}" | xargs -r kill -KILL 2>/dev/null
  wait "${pids[1]}" 2>/dev/null
  timeout 10 tail -s 0.05 --pid="${pids[0]}" -f /dev/null
  wait "${pids[0]}"; r0=$?
  TS='\[[0-9-]+ [0-9:.]+\]'
  if [ $r0 != 0 ] &&
     grep -Eq "^$TS ddprun: node 1 \(${hosts[1]}\): closed its connection to the store \(its ddprun exited or was killed\): stopping the local workers$" "$tmp/k0" &&
     grep -Eq "^root +[0-9-]+ [0-9:.]+ +node 1 \(${hosts[1]}\): closed its connection to the store" "$tmp/k0" &&
     ! grep -Eq '^(root|teardown|) +[0-9-]+ [0-9:.]+ .*( \? | -1 )' "$tmp/k0"; then
    ok "node 1 killed: named 'node 1 (${hosts[1]})' in the line and the summary"
  else
    fail "node kill: rc $r0; node 0: $(cat "$tmp/k0")"
  fi
else
  fail "node kill: workers did not start; $(cat "$tmp/k0" "$tmp/k1")"
fi

# 2. Node 2 with another token.
good="DDPRUN_TOKEN=$(printf 'a%.0s' $(seq 32))"
run_named 0 "$tmp/t0" "$good" --nnodes 3 --node-rank 0 --master-addr "${NETNS_ADDRS[0]}" \
  --master-port $((port + 1)) --rdzv-conf join_timeout=8 --no-python true
for n in $(seq 200); do
  ip netns exec "${NETNS_NODES[0]}" ss -ltnH "sport = :$((port + 1))" | grep -q . && break
  sleep 0.05
done
run_named 1 "$tmp/t1" "$good" --nnodes 3 --node-rank 1 --master-addr "${NETNS_ADDRS[0]}" \
  --master-port $((port + 1)) --rdzv-conf join_timeout=8 --no-python true
t0=$(now_ms)
run_named 2 "$tmp/t2" "DDPRUN_TOKEN=$(printf 'b%.0s' $(seq 32))" --nnodes 3 --node-rank 2 \
  --master-addr "${NETNS_ADDRS[0]}" --master-port $((port + 1)) --rdzv-conf join_timeout=8 \
  --no-python true
addr2=${NETNS_ADDRS[2]//./\\.}
said="" ms=""
for n in $(seq 100); do
  if grep -Eq "waiting for the other nodes: $addr2:[0-9]+ failed to authenticate" "$tmp/t0" &&
     grep -Eq "waiting for the other nodes: $addr2:[0-9]+ failed to authenticate" "$tmp/t1"; then
    said=1
    break
  fi
  sleep 0.05
done
ms=$(($(now_ms) - t0))
wait "${pids[2]}"; r2=$?
for i in 0 1; do
  timeout 20 tail -s 0.05 --pid="${pids[$i]}" -f /dev/null
  wait "${pids[$i]}"; rc[$i]=$?
done
if [ -n "$said" ] && [ $ms -le 5000 ] && [ ${rc[0]} != 0 ] && [ ${rc[1]} != 0 ] && [ $r2 != 0 ] &&
   grep -Eq "store: closing connection from $addr2:[0-9]+: authentication failed" "$tmp/t0" &&
   grep -q "its token is not this node's" "$tmp/t2"; then
  ok "wrong token on node 2: node 0 logged ${NETNS_ADDRS[2]}; nodes 0 and 1 said so in $ms ms"
else
  fail "wrong token: rc ${rc[0]} ${rc[1]} $r2 after $ms ms; node 0: $(cat "$tmp/t0"); node 1: $(cat "$tmp/t1"); node 2: $(cat "$tmp/t2")"
fi

echo "$((2 - fails)) passed, $fails failed"
[ $fails = 0 ]
