#!/usr/bin/env bash
# The teardown of a failed job is announced and summarised:
#   1. `ddprun --nproc-per-node 2 /bin/false`: the failure summary lists both ranks, the root
#      cause first;
#   2. a rank fails while another ignores SIGTERM: timestamped lines name the rank and pid that
#      failed, those sent SIGTERM and, after --shutdown-timeout, those sent SIGKILL; the summary
#      lists the killed rank marked "teardown"; every line of ddprun's own carries a timestamp;
#   3. a failure followed by a successful restart never says "job failed": the restart is
#      announced as such ("worker group failed: restarting it (restart 1 of 1)"), and the end
#      says the job succeeded after it.
# Rank 1 of case 2 tells rank 0 it ignores SIGTERM through a FIFO (no sleep as synchronisation).
# Usage: teardown.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
tmp=$(mktemp -d)
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
TS='\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}\]'
# A summary row: marker, time, node rank, host, rank, local rank, exit.
row() { # marker rank exit
  echo "^$1 +[0-9-]+ [0-9:.]+ +[0-9-]+ +[^ ]+ +$2 +$2 +$3 "
}

# 1. Both ranks fail.
timeout 20 "$ddprun" --nproc-per-node 2 /bin/false >"$tmp/o1" 2>&1
rc=$?
# The other rank failed on its own, or (when ddprun's SIGTERM came first) of that SIGTERM.
rows=$(grep -Ec "$(row '(root|teardown|)' '[01]' '(exit 1|signal 15 \(TERM\))')" "$tmp/o1")
if [ $rc = 1 ] && [ "$rows" = 2 ] && grep -Eq "$(row root '[01]' 'exit 1')" "$tmp/o1" &&
   grep -Eq "$(row '.*' 0 '.*')" "$tmp/o1" && grep -Eq "$(row '.*' 1 '.*')" "$tmp/o1"; then
  ok "/bin/false on two ranks: both listed"
else
  fail "/bin/false on two ranks: rc $rc, $rows rows; $(cat "$tmp/o1")"
fi

# 2. Rank 0 fails once rank 1 ignores SIGTERM; rank 1 is SIGKILLed after 1 s.
mkfifo "$tmp/ready"
timeout 30 "$ddprun" --standalone --nproc-per-node 2 --shutdown-timeout 1 --no-python sh -c "
  if [ \$RANK = 1 ]; then trap '' TERM; echo >$tmp/ready; exec sleep 30; fi
  read x <$tmp/ready; exit 3" >"$tmp/o2" 2>&1
rc=$?
pid1=$(sed -nE 's/.*sending SIGTERM to rank 1 \(pid ([0-9]+)\).*/\1/p' "$tmp/o2")
if [ $rc = 3 ] && [ -n "$pid1" ] &&
   grep -Eq "^$TS ddprun: rank 0 \(local rank 0, pid [0-9]+\) failed: exit 3$" "$tmp/o2" &&
   grep -Eq "^$TS ddprun: sending SIGTERM to rank 1 \(pid $pid1\); SIGKILL to any still running in 1 s$" "$tmp/o2" &&
   grep -Eq "^$TS ddprun: sending SIGKILL to rank 1 \(pid $pid1\): still running 1 s after SIGTERM$" "$tmp/o2" &&
   grep -Eq "$(row root 0 'exit 3')" "$tmp/o2" && grep -Eq "$(row teardown 1 'signal 9 \(KILL\)') +$pid1 " "$tmp/o2" &&
   ! grep -v -E "^($TS ddprun: |=+$| +time +node|root |teardown |\(teardown: )" "$tmp/o2" | grep -q .; then
  ok "teardown announced with timestamps, the killed rank marked"
else
  fail "teardown: rc $rc, pid '$pid1'; $(cat "$tmp/o2")"
fi

# 3. A restart that succeeds.
timeout 30 "$ddprun" --standalone --nproc-per-node 2 --max-restarts 1 --no-python sh -c \
  '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ] && exit 4; exit 0' >"$tmp/o3" 2>&1
rc=$?
if [ $rc = 0 ] && ! grep -q "job failed" "$tmp/o3" &&
   grep -Eq "^$TS ddprun: worker group failed: restarting it \(restart 1 of 1\)$" "$tmp/o3" &&
   grep -Eq "$(row root 1 'exit 4')" "$tmp/o3" &&
   grep -Eq "^$TS ddprun: job succeeded after 1 restart$" "$tmp/o3"; then
  ok "restart: announced as a restart, then the result"
else
  fail "restart wording: rc $rc; $(cat "$tmp/o3")"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
