#!/usr/bin/env bash
# No descendant of a worker survives ddprun and every one of its helper processes (the guards,
# and the PID namespace's init where there is one) SIGKILLed together. Each of 2 workers starts
# a double-forked, setsid'd daemon that ignores SIGTERM and SIGHUP. Then, in turn:
#   (a) `kill -9 $DDPRUN $(pgrep -P $DDPRUN)`: ddprun and its children, in one kill(1);
#   (b) every process running ddprun's binary (what `pkill -9 -f ddprun` did while the guards
#       were called ddprun), found through /proc/PID/exe, in one kill(1);
#   (c) the children first, then ddprun;
#   (d) ddprun first, then its children (the ones that were its children before).
# Every process of the job carries a marker in its environment (given to ddprun); after each
# try, /proc is searched for it until none is left or 5 s have passed: what is left then
# survived (and is killed). The test passes when no try left one.
# Usage: containment.sh DDPRUN [TRIES] (default 20). Exit 0 pass, 1 fail, 77 when this host
# allows no PID namespace (not root, or a seccomp filter): ddprun(1) says what holds there.
set -uo pipefail
ddprun=$(readlink -f "$1")
tries=${2:-20}
. "$(dirname "$0")/lib.sh"

if ! timeout 10 unshare --pid --fork --mount-proc true 2>/dev/null; then
  echo "SKIP: no PID namespace can be created here"
  exit 77
fi

mark=ddprun-containment-$$-$RANDOM
none_marked() { [ -z "$(marked "DDPRUN_CONTAIN_MARK=$mark.$1")" ]; }
cleanup_hook() { for ((i = 0; i < tries; i++)); do marked "DDPRUN_CONTAIN_MARK=$mark.$i" | xargs -r kill -KILL 2>/dev/null; done; }

# worker.sh DIR TRY: starts the daemon, waits for its pid file, says it is up, and sleeps.
cat >"$tmp/worker.sh" <<'EOF'
dir=$1 try=$2
setsid sh -c 'trap "" TERM HUP; sh -c "echo \$\$ > $1.tmp && mv $1.tmp $1; exec sleep 300" &' \
  sh "$dir/daemon.$try.$RANK" </dev/null >/dev/null 2>&1 &
n=0
while [ ! -e "$dir/daemon.$try.$RANK" ]; do
  n=$((n + 1)); [ $n -gt 1000 ] && exit 9; sleep 0.01
done
touch "$dir/up.$try.$RANK"
exec sleep 300
EOF

# The pids of every process running ddprun's binary.
ddprun_procs() {
  local e p
  for e in /proc/[0-9]*/exe; do
    [ "$(readlink "$e" 2>/dev/null)" = "$ddprun" ] || continue
    p=${e#/proc/}; echo "${p%/exe}"
  done
}

left=0 ways=(a b c d)
for ((i = 0; i < tries; i++)); do
  way=${ways[i % 4]}
  env DDPRUN_CONTAIN_MARK="$mark.$i" "$ddprun" --standalone --nproc-per-node 2 \
    sh "$tmp/worker.sh" "$tmp" "$i" >"$tmp/out.$i" 2>&1 &
  dp=$!
  pids+=("$dp")
  if ! wait_for 30 test -e "$tmp/up.$i.0" -a -e "$tmp/up.$i.1"; then
    fail "try $i: the workers did not start: $(cat "$tmp/out.$i")"
    kill -KILL "$dp"; marked "DDPRUN_CONTAIN_MARK=$mark.$i" | xargs -r kill -KILL 2>/dev/null
    continue
  fi
  kids=$(pgrep -P "$dp" | tr '\n' ' ')
  case $way in
    a) kill -KILL "$dp" $kids ;;
    b) kill -KILL $(ddprun_procs) ;;
    c) kill -KILL $kids; kill -KILL "$dp" ;;
    d) kill -KILL "$dp"; kill -KILL $kids 2>/dev/null ;;
  esac
  wait "$dp" 2>/dev/null
  if ! wait_for 5 none_marked "$i"; then
    s=$(marked "DDPRUN_CONTAIN_MARK=$mark.$i")
    echo "try $i ($way): survivors: $(for p in $s; do echo -n "$p($(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)) "; done)"
    left=$((left + 1))
    kill -KILL $s 2>/dev/null
  fi
done
if [ $left = 0 ]; then
  ok "ddprun and its helpers SIGKILLed together: no survivor in $tries tries"
else
  fail "ddprun and its helpers SIGKILLed together: survivors in $left of $tries tries"
fi
echo "$((1 - fails)) passed, $fails failed"
[ $fails = 0 ]
