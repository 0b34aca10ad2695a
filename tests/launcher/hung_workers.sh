#!/usr/bin/env bash
# --hung-timeout: a node whose workers are all stopped (SIGSTOP) or all silent for the timeout
# fails like a node whose worker failed (rc 1, a summary line "workers hung", no worker left),
# and restarts when a restart is left; workers that are busy printing, or a silent one next to
# one that prints, are left alone; PET_HUNG_TIMEOUT sets it too; without it (the default) a
# silent job is not touched. Usage: hung_workers.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
tmp=$(mktemp -d)
main=$BASHPID
cleanup() { [ "$BASHPID" = "$main" ] && rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
now_ms() { date +%s%3N; }

# Runs ddprun with a bound; sets rc, el (ms) and leaves stdout+stderr in $tmp/out.
run() {
  local t0; t0=$(now_ms)
  timeout -s KILL 30 "$ddprun" "$@" >"$tmp/out" 2>&1
  rc=$?
  el=$(( $(now_ms) - t0 ))
}
tag=hung$$ # marks this test's workers, to look for leftovers

# 1. Both workers stop themselves.
run --standalone --nproc-per-node 2 --hung-timeout 1 --no-python sh -c "kill -STOP \$\$; echo $tag"
if [ $rc = 1 ] && [ $el -le 6000 ] && grep -q "workers hung: .*local rank 0 stopped, local rank 1 stopped" "$tmp/out" &&
   grep -q "^root .*workers hung" "$tmp/out" && ! pgrep -f "$tag" >/dev/null; then
  ok "stopped workers: rc 1 in $el ms"
else
  fail "stopped workers: rc $rc in $el ms; $(cat "$tmp/out")"
fi

# 2. A silent worker.
run --standalone --nproc-per-node 1 --hung-timeout 1 --no-python sleep 60
if [ $rc = 1 ] && [ $el -le 6000 ] && grep -q "workers hung: .*local rank 0 silent" "$tmp/out"; then
  ok "silent worker: rc 1 in $el ms"
else
  fail "silent worker: rc $rc in $el ms; $(cat "$tmp/out")"
fi

# 3. Not hung: rank 0 prints every 0.1 s for 3 s; rank 1 is silent meanwhile (not all are hung).
run --standalone --nproc-per-node 2 --hung-timeout 2 --no-python sh -c \
  'if [ $RANK = 0 ]; then for i in $(seq 30); do echo tick; sleep 0.1; done; else sleep 3; fi'
if [ $rc = 0 ] && ! grep -q "workers hung" "$tmp/out"; then
  ok "a printing worker keeps the job alive (rc 0 after $el ms)"
else
  fail "printing worker: rc $rc; $(cat "$tmp/out")"
fi

# 4. A restart follows, as for a failed worker.
run --standalone --nproc-per-node 1 --hung-timeout 1 --max-restarts 1 --no-python sh -c \
  'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then kill -STOP $$; fi; echo "attempt $TORCHELASTIC_RESTART_COUNT"'
if [ $rc = 0 ] && grep -q "worker group failed: restarting it (restart 1 of 1)" "$tmp/out" && grep -q '^\[0\]:attempt 1$' "$tmp/out"; then
  ok "hung then restarted: rc 0"
else
  fail "hung then restarted: rc $rc; $(cat "$tmp/out")"
fi

# 5. From the environment.
PET_HUNG_TIMEOUT=0.5 run --standalone --nproc-per-node 1 --no-python sleep 60
if [ $rc = 1 ] && grep -q "workers hung: no output or stopped for 0.5 s" "$tmp/out"; then
  ok "PET_HUNG_TIMEOUT=0.5: rc 1 in $el ms"
else
  fail "PET_HUNG_TIMEOUT: rc $rc; $(cat "$tmp/out")"
fi

# 6. Off by default: a silent worker that finishes after 2 s is left alone.
run --standalone --nproc-per-node 1 --no-python sleep 2
if [ $rc = 0 ]; then ok "off by default"; else fail "default: rc $rc; $(cat "$tmp/out")"; fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
