#!/usr/bin/env bash
# ddprun's embedded store under attack and over IPv6:
#  1. a two-node static job over ::1 (--master-addr ::1), and a two-node c10d job whose
#     endpoint is [::1]:PORT; the workers see MASTER_ADDR=::1;
#  2. a connection flood on the embedded store of a ddprun whose descriptor limit is 256: the
#     store refuses what its derived cap does not allow (and says so), so a worker failure
#     still restarts the workers (--max-restarts 1) instead of failing with "too many open
#     files".
# Usage: test_ddprun_store.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip (no python3).
set -uo pipefail
ddprun=$(readlink -f "$1")
command -v python3 >/dev/null || { echo "skip: no python3"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# A port free right now on ADDR (bound to port 0 and released; multi-node jobs need a fixed one).
free_port() { # addr family
  python3 -c "import socket,sys; s=socket.socket(socket.$2); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])" "$1"
}

# 1. IPv6.
if ! python3 -c "import socket; socket.socket(socket.AF_INET6).bind(('::1', 0))" 2>/dev/null; then
  echo "skip: no IPv6 loopback here (the IPv6 cases)"
else
  port=$(free_port ::1 AF_INET6)
  for r in 0 1; do
    timeout -k 5 30 "$ddprun" --nnodes 2 --node-rank $r --master-addr ::1 --master-port "$port" \
      --nproc-per-node 1 sh -c 'echo "rank=$RANK world=$WORLD_SIZE master=$MASTER_ADDR"' >"$tmp/s$r" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do wait "$p"; rcs+="$? "; done
  pids=()
  if [ "$rcs" = "0 0 " ] && grep -q 'rank=0 world=2 master=::1' "$tmp/s0" &&
     grep -q 'rank=1 world=2 master=::1' "$tmp/s1"; then
    ok "static two-node job over ::1"
  else
    fail "static over ::1: rcs=$rcs; $(cat "$tmp/s0" "$tmp/s1")"
  fi

  port=$(free_port ::1 AF_INET6)
  for r in 0 1; do
    timeout -k 5 30 "$ddprun" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "[::1]:$port" --rdzv-id v6 \
      --nproc-per-node 1 sh -c 'echo "rank=$RANK world=$WORLD_SIZE"' >"$tmp/d$r" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do wait "$p"; rcs+="$? "; done
  pids=()
  n=$(cat "$tmp/d0" "$tmp/d1" | grep -c 'world=2')
  if [ "$rcs" = "0 0 " ] && [ "$n" = 2 ]; then
    ok "c10d two-node job on endpoint [::1]:PORT"
  else
    fail "c10d over [::1]: rcs=$rcs; $(cat "$tmp/d0" "$tmp/d1")"
  fi
fi

# 2. A connection flood while the workers run; rank 0 then fails once.
port=$(free_port 127.0.0.1 AF_INET)
cat >"$tmp/flood.py" <<'EOF'
# Opens N connections to the store and keeps them; each opens the modern protocol and sends a
# PING, and is then either answered (taken into service) or closed (refused): either way the
# server has dealt with it. Then it writes FLAG and holds the connections until stdin closes.
import socket, struct, sys
port, n, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
socks, served, refused = [], 0, 0
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(struct.pack("=BI", 0, 0x3C85F7CE) + struct.pack("=BI", 13, i))
    socks.append(s)
for s in socks:
    try:
        got = s.recv(4)
        if len(got) == 4:
            served += 1
        else:
            refused += 1
    except (ConnectionResetError, socket.timeout):
        refused += 1
print(f"flood: {n} connections, {served} served, {refused} refused", flush=True)
open(flag, "w").close()
sys.stdin.read()
EOF
worker='if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  [ "$RANK" = 0 ] || exec sleep 60
  while [ ! -e '"$tmp"'/flooded ]; do sleep 0.05; done
  exit 1
fi
echo "attempt 2 rank $RANK"'
( ulimit -n 256; exec timeout -k 5 60 "$ddprun" --nnodes 1 --master-addr 127.0.0.1 --master-port "$port" \
    --nproc-per-node 2 --max-restarts 1 sh -c "$worker" ) >"$tmp/f.out" 2>&1 &
dpid=$!
pids+=($dpid)
# The flooder starts once the store listens (bounded): connecting is retried until then.
for _ in $(seq 200); do
  python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=1)" "$port" 2>/dev/null && break
  sleep 0.05
done
mkfifo "$tmp/hold"
python3 "$tmp/flood.py" "$port" 400 "$tmp/flooded" <"$tmp/hold" >"$tmp/flood.out" 2>&1 &
fpid=$!
pids+=($fpid)
exec 7>"$tmp/hold"
wait "$dpid"
rc=$?
exec 7>&-
wait "$fpid"
cat "$tmp/flood.out"
if [ $rc = 0 ] && grep -q 'attempt 2 rank 0' "$tmp/f.out" && grep -q 'attempt 2 rank 1' "$tmp/f.out" &&
   grep -q 'refused' "$tmp/flood.out" && grep -q 'connection limit reached' "$tmp/f.out" &&
   ! grep -qi 'too many open files' "$tmp/f.out"; then
  ok "connection flood under ulimit -n 256: refusals logged, the restart spawned both workers"
else
  fail "flood: rc=$rc; $(cat "$tmp/f.out")"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
