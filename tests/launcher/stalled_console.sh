#!/usr/bin/env bash
# A console that stops reading never blocks ddprun: its standard output goes to a FIFO that the
# test holds open and never reads. (1) A rank that exits 7 still stops the job (the chatty rank
# blocked on its output): the workers are gone within 2 s, and ddprun exits with rc 7 and the
# summary, having given the console up 2 s after the failure as ddprun(1) says (one wait from
# the end of the round through the exit, not 2 s for each: by ddprun's own timestamps, within
# 3 s, where it used to be 4); (2) SIGTERM is honoured while the console is stalled (143 within
# 2 s, the console given up after half a second: within 0.9 s, where it used to be 1); (3) only
# the workers writing to the stalled console wait: a rank writing 256 KiB to standard error (a
# file) finishes meanwhile; (4) in a two-node job, node 0 with a stalled console still stops
# when node 1's rank fails, giving its console up 2 s later.
# Usage: stalled_console.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
. "$(dirname "$0")/lib.sh"
cleanup_hook() { exec 3>&- 2>/dev/null; } # the stalled console's FIFO (fd 3, below)
now_ms() { date +%s%3N; }
exited() { [ ! -e /proc/$1/stat ] || [ "$(sed 's/.*) //' /proc/$1/stat | cut -d' ' -f1)" = Z ]; }
reap() { # pid seconds: waits (bounded) for child PID, SIGKILLs it past the bound; sets rc
  wait_for "$2" exited "$1" || kill -KILL "$1" 2>/dev/null
  wait "$1"; rc=$?
}
# True once some worker of PID named NAME sleeps writing its output (a pipe or, as libuv makes
# them, a socket pair) because nobody reads it.
no_workers() { [ -z "$(guards_of "$1")" ]; }
# The time of ddprun's first line in FILE that contains TEXT, in ms since the epoch, by the
# line's own timestamp ("[2026-11-24 21:03:04.123] ddprun: ...").
stamp_ms() {
  local t
  t=$(grep -m1 -F -- "$2" "$1" | sed -n 's/^\[\([^]]*\)\].*/\1/p')
  [ -n "$t" ] && date -d "$t" +%s%3N
}
# Milliseconds from ddprun's line in FILE with TEXT to its line saying the console's output was
# given up, by their timestamps; "never" when either is missing.
given_up_ms() {
  local a b
  a=$(stamp_ms "$1" "$2") && b=$(stamp_ms "$1" "bytes of output dropped") && echo $((b - a)) ||
    echo never
}
within() { [ "$1" != never ] && [ "$1" -le "$2" ]; }
# Milliseconds from t0 until ddprun PID has no guard left (its workers stopped), bounded.
workers_gone_ms() { wait_for 10 no_workers "$1" && echo $(( $(now_ms) - t0 )) || echo never; }
blocked_writing() { # pid name
  local c
  for c in $(workers_of "$1" "$2"); do
    case $(cat /proc/$c/wchan 2>/dev/null) in *pipe_write* | sock_alloc_send* | unix_stream_send*) return 0 ;; esac
  done
  return 1
}

# The stalled console: a FIFO whose reading end this shell holds (fd 3) and never reads.
mkfifo "$tmp/console"
exec 3<>"$tmp/console"

# 1. Rank 0 floods standard output; rank 1 exits 7 once rank 0 is blocked.
"$ddprun" --standalone --nproc-per-node 2 --no-python sh -c \
  "if [ \$RANK = 0 ]; then exec yes flood; fi; while [ ! -e $tmp/go1 ]; do sleep 0.02; done; exit 7" \
  >"$tmp/console" 2>"$tmp/e1" 3>&- &
p=$!; pids+=("$p")
if wait_for 10 blocked_writing "$p" yes; then
  t0=$(now_ms)
  touch "$tmp/go1"
  gone=$(workers_gone_ms "$p")
  reap "$p" 20
  el=$(( $(now_ms) - t0 ))
  up=$(given_up_ms "$tmp/e1" "failed: exit 7")
  if [ "$gone" != never ] && [ "$gone" -le 2000 ] && [ $rc = 7 ] && [ $el -le 8000 ] &&
     within "$up" 3000 && grep -Eq '^root .* +1 +1 +exit 7 ' "$tmp/e1"; then
    ok "stalled console: rank 1's exit 7 stopped the workers in $gone ms, ddprun gave the console up $up ms after the failure and exited 7 in $el ms with the summary"
  else
    fail "stalled console: workers gone after $gone ms (want 2000), console given up after $up ms (want 2000, at most 3000), rc $rc in $el ms (want 7 within 8000 ms); stderr: $(head -c 2000 "$tmp/e1")"
  fi
else
  fail "stalled console: the flooding rank never blocked; stderr: $(head -c 2000 "$tmp/e1")"
fi

# 2. SIGTERM while the console is stalled.
"$ddprun" --standalone --nproc-per-node 1 --no-python yes flood >"$tmp/console" 2>"$tmp/e2" 3>&- &
p=$!; pids+=("$p")
if wait_for 10 blocked_writing "$p" yes; then
  t0=$(now_ms)
  kill -TERM "$p"
  reap "$p" 20
  el=$(( $(now_ms) - t0 ))
  up=$(given_up_ms "$tmp/e2" "received SIGTERM")
  if [ $rc = 143 ] && [ $el -le 2000 ] && within "$up" 900 &&
     grep -q "ddprun: stopped by SIGTERM" "$tmp/e2"; then
    ok "stalled console: SIGTERM -> console given up after $up ms, rc 143 in $el ms"
  else
    fail "stalled console: SIGTERM -> console given up after $up ms (want 500, at most 900), rc $rc in $el ms (want 143 within 2000 ms); stderr: $(head -c 2000 "$tmp/e2")"
  fi
else
  fail "stalled console (SIGTERM): the worker never blocked; stderr: $(head -c 2000 "$tmp/e2")"
fi

# 3. Back-pressure is per stream: rank 1 writes 256 KiB to standard error (a file, not stalled)
# and finishes while rank 0 is blocked on the stalled standard output.
"$ddprun" --standalone --nproc-per-node 2 --no-python sh -c \
  "if [ \$RANK = 0 ]; then exec yes flood; fi; head -c 262144 /dev/zero | tr '\\0' e | fold -w 63 >&2; touch $tmp/done3; exec sleep 60" \
  >"$tmp/console" 2>"$tmp/e3" 3>&- &
p=$!; pids+=("$p")
lines3() { [ "$(grep -c '^\[1\]:eeee' "$tmp/e3")" -ge 4161 ]; }
if wait_for 10 blocked_writing "$p" yes && wait_for 10 test -e "$tmp/done3" && wait_for 5 lines3; then
  ok "stalled console slows only its writers: rank 1's 4161 lines reached stderr meanwhile"
else
  fail "stalled console: rank 1 could not write its stderr while stdout was stalled ($(grep -c '^\[1\]:eeee' "$tmp/e3") of 4161 lines)"
fi
kill -TERM "$p" 2>/dev/null
reap "$p" 20

# 4. Two nodes: node 0's console is stalled by its flooding worker; node 1's worker exits 7.
# Node 0 must hear of it through the store and stop too (its loop is not stuck in a write).
listen_port() { ss -ltnpH 2>/dev/null | grep "pid=$1," | awk '{print $4}' | sed 's/.*://' | head -1; }
has_port() { [ -n "$(listen_port "$1")" ]; }
"$ddprun" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 --no-python yes flood \
  >"$tmp/console" 2>"$tmp/e4" 3>&- &
p0=$!; pids+=("$p0")
if wait_for 10 has_port "$p0"; then
  "$ddprun" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$(listen_port "$p0")" \
    --no-python sh -c "while [ ! -e $tmp/go4 ]; do sleep 0.02; done; exit 7" >"$tmp/o4b" 2>&1 3>&- &
  p1=$!; pids+=("$p1")
  if wait_for 10 blocked_writing "$p0" yes; then
    t0=$(now_ms)
    touch "$tmp/go4"
    gone=$(workers_gone_ms "$p0")
    reap "$p0" 20
    el=$(( $(now_ms) - t0 ))
    rc0=$rc
    reap "$p1" 20
    up=$(given_up_ms "$tmp/e4" "sending SIGTERM")
    if [ "$gone" != never ] && [ "$gone" -le 2000 ] && [ $rc0 = 7 ] && [ $rc = 7 ] &&
       [ $el -le 8000 ] && within "$up" 3000 && grep -q "rank 1 on .* failed" "$tmp/e4"; then
      ok "stalled console on node 0: node 1's failure stopped its workers in $gone ms, node 0 gave its console up $up ms later and exited 7 in $el ms"
    else
      fail "two nodes: node 0's workers gone after $gone ms (want 2000), console given up after $up ms (want 2000, at most 3000), node 0 rc $rc0 in $el ms, node 1 rc $rc (want 7, 7 within 8000 ms); node 0: $(head -c 2000 "$tmp/e4")"
    fi
  else
    fail "two nodes: node 0's worker never blocked; $(head -c 2000 "$tmp/e4")"
    kill -KILL "$p0" "$p1" 2>/dev/null
  fi
else
  fail "two nodes: node 0 did not start its store: $(cat "$tmp/e4")"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
