#!/usr/bin/env bash
# No descendant of a worker outlives ddprun, whatever it did to its process group: each worker
# starts two double-forked, setsid'd daemons (one ignores SIGTERM and SIGHUP and holds ddprun's
# output pipe, one has its own stdio) and a plain background child, and records their PIDs.
#   (a) the workers finish: ddprun exits 0 and every recorded process is gone;
#   (b) ddprun is SIGKILLed: every recorded process is gone;
#   (c) a worker fails: ddprun exits with its code and every recorded process is gone;
#   (d) a worker's guard (the worker's parent, a child subreaper) is SIGKILLed: the worker dies
#       with it; the daemons go to ddprun (a subreaper too) or, where the workers run in a PID
#       namespace, to its init, which kills them.
# "Gone" is checked within a bound (polling): a zombie counts as gone, since a process that was
# reparented to an init that does not reap may stay one. The processes are found through a marker
# in their environment. Usage: descendants.sh DDPRUN [OPTION...]: the options go to every ddprun
# (--no-pid-namespace: the guards and ddprun alone clean up, as where no namespace is permitted).
# Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$(readlink -f "$1")
opts=("${@:2}")
. "$(dirname "$0")/lib.sh"

# Each case's processes carry CASE_MARK=$mark.<case> in their environment (given to ddprun): the
# recorded pids are the workers' own, which a PID namespace of ddprun's does not share with us.
mark=ddprun-descendants-$$-$RANDOM
survivors() { # case: its live processes, with their command lines
  local p
  for p in $(marked "CASE_MARK=$mark.$1"); do echo -n "$p($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)) "; done
}
none_left() { [ -z "$(marked "CASE_MARK=$mark.$1")" ]; }
cleanup_hook() { for c in a b c d; do marked "CASE_MARK=$mark.$c" | xargs -r kill -KILL 2>/dev/null; done; }

# daemon.sh PIDFILE [own]: a grandchild in a session of its own that records its PID and sleeps;
# the first kind ignores SIGTERM and SIGHUP and keeps the worker's stdout and stderr.
cat >"$tmp/daemon.sh" <<'EOF'
if [ "${2:-}" = own ]; then
  setsid sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 300' sh "$1" </dev/null >/dev/null 2>&1 &
else
  setsid sh -c 'trap "" TERM HUP; echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 300' sh "$1" &
fi
EOF
# worker.sh CASE ACTION: starts the daemons and a background child, waits for their PID files,
# then: "exit" (finish), "sleep" (wait to be killed), or "fail-rank1" (rank 1 exits 3).
cat >"$tmp/worker.sh" <<'EOF'
case=$1 action=$2 dir=$3
sh "$dir/daemon.sh" "$dir/pid.$case.$RANK.a"
sh "$dir/daemon.sh" "$dir/pid.$case.$RANK.b" own
sleep 300 &
echo $! > "$dir/pid.$case.$RANK.c"
n=0
while [ ! -e "$dir/pid.$case.$RANK.a" ] || [ ! -e "$dir/pid.$case.$RANK.b" ]; do
  n=$((n + 1)); [ $n -gt 1000 ] && exit 9; sleep 0.01
done
touch "$dir/up.$case.$RANK"
echo "rank $RANK up"
case $action in
  exit) exit 0 ;;
  sleep) exec sleep 300 ;;
  fail-rank1)
    if [ "$RANK" = 1 ]; then
      while [ ! -e "$dir/up.$case.0" ]; do sleep 0.01; done
      exit 3
    fi
    exec sleep 300 ;;
esac
EOF

# (a) The workers finish while their daemons live on.
timeout 60 env CASE_MARK="$mark.a" "$ddprun" "${opts[@]}" --standalone --nproc-per-node 2 sh "$tmp/worker.sh" a exit "$tmp" >"$tmp/oa" 2>&1
rc=$?
if [ $rc = 0 ] && [ -e "$tmp/pid.a.1.b" ] && wait_for 5 none_left a; then
  ok "(a) ddprun exited normally: no daemon left"
else
  fail "(a) rc=$rc, left: $(survivors a); $(cat "$tmp/oa")"
fi

# (b) ddprun SIGKILLed while the workers and their daemons run.
env CASE_MARK="$mark.b" "$ddprun" "${opts[@]}" --standalone --nproc-per-node 2 sh "$tmp/worker.sh" b sleep "$tmp" >"$tmp/ob" 2>&1 &
dp=$!
if wait_for 30 test -e "$tmp/up.b.0" -a -e "$tmp/up.b.1"; then
  kill -KILL $dp
  wait $dp 2>/dev/null
  if wait_for 5 none_left b; then
    ok "(b) ddprun SIGKILLed: no daemon left"
  else
    fail "(b) left after SIGKILL of ddprun: $(survivors b)"
  fi
else
  fail "(b) workers did not start: $(cat "$tmp/ob")"
  kill -KILL $dp 2>/dev/null
fi

# (c) Rank 1 fails: rank 0 is stopped, and everything both started goes.
timeout 60 env CASE_MARK="$mark.c" "$ddprun" "${opts[@]}" --standalone --nproc-per-node 2 --shutdown-timeout 2 sh "$tmp/worker.sh" c fail-rank1 "$tmp" >"$tmp/oc" 2>&1
rc=$?
if [ $rc = 3 ] && [ -e "$tmp/pid.c.0.a" ] && wait_for 5 none_left c; then
  ok "(c) a worker failed: no daemon left"
else
  fail "(c) rc=$rc, left: $(survivors c); $(cat "$tmp/oc")"
fi

# (d) A guard SIGKILLed: its worker dies of SIGKILL (its parent-death signal), the job fails, and
#     what that worker started is gone once ddprun has exited.
env CASE_MARK="$mark.d" "$ddprun" "${opts[@]}" --standalone --nproc-per-node 2 sh "$tmp/worker.sh" d sleep "$tmp" >"$tmp/od" 2>&1 &
dp=$!
if wait_for 30 test -e "$tmp/up.d.0" -a -e "$tmp/up.d.1"; then
  kill -KILL "$(guards_of $dp | head -1)"
  timeout 30 tail -s 0.05 --pid=$dp -f /dev/null
  wait $dp; rc=$?
  if [ $rc = 137 ] && wait_for 5 none_left d; then
    ok "(d) a guard SIGKILLed: ddprun exited 137, no daemon left"
  else
    fail "(d) rc=$rc, left: $(survivors d); $(cat "$tmp/od")"
  fi
else
  fail "(d) workers did not start: $(cat "$tmp/od")"
  kill -KILL $dp 2>/dev/null
fi

echo "$((4 - fails)) passed, $fails failed"
[ $fails = 0 ]
