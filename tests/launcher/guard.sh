#!/usr/bin/env bash
# What a worker's guard is, and what a worker inherits from the way ddprun starts it, with and
# without the workers' PID namespace:
#   (a) the guard (ddp-guard, ddprun's child) maps none of ddprun's libraries (libuv, jansson,
#       Nettle, libcrypto, librendezvous, libcurl) and leads a session of its own;
#   (b) the worker is the guard's child and leads a session and process group of its own;
#   (c) the worker starts with no signal blocked and none ignored, though ddprun ignores SIGPIPE
#       and SIGXFSZ and was started with SIGHUP and SIGUSR2 ignored (as under nohup);
#   (d) the guard passes on the worker's end: its exit code, and its death by a signal (SIGSEGV:
#       ddprun reports "signal 11 (SEGV)" and exits 139, as torchrun does).
# The workers are found from outside through /proc (workers_of: lib.sh). Usage: guard.sh DDPRUN.
# Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$(readlink -f "$1")
. "$(dirname "$0")/lib.sh"

nworkers() { [ "$(workers_of "$1" sleep | wc -l)" -ge "$2" ]; }
stop() { kill -TERM "$1" 2>/dev/null; timeout 10 tail --pid="$1" -f /dev/null; wait "$1" 2>/dev/null; }
# Field 6 of /proc/PID/stat, the session (field 2, the name, has no spaces here).
session() { awk '{print $6}' "/proc/$1/stat"; }
pgroup() { awk '{print $5}' "/proc/$1/stat"; }
sigmask() { awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status"; }
libs='libuv|libjansson|libnettle|libcrypto|librendezvous|libcurl'
# what rc pattern ddprun-args...: ddprun ends with code rc and says pattern (an ERE).
ends() {
  local what=$1 want=$2 pattern=$3 rc
  shift 3
  timeout 30 "$ddprun" "$@" >"$tmp/o" 2>&1
  rc=$?
  if [ $rc = "$want" ] && grep -Eq "$pattern" "$tmp/o"; then
    ok "$what comes through its guard"
  else
    fail "$what: rc $rc, $(cat "$tmp/o")"
  fi
}

for opt in "" "--no-pid-namespace"; do
  name=${opt:-"PID namespace"}
  (trap '' HUP USR2; exec "$ddprun" --standalone --nproc-per-node 2 $opt --no-python sleep 30) \
    >"$tmp/o" 2>&1 &
  p=$!; pids+=("$p")
  if ! wait_for 10 nworkers "$p" 2; then
    fail "$name: workers did not start: $(cat "$tmp/o")"
    stop "$p"
    continue
  fi
  bad=""
  for g in $(guards_of "$p"); do
    maps=$(grep -Eo "[^/ ]*($libs)[^/ ]*" "/proc/$g/maps" | sort -u | tr '\n' ' ')
    [ -z "$maps" ] || bad+=" guard $g maps $maps;"
    [ "$(session "$g")" = "$g" ] || bad+=" guard $g is in session $(session "$g");"
    for w in $(pgrep -P "$g" -x sleep); do
      [ "$(session "$w")" = "$w" ] && [ "$(pgroup "$w")" = "$w" ] ||
        bad+=" worker $w: session $(session "$w"), group $(pgroup "$w");"
      for f in SigBlk SigIgn; do
        [ "$(sigmask "$w" $f)" = 0000000000000000 ] || bad+=" worker $w: $f $(sigmask "$w" $f);"
      done
    done
  done
  if [ -z "$bad" ]; then
    ok "$name: guards map no ddprun library; workers lead their sessions, nothing blocked or ignored"
  else
    fail "$name:$bad"
  fi
  stop "$p"

  ends "$name: a worker's exit code" 3 ' 0 +0 exit 3 ' \
    --nproc-per-node 2 $opt --no-python sh -c 'exit $((RANK == 0 ? 3 : 0))'
  ends "$name: a worker's death by SIGSEGV" 139 'failed: signal 11 \(SEGV\)' \
    --nproc-per-node 1 $opt --no-python sh -c 'kill -SEGV $$'
done
exit $((fails > 0))
