#!/usr/bin/env bash
# SIGTERM and SIGINT stop ddprun in every phase, within a bound, with 128 + the signal and a line
# saying so: (1) a node waiting in the rendezvous for a node that never comes (SIGTERM, then
# SIGINT in a second run), (2) a node waiting in the rendezvous of a restart (its peer was
# SIGKILLed), (3) a node whose workers are running, (4) a node tearing a failed round down
# (teardown: it must not restart). Usage: signals.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
. "$(dirname "$0")/lib.sh"
BOUND_MS=2000 # a signalled node must be gone within this
now_ms() { date +%s%3N; }
# The port a process listens on (its embedded store), from ss(8).
listen_port() { ss -ltnpH 2>/dev/null | grep "pid=$1," | awk '{print $4}' | sed 's/.*://' | head -1; }
has_port() { [ -n "$(listen_port "$1")" ]; }
# True once child PID has exited (gone, or a zombie waiting for `wait`).
exited() { [ ! -e /proc/$1/stat ] || [ "$(sed 's/.*) //' /proc/$1/stat | cut -d' ' -f1)" = Z ]; }
# Waits (bounded) for child PID and sets rc; SIGKILLs it past the bound.
reap() { # pid seconds
  wait_for "$2" exited "$1" || kill -KILL "$1" 2>/dev/null
  wait "$1"; rc=$?
}

# Sends SIG to PID, waits for it (bounded) and checks the status, the time and the line in ERR.
check_stop() { # name pid sig want_rc errfile
  local name=$1 pid=$2 sig=$3 want=$4 err=$5 t0 rc el
  t0=$(now_ms)
  kill -s "$sig" "$pid"
  reap "$pid" 20
  el=$(( $(now_ms) - t0 ))
  if [ "$rc" = "$want" ] && [ "$el" -le $BOUND_MS ] && grep -q "ddprun: stopped by $sig" "$err"; then
    ok "$name: $sig -> rc $rc in $el ms"
  else
    fail "$name: $sig -> rc $rc (want $want) in $el ms (bound $BOUND_MS); stderr: $(cat "$err")"
  fi
}

# 1. A node of a two-node job, waiting in the rendezvous for node 1 (which never comes).
for sig in TERM INT; do
  want=$([ $sig = TERM ] && echo 143 || echo 130)
  "$ddprun" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 --no-python /bin/true \
    >"$tmp/o1$sig" 2>"$tmp/e1$sig" &
  p=$!; pids+=("$p")
  if wait_for 10 has_port "$p"; then
    check_stop "rendezvous wait" "$p" "SIG$sig" "$want" "$tmp/e1$sig"
  else
    fail "rendezvous wait: node 0 did not start its store: $(cat "$tmp/e1$sig")"
  fi
done

# 2. The rendezvous of a restart: node 1 is SIGKILLed, node 0 restarts (--max-restarts 1) and
# waits for it in round 1.
"$ddprun" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 --max-restarts 1 \
  --no-python sleep 60 >"$tmp/o2" 2>"$tmp/e2" &
p0=$!; pids+=("$p0")
if wait_for 10 has_port "$p0"; then
  port=$(listen_port "$p0")
  "$ddprun" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" \
    --no-python sleep 60 >"$tmp/o2b" 2>"$tmp/e2b" &
  p1=$!; pids+=("$p1")
  # Both nodes run their workers (each has a `sleep 60` child), then node 1 dies.
  if wait_for 10 sh -c "pgrep -P $p0 -x ddp-guard >/dev/null && pgrep -P $p1 -x ddp-guard >/dev/null"; then
    kill -KILL "$p1"
    if wait_for 10 grep -q "worker group failed: restarting it" "$tmp/e2"; then
      check_stop "restart wait" "$p0" SIGTERM 143 "$tmp/e2"
    else
      fail "restart wait: node 0 did not restart: $(cat "$tmp/e2")"
    fi
  else
    fail "restart wait: the workers did not start: $(cat "$tmp/e2" "$tmp/e2b")"
  fi
else
  fail "restart wait: node 0 did not start its store: $(cat "$tmp/e2")"
fi

# 3. Running workers (which honour SIGTERM).
"$ddprun" --standalone --nproc-per-node 2 --no-python sleep 60 >"$tmp/o3" 2>"$tmp/e3" &
p=$!; pids+=("$p")
if wait_for 10 sh -c "[ \$(pgrep -P $p -x ddp-guard | wc -l) -ge 2 ]"; then
  check_stop "running" "$p" SIGTERM 143 "$tmp/e3"
else
  fail "running: workers did not start: $(cat "$tmp/e3")"
fi

# 4. Teardown: rank 0 failed, rank 1 ignores SIGTERM (a long grace); SIGTERM to ddprun then
# means: no restart, exit 143. Rank 1 is SIGKILLed after --shutdown-timeout 1.
"$ddprun" --standalone --nproc-per-node 2 --max-restarts 3 --shutdown-timeout 1 --no-python \
  sh -c "trap '' TERM; if [ \$RANK = 0 ]; then while [ ! -e $tmp/t4 ]; do sleep 0.02; done; exit 5; fi; touch $tmp/t4; exec sleep 60" \
  >"$tmp/o4" 2>"$tmp/e4" &
p=$!; pids+=("$p")
# Wait until rank 0 has exited: rank 1 is then in its grace period.
if wait_for 10 sh -c "[ -e $tmp/t4 ] && [ \$(pgrep -P $p -x ddp-guard | wc -l) -eq 1 ]"; then
  t0=$(now_ms)
  kill -TERM "$p"
  reap "$p" 20
  el=$(( $(now_ms) - t0 ))
  # The grace period (1 s) is the worker's; then ddprun must stop, not restart.
  if [ $rc = 143 ] && [ $el -le 3000 ] && ! grep -q "worker group failed: restarting it" "$tmp/e4" &&
     grep -q "ddprun: stopped by SIGTERM" "$tmp/e4"; then
    ok "teardown: SIGTERM -> rc 143 in $el ms, no restart"
  else
    fail "teardown: rc $rc in $el ms; stderr: $(cat "$tmp/e4")"
  fi
else
  fail "teardown: rank 0 did not fail: $(cat "$tmp/e4")"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
