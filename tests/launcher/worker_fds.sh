#!/usr/bin/env bash
# Workers get standard input, output and error and nothing else: descriptors the shell passed to
# ddprun (here 7, 9 and 12, besides whatever the test's caller left open) do not reach them, as
# with torchrun. The test reads each worker's /proc/PID/fd from outside; checked with the output
# relayed through pipes, with --no-prefix (a worker writing to the console itself), and on two
# nodes (where ddprun also holds store connections and hosts the store).
# Usage: worker_fds.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
. "$(dirname "$0")/lib.sh"

# The workers of ddprun PID are `sleep`s (workers_of: lib.sh).
nworkers() { [ "$(workers_of "$1" sleep | wc -l)" -ge "$2" ]; }
# The descriptors of each worker, one line per worker.
worker_fds() { for w in $(workers_of "$1" sleep); do ls /proc/$w/fd | sort -n | tr '\n' ' '; echo; done; }
only_std() { # ddprun_pid n: every one of n workers has exactly 0 1 2
  local out; out=$(worker_fds "$1")
  [ "$(grep -cx '0 1 2 ' <<<"$out")" = "$2" ] || { echo "$out"; return 1; }
}
listen_port() { ss -ltnpH 2>/dev/null | grep "pid=$1," | awk '{print $4}' | sed 's/.*://' | head -1; }
has_port() { [ -n "$(listen_port "$1")" ]; }
stop() { for p in "$@"; do kill -TERM "$p" 2>/dev/null; done; for p in "$@"; do timeout 10 tail --pid="$p" -f /dev/null; wait "$p" 2>/dev/null; done; }

for extra in "" "--no-prefix"; do
  name="single node ${extra:-(relayed output)}"
  "$ddprun" --standalone --nproc-per-node 2 $extra --no-python sleep 30 \
    >"$tmp/o" 2>&1 7>"$tmp/seven" 9<"$tmp/seven" 12>&1 &
  p=$!; pids+=("$p")
  if wait_for 10 nworkers "$p" 2; then
    if got=$(only_std "$p" 2); then ok "$name: workers hold only 0 1 2"; else fail "$name: workers hold: $got"; fi
  else
    fail "$name: workers did not start: $(cat "$tmp/o")"
  fi
  stop "$p"
done

# Two nodes on this host: node 0 hosts the store (port 0, read back from ss), node 1 joins.
"$ddprun" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 --no-python sleep 30 \
  >"$tmp/o0" 2>&1 7>"$tmp/seven" &
p0=$!; pids+=("$p0")
if wait_for 10 has_port "$p0"; then
  "$ddprun" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$(listen_port "$p0")" \
    --no-python sleep 30 >"$tmp/o1" 2>&1 7>"$tmp/seven" 9>"$tmp/seven" &
  p1=$!; pids+=("$p1")
  if wait_for 10 nworkers "$p0" 1 && wait_for 10 nworkers "$p1" 1; then
    if g0=$(only_std "$p0" 1) && g1=$(only_std "$p1" 1); then
      ok "two nodes: workers hold only 0 1 2"
    else
      fail "two nodes: workers hold: node 0: ${g0:-}; node 1: ${g1:-}"
    fi
  else
    fail "two nodes: workers did not start: $(cat "$tmp/o0" "$tmp/o1")"
  fi
  stop "$p0" "$p1"
else
  fail "two nodes: node 0 did not start its store: $(cat "$tmp/o0")"
  stop "$p0"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
