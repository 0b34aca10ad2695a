#!/usr/bin/env bash
# The job's control plane has a memory quota of its own (issue 20, point 3). A two-node job on
# loopback with a token; a process of the same user without the token fills the open key space
# of node 0's store (1 GiB, to the last bytes: 8 MiB values until one is refused, then ever
# smaller ones, then empty keys); then node 1's worker fails and the job restarts. Node 1
# publishes the failure and both nodes rendezvous again (compare_set, set, add on private keys),
# which are counted apart from the open keys: both nodes finish with status 0. Before, the full
# store refused them ("could not publish the failure", "rendezvous failed ... compare_set"),
# and both nodes exited 1.
# Synchronisation is by FIFOs; every wait is bounded.
# Usage: control_quota.sh DDPRUN DDP_RENDEZVOUS. Exit 0 pass, 1 fail, 77 skip.
set -uo pipefail
ddprun=$(readlink -f "$1")
rdzv=$(readlink -f "$2")
. "$(dirname "$0")/lib.sh"
command -v ss >/dev/null || { echo "skip: no ss(8)"; exit 77; }

listen_port() { ss -ltnpH 2>/dev/null | grep "pid=$1," | awk '{print $4}' | head -1 | sed 's/.*://'; }
has_port() { [ -n "$(listen_port "$1")" ]; }

(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tmp/token")
export DDPRUN_TOKEN_FILE=$tmp/token
mkfifo "$tmp/ready" "$tmp/go"
# Attempt 0: node 1's worker says it runs, waits for the test and fails; node 0's runs until
# the group is stopped. Attempt 1: both succeed.
worker='if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 1 ]; then echo up > "$1/ready"; read -r _ < "$1/go"; exit 1; fi
  exec sleep 120
fi
echo "rank $RANK attempt $TORCHELASTIC_RESTART_COUNT ok"'
common=(--nnodes 2 --nproc-per-node 1 --max-restarts 1 --master-addr 127.0.0.1 --no-python)
"$ddprun" "${common[@]}" --node-rank 0 --master-port 0 sh -c "$worker" sh "$tmp" \
  >"$tmp/node0" 2>&1 &
n0=$!; pids+=("$n0")
if ! wait_for 20 has_port "$n0"; then
  fail "node 0 did not start its store: $(cat "$tmp/node0")"
  exit 1
fi
port=$(listen_port "$n0")
"$ddprun" "${common[@]}" --node-rank 1 --master-port "$port" \
  sh -c "$worker" sh "$tmp" >"$tmp/node1" 2>&1 &
n1=$!; pids+=("$n1")
if ! timeout 60 cat "$tmp/ready" >/dev/null; then
  fail "the job did not come up: $(cat "$tmp/node0" "$tmp/node1")"
  exit 1
fi

stored=0
for size in $((8 << 20)) $((1 << 20)) $((128 << 10)) $((16 << 10)) 2048 256 0; do
  head -c "$size" /dev/zero > "$tmp/value"
  for i in $(seq 1 200); do
    env -u DDPRUN_TOKEN_FILE timeout 20 "$rdzv" set --port "$port" --timeout 5 \
      "fill/$size/$i" - < "$tmp/value" 2>>"$tmp/attacker" || break
    stored=$((stored + 1))
  done
done
status=$(env -u DDPRUN_TOKEN_FILE timeout 20 "$rdzv" status --port "$port" 2>/dev/null)
memory=$(grep -o '"memory": *[0-9]*' <<<"$status" | grep -o '[0-9]*$')
timeout 20 sh -c 'echo go > "$1/go"' sh "$tmp"
timeout 120 tail --pid="$n1" -f /dev/null
wait "$n1"; rc1=$?
timeout 120 tail --pid="$n0" -f /dev/null
wait "$n0"; rc0=$?
echo "attacker stored $stored values (open memory ${memory:-?} bytes) until refused;" \
  "node exits $rc0/$rc1"
if [ "$stored" -lt 100 ]; then
  fail "the attacker could not fill the store: $(tail -2 "$tmp/attacker")"
elif [ "$rc0" = 0 ] && [ "$rc1" = 0 ] && grep -q "attempt 1 ok" "$tmp/node0" &&
     ! grep -q "could not publish the failure" "$tmp/node0" "$tmp/node1"; then
  ok "open key space filled: the failure was published, the job restarted, both nodes exit 0"
else
  fail "node exits $rc0/$rc1; node 0: $(tail -8 "$tmp/node0"); node 1: $(tail -8 "$tmp/node1")"
fi
[ $fails = 0 ]
