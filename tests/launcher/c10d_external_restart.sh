#!/usr/bin/env bash
# A restart with an external c10d endpoint: two ddprun nodes (one machine, 127.0.0.1) against a
# standalone `ddp-rendezvous serve`, so that no ddprun hosts the store. Node 1's worker fails
# once; with --max-restarts 1 both nodes meet again in round 1, the workers' keys of the failed
# attempt are cleared (a key the first attempt's worker wrote is gone), and both nodes finish,
# exit 0, well within the join timeout. Usage: c10d_external_restart.sh DDPRUN DDP_RENDEZVOUS.
# Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$(readlink -f "$1")
rdzv=$(readlink -f "$2")
tmp=$(mktemp -d)
spid=
pids=()
cleanup() {
  for p in "${pids[@]}" $spid; do kill -KILL "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
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
[ $fails = 0 ]
