#!/usr/bin/env bash
# No descendant of a worker survives ddprun and every one of its helper processes (the guards,
# and the PID namespace's init where there is one) SIGKILLed together. Each of 2 workers starts
# a double-forked, setsid'd daemon that ignores SIGTERM and SIGHUP. Then, in turn:
#   (a) `kill -9 $DDPRUN $(pgrep -P $DDPRUN)`: ddprun and its children, in one kill(1);
#   (b) every process of the job running ddprun's binary (what `pkill -9 -f ddprun` did while
#       the guards were called ddprun), found through /proc/PID/exe, in one kill(1);
#   (c) the children first, then ddprun;
#   (d) ddprun first, then its children (the ones that were its children before).
# First, what the job looks like there: ddprun's children are its 2 guards and the init, which
# `pgrep -f ddprun` does not find; each worker is in a PID namespace other than ours, where
# /proc/$$ is its own; /dev/shm is the job's: shared by its ranks, unseen from here.
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

mark=contain-test-$$-$RANDOM
none_marked() { [ -z "$(marked "DDPRUN_CONTAIN_MARK=$mark.$1")" ]; }
cleanup_hook() { for ((i = 0; i < tries; i++)); do marked "DDPRUN_CONTAIN_MARK=$mark.$i" | xargs -r kill -KILL 2>/dev/null; done; }

# view.sh DIR MARK: writes "PIDNS OWN SHARED" to DIR/view.RANK, then sleeps.
cat >"$tmp/view.sh" <<'EOF'
dir=$1 mark=$2
own=no
[ "$(cut -d' ' -f1 /proc/$$/stat)" = $$ ] && grep -qa view.sh /proc/$$/cmdline && own=yes
touch "/dev/shm/$mark.$RANK"
n=0
until [ -e "/dev/shm/$mark.0" ] && [ -e "/dev/shm/$mark.1" ]; do
  n=$((n + 1)); [ $n -gt 1000 ] && break; sleep 0.01
done
shared=no
[ -e "/dev/shm/$mark.0" ] && [ -e "/dev/shm/$mark.1" ] && shared=yes
echo "$(readlink /proc/self/ns/pid) $own $shared" >"$dir/view.tmp.$RANK"
mv "$dir/view.tmp.$RANK" "$dir/view.$RANK"
exec sleep 300
EOF
"$ddprun" --standalone --nproc-per-node 2 sh "$tmp/view.sh" "$tmp" "$mark" >"$tmp/out.view" 2>&1 &
dp=$!
pids+=("$dp")
if wait_for 30 test -e "$tmp/view.0" -a -e "$tmp/view.1"; then
  names=$(ps -o comm= --ppid "$dp" | sort | tr '\n' ' ')
  found=$(pgrep -f ddprun | grep -xF "$(pgrep -P "$dp")")
  ours=$(readlink /proc/self/ns/pid)
  read -r ns0 own0 shared0 <"$tmp/view.0"
  read -r ns1 own1 shared1 <"$tmp/view.1"
  seen=$(ls /dev/shm | grep -cF "$mark")
  if [ "$names" = "ddp-guard ddp-guard ddp-init " ] && [ -z "$found" ] && [ "$ns0" = "$ns1" ] &&
     [ "$ns0" != "$ours" ] && [ "$own0 $own1 $shared0 $shared1" = "yes yes yes yes" ] &&
     [ "$seen" = 0 ]; then
    ok "the job: ddprun's children ddp-guard x2 and ddp-init, none found by pgrep -f ddprun; the workers in a PID namespace ($ns0, ours $ours) with its /proc and a /dev/shm of the job's"
  else
    fail "the job: children '$names' (pgrep -f ddprun finds '$found'); workers' PID namespaces $ns0 $ns1 (ours $ours), /proc/\$\$ their own: $own0 $own1, /dev/shm shared: $shared0 $shared1, seen here: $seen"
  fi
else
  fail "the job's workers did not start: $(cat "$tmp/out.view")"
fi
rm -f /dev/shm/"$mark".*
kill -TERM "$dp"
wait_for 10 test ! -e /proc/"$dp"/stat || kill -KILL "$dp"
wait "$dp" 2>/dev/null

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

# The processes of try $1 running ddprun's binary (of this job only: other tests may run it).
ddprun_procs() { # try
  local p
  for p in $(marked "DDPRUN_CONTAIN_MARK=$mark.$1"); do
    [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$ddprun" ] && echo "$p"
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
  # (Processes the kernel killed first are gone by the time kill(1) gets to them: ESRCH.)
  case $way in
    a) kill -KILL "$dp" $kids ;;
    b) kill -KILL $(ddprun_procs "$i") ;;
    c) kill -KILL $kids; kill -KILL "$dp" ;;
    d) kill -KILL "$dp"; kill -KILL $kids ;;
  esac 2>/dev/null
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
echo "$((2 - fails)) passed, $fails failed"
[ $fails = 0 ]
