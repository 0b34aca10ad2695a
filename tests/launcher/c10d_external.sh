#!/usr/bin/env bash
# ddprun nodes (one machine, 127.0.0.1) against an external c10d endpoint, a standalone
# `ddp-rendezvous serve`, so that no ddprun hosts the store:
#   1. a restart: node 1's worker fails once; with --max-restarts 1 both nodes meet again in
#      round 1, the workers' keys of the failed attempt are cleared (a key the first attempt's
#      worker wrote is gone), and both nodes finish, exit 0, well within the join timeout;
#   2. liveness through the ring alone (no agent watches every node, and nobody hears a
#      connection close): of three nodes with heartbeat_timeout=2, the ddprun of node rank 2 is
#      SIGSTOPped (its connections stay open); nodes 0 and 1, its ring predecessors, report node
#      2 by rank and stop within 10 s.
# Usage: c10d_external.sh DDPRUN DDP_RENDEZVOUS. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$(readlink -f "$1")
rdzv=$(readlink -f "$2")
tmp=$(mktemp -d)
spid=
pids=()
stopped= # the SIGSTOPped ddprun of case 2 (timeout(1)'s child: killing timeout leaves it)
cleanup() {
  [ -n "$stopped" ] && kill -KILL "$stopped" 2>/dev/null
  # Every other process runs under timeout(1), which passes a SIGTERM on to its child.
  for p in "${pids[@]}" $spid; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

mkfifo "$tmp/serve.port"
timeout 120 "$rdzv" serve --port 0 >"$tmp/serve.port" 2>"$tmp/serve.log" &
spid=$!
sport=$(timeout 20 head -n1 "$tmp/serve.port")
[[ $sport =~ ^[0-9]+$ ]] || { echo "FAIL: the store did not start: $(cat "$tmp/serve.log")"; exit 1; }

# The worker: node 1's first attempt writes a worker key through the store and fails (node 0's
# runs until the restart stops it); every other attempt checks that the failed attempt's key is gone (clearing happened) and succeeds.
cat >"$tmp/worker.sh" <<'WORKER'
#!/bin/sh
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$GROUP_RANK" = 1 ]; then
    "$RDZV" set stale_worker_key 1 --host "$MASTER_ADDR" --port "$MASTER_PORT" || exit 3
    touch "$TMPD/stale_set"
    exit 1
  fi
  # Node 0's first worker runs until the restart stops it (a key nobody sets, bounded).
  exec "$RDZV" get never_set --host "$MASTER_ADDR" --port "$MASTER_PORT" --timeout 60
fi
stale=$("$RDZV" del stale_worker_key --host "$MASTER_ADDR" --port "$MASTER_PORT") || exit 5
if [ "$stale" != 0 ]; then
  echo "stale key still there in attempt $TORCHELASTIC_RESTART_COUNT"
  exit 4
fi
echo "attempt $TORCHELASTIC_RESTART_COUNT done"
WORKER
chmod +x "$tmp/worker.sh"

# 1. A restart.
start=$SECONDS
for i in 0 1; do
  RDZV=$rdzv TMPD=$tmp timeout -k 5 90 "$ddprun" --nnodes 2 --nproc-per-node 1 --max-restarts 1 \
    --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$sport" --rdzv-id ext \
    --rdzv-conf join_timeout=30 --no-python "$tmp/worker.sh" >"$tmp/n$i" 2>&1 &
  pids[$i]=$!
done
rcs=""
for i in 0 1; do wait "${pids[$i]}"; rcs+="$? "; done
took=$((SECONDS - start))
if [ "$rcs" = "0 0 " ] && [ -e "$tmp/stale_set" ] && grep -q "attempt 1 done" "$tmp/n0" && grep -q "attempt 1 done" "$tmp/n1"; then
  ok "external c10d store: node 1 failed once, both restarted and finished in $took s"
else
  fail "external c10d store, one restart: rcs=$rcs after $took s, stale key set: $([ -e "$tmp/stale_set" ] && echo yes || echo no); node 0: $(cat "$tmp/n0"); node 1: $(cat "$tmp/n1")"
fi

# 2. Liveness through the ring. Each worker says its node rank (GROUP_RANK) and runs until stopped.
start=$SECONDS
for i in 0 1 2; do
  timeout -k 5 90 "$ddprun" --nnodes 3 --nproc-per-node 1 --max-restarts 0 \
    --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$sport" --rdzv-id ring \
    --rdzv-conf heartbeat_timeout=2 --no-python \
    sh -c "echo \$GROUP_RANK >$tmp/rank.$i.tmp && mv $tmp/rank.$i.tmp $tmp/rank.$i; exec sleep 60" \
    >"$tmp/r$i" 2>&1 &
  pids[$i]=$!
done
victim=
for n in $(seq 600); do
  if [ -e "$tmp/rank.0" ] && [ -e "$tmp/rank.1" ] && [ -e "$tmp/rank.2" ]; then
    for i in 0 1 2; do [ "$(cat "$tmp/rank.$i")" = 2 ] && victim=$i; done
    break
  fi
  sleep 0.05
done
if [ -z "$victim" ]; then
  fail "ring: the workers did not start; $(cat "$tmp/r0" "$tmp/r1" "$tmp/r2")"
else
  stopped=$(pgrep -P "${pids[$victim]}") # timeout(1)'s child: the victim's ddprun
  kill -STOP $stopped
  t0=$SECONDS
  rcs=""
  nonzero=0
  for i in 0 1 2; do
    [ "$i" = "$victim" ] && continue
    timeout 30 tail -s 0.05 --pid="${pids[$i]}" -f /dev/null
    wait "${pids[$i]}"
    rc=$?
    rcs+="$rc "
    [ $rc != 0 ] && nonzero=$((nonzero + 1))
  done
  took=$((SECONDS - t0))
  named=0
  for i in 0 1 2; do
    [ "$i" != "$victim" ] && grep -Eq 'node 2( \([^)]*\))?: stopped sending heartbeats' "$tmp/r$i" && named=$((named + 1))
  done
  if [ $nonzero = 2 ] && [ $named = 2 ] && [ $took -le 10 ]; then
    ok "ring: node rank 2 stopped; both survivors named it and stopped in $took s (rcs $rcs)"
  else
    fail "ring: rcs=$rcs after $took s, $named survivors named node 2; $(cat "$tmp/r0" "$tmp/r1" "$tmp/r2")"
  fi
fi
[ $fails = 0 ]
