#!/usr/bin/env bash
# Behaviour of ddprun with real processes: output prefixing, a failing rank stopping the others
# with its exit code and a summary, a worker that ignores SIGTERM killed after the grace
# period, no worker left 1 s after ddprun is SIGKILLed, restarts, log files, signal
# forwarding and the rank filter. Usage: test_ddprun.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
tmp=$(mktemp -d)
cleanup() {
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# Waits (bounded, polling) until a command succeeds.
wait_for() { # seconds command...
  local end=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -ge $end ] && return 1
    sleep 0.05
  done
}

# 1. Environment and prefixed output.
out=$(timeout 20 "$ddprun" --standalone --nproc-per-node 2 sh -c 'echo "r=$RANK lr=$LOCAL_RANK ws=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE g=$GROUP_RANK"' 2>&1)
rc=$?
if [ $rc = 0 ] && grep -qx '\[0\]:r=0 lr=0 ws=2 lws=2 g=0' <<<"$out" && grep -qx '\[1\]:r=1 lr=1 ws=2 lws=2 g=0' <<<"$out"; then
  ok "environment and prefixes"
else
  fail "environment/prefix (rc=$rc): $out"
fi

# 2. A rank exiting with 3 stops the others; ddprun returns 3 and names the rank.
start=$SECONDS
timeout 30 "$ddprun" --standalone --nproc-per-node 3 sh -c "if [ \$RANK = 1 ]; then exit 3; fi; exec sleep 60" >"$tmp/o2" 2>"$tmp/e2"
rc=$?
if [ $rc = 3 ] && [ $((SECONDS - start)) -le 10 ] && grep -E '^root .* +1 +1 +exit 3 ' "$tmp/e2" >/dev/null; then
  ok "failing rank: exit 3, summary names rank 1"
else
  fail "failing rank: rc=$rc after $((SECONDS - start)) s; stderr: $(cat "$tmp/e2")"
fi

# 3. A worker ignoring SIGTERM is SIGKILLed after --shutdown-timeout.
start=$SECONDS
# Rank 0 fails only once rank 1 has set its trap (no race with the SIGTERM).
s3=$((4000 + $$ % 1000))
timeout 30 "$ddprun" --standalone --nproc-per-node 2 --shutdown-timeout 1 sh -c "trap '' TERM; if [ \$RANK = 0 ]; then while [ ! -e $tmp/trap.1 ]; do sleep 0.02; done; exit 5; fi; touch $tmp/trap.1; sleep $s3" >"$tmp/o3" 2>"$tmp/e3"
rc=$?
el=$((SECONDS - start))
if [ $rc = 5 ] && [ $el -le 8 ] && grep -q SIGKILL "$tmp/e3" && ! pgrep -fx "sleep $s3" >/dev/null; then
  ok "SIGTERM-ignoring worker killed after the grace period (${el} s)"
else
  fail "grace period: rc=$rc after $el s; $(cat "$tmp/e3")"
fi

# 4. SIGKILL of ddprun leaves no worker after 1 s.
s4=$((5000 + $$ % 1000))
"$ddprun" --standalone --nproc-per-node 4 sleep $s4 >/dev/null 2>&1 &
dp=$!
if wait_for 10 sh -c "[ \$(pgrep -fx 'sleep $s4' | wc -l) -ge 4 ]"; then
  kill -KILL $dp
  wait $dp 2>/dev/null
  if wait_for 1 sh -c "! pgrep -fx 'sleep $s4' >/dev/null"; then
    ok "no worker left 1 s after SIGKILL of ddprun"
  else
    fail "workers survived SIGKILL of ddprun: $(pgrep -afx "sleep $s4")"; pkill -KILL -fx "sleep $s4"
  fi
else
  fail "workers did not start"; kill -KILL $dp 2>/dev/null
fi

# 5. --max-restarts 2: fails on the first attempt, succeeds on the second.
out=$(timeout 30 "$ddprun" --standalone --nproc-per-node 2 --max-restarts 2 sh -c 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then exit 7; fi; echo "attempt=$TORCHELASTIC_RESTART_COUNT max=$TORCHELASTIC_MAX_RESTARTS"; sleep 0.2' 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q '\[0\]:attempt=1 max=2' <<<"$out"; then
  ok "restart: second attempt sees TORCHELASTIC_RESTART_COUNT=1"
else
  fail "restart (rc=$rc): $out"
fi

# 6. --log-dir with -t 3: per-run, per-attempt, per-local-rank files (torchrun's layout),
# written as the bytes arrive.
timeout 20 "$ddprun" --standalone --nproc-per-node 2 --log-dir "$tmp/logs" -t 3 sh -c 'echo "out $RANK"; echo "err $RANK" >&2' >"$tmp/o6" 2>&1
rc=$?
run=$(echo "$tmp"/logs/*_*)
if [ $rc = 0 ] && grep -qx 'out 1' "$run/attempt_0/1/stdout.log" && grep -qx 'err 0' "$run/attempt_0/0/stderr.log" && grep -q '\[1\]:out 1' "$tmp/o6"; then
  ok "log files and tee"
else
  fail "log dir (rc=$rc): $(ls -R "$tmp/logs" 2>&1) $(cat "$tmp/o6")"
fi

# 7. SIGUSR1 is forwarded to every worker's process group.
"$ddprun" --standalone --nproc-per-node 2 sh -c "trap 'echo got-usr1 \$RANK > $tmp/usr1.\$RANK; exit 0' USR1; echo ready > $tmp/ready.\$RANK; while :; do sleep 0.05; done" >/dev/null 2>&1 &
dp=$!
if wait_for 10 test -e "$tmp/ready.0" -a -e "$tmp/ready.1"; then
  kill -USR1 $dp
  if wait_for 5 test -e "$tmp/usr1.0" -a -e "$tmp/usr1.1"; then ok "SIGUSR1 forwarded"; else fail "SIGUSR1 not forwarded"; fi
else
  fail "workers not ready for SIGUSR1"
fi
kill -TERM $dp 2>/dev/null; wait $dp 2>/dev/null

# 8. SIGTERM stops the job: exit 128+15.
"$ddprun" --standalone --nproc-per-node 2 sh -c "echo x > $tmp/t.\$RANK; exec sleep 60" >/dev/null 2>&1 &
dp=$!
wait_for 10 test -e "$tmp/t.0" -a -e "$tmp/t.1"
kill -TERM $dp
wait $dp
rc=$?
if [ $rc = 143 ]; then ok "SIGTERM: exit 143"; else fail "SIGTERM: rc=$rc"; fi

# 9. --local-ranks-filter: only the chosen ranks reach the console.
out=$(timeout 20 "$ddprun" --standalone --nproc-per-node 3 --local-ranks-filter 1 sh -c 'echo "hello $RANK"' 2>&1)
if grep -q '\[1\]:hello 1' <<<"$out" && ! grep -q 'hello 0' <<<"$out" && ! grep -q 'hello 2' <<<"$out"; then
  ok "local ranks filter"
else
  fail "local ranks filter: $out"
fi
# ...ranks the node does not run are named in a warning; a filter of none it runs is a usage
# error (exit 2) before any worker starts, rather than a job whose console shows nothing.
out=$(timeout 20 "$ddprun" --standalone --nproc-per-node 2 --local-ranks-filter 1,5 sh -c 'echo "hello $RANK"' 2>&1)
if grep -q 'warning: --local-ranks-filter: local rank 5 does not run on this node (--nproc-per-node 2 runs 0 to 1)' <<<"$out" &&
   grep -q '\[1\]:hello 1' <<<"$out"; then
  ok "local ranks filter: a rank out of range warned of"
else
  fail "local ranks filter 1,5 on 2 ranks: $out"
fi
out=$(timeout 20 "$ddprun" --standalone --nproc-per-node 2 --local-ranks-filter 5 sh -c 'echo "hello $RANK"' 2>&1)
rc=$?
if [ $rc = 2 ] && grep -q "^ddprun: --local-ranks-filter: no local rank of '5' runs on this node (--nproc-per-node 2 runs local ranks 0 to 1)" <<<"$out" &&
   ! grep -q hello <<<"$out"; then
  ok "local ranks filter: no rank in range is a usage error"
else
  fail "local ranks filter 5 on 2 ranks: rc=$rc: $out"
fi

# 10. A bad flag names the flag.
out=$("$ddprun" --nproc-per-node x /bin/true 2>&1)
rc=$?
if [ $rc = 2 ] && grep -q -- '--nproc-per-node' <<<"$out"; then ok "bad flag named"; else fail "bad flag (rc=$rc): $out"; fi

# 11. A second SIGINT kills at once: the workers ignore SIGINT and SIGTERM, the grace is long.
"$ddprun" --standalone --nproc-per-node 2 --shutdown-timeout 60 sh -c "trap '' INT TERM; echo x > $tmp/i.\$RANK; while :; do sleep 0.05; done" >/dev/null 2>"$tmp/e11" &
dp=$!
wait_for 10 test -e "$tmp/i.0" -a -e "$tmp/i.1"
start=$SECONDS
kill -INT $dp
wait_for 10 grep -q "SIGINT again" "$tmp/e11" # as a person would: the second after the first took
kill -INT $dp
wait $dp
rc=$?
if [ $rc = 130 ] && [ $((SECONDS - start)) -le 5 ] && grep -q "second SIGINT" "$tmp/e11"; then
  ok "second SIGINT kills the workers"
else
  fail "second SIGINT: rc=$rc after $((SECONDS - start)) s; $(cat "$tmp/e11")"
fi

echo "$((11 - fails)) passed, $fails failed"
[ $fails = 0 ]
