#!/usr/bin/env bash
# A master address that resolves only to loopback makes the store ddprun hosts listen on that
# loopback address, not on every interface: "LOCALHOST" (a spelling the old literal comparison
# missed), the loopback address 127.0.1.1, and this host's name when it resolves to loopback
# only (as /etc/hosts often makes it). Each time a second node joins through the same name and
# the two-node job runs to completion. Usage: loopback_bind.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
. "$(dirname "$0")/lib.sh"

listen_addr() { ss -ltnpH 2>/dev/null | grep "pid=$1," | awk '{print $4}' | head -1; }
has_port() { [ -n "$(listen_addr "$1")" ]; }

hosts=(LOCALHOST 127.0.1.1)
self=$(hostname)
if addrs=$(getent ahosts "$self" | awk '{print $1}' | sort -u) && [ -n "$addrs" ] &&
   ! grep -qvE '^(127\.|::1$)' <<<"$addrs"; then
  hosts+=("$self")
else
  echo "note: $self does not resolve to loopback only; not checked"
fi

for h in "${hosts[@]}"; do
  # Node 0's worker waits for a file, so that its store is looked at while the job runs.
  "$ddprun" --nnodes 2 --node-rank 0 --master-addr "$h" --master-port 0 --no-python \
    sh -c "while [ ! -e $tmp/go.$h ]; do sleep 0.02; done" >"$tmp/o0" 2>&1 &
  p0=$!; pids+=("$p0")
  if ! wait_for 10 has_port "$p0"; then
    fail "$h: node 0 did not start its store: $(cat "$tmp/o0")"
    kill -KILL "$p0"; wait "$p0" 2>/dev/null
    continue
  fi
  addr=$(listen_addr "$p0")
  port=${addr##*:}
  timeout 30 "$ddprun" --nnodes 2 --node-rank 1 --master-addr "$h" --master-port "$port" \
    --no-python true >"$tmp/o1" 2>&1 &
  p1=$!
  touch "$tmp/go.$h"
  wait "$p1"; rc1=$?
  timeout 30 tail --pid="$p0" -f /dev/null
  wait "$p0"; rc0=$?
  if [[ $addr == 127.* ]] && [ $rc0 = 0 ] && [ $rc1 = 0 ]; then
    ok "$h: the store listens on $addr; the two-node job ran"
  else
    fail "$h: the store listens on $addr (want 127.*); rc $rc0/$rc1; $(cat "$tmp/o0" "$tmp/o1")"
  fi
done

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
