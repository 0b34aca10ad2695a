#!/usr/bin/env bash
# A c10d endpoint whose port is held by something that is not a store: a listener that accepts
# and never answers, and one that closes every connection at once. ddprun must fail within the
# client's handshake bound (5 s), not the 600 s join timeout, naming the endpoint and saying it
# is not a ddprun or PyTorch store. Usage: not_a_store.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip
# (no python3).
set -uo pipefail
ddprun=$1
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found"; exit 77; }
tmp=$(mktemp -d)
lpid=
cleanup() {
  [ -n "$lpid" ] && kill -KILL "$lpid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

for mode in silent close; do
  # The listener binds port 0 and prints it; "silent" accepts and holds every connection,
  # "close" closes each at once. It runs for at most 60 s (its own alarm, so that killing it
  # leaves no child holding the test's output open).
  exec {lfd}< <(exec python3 -c '
import signal, socket, sys
signal.alarm(60)
mode = sys.argv[1]
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
held = []
while True:
    c, _ = s.accept()
    if mode == "close":
        c.close()
    else:
        held.append(c)
' "$mode")
  lpid=$!
  port=
  read -r -t 10 port <&"$lfd" || { fail "$mode: the listener printed no port"; continue; }
  start=$SECONDS
  timeout 60 "$ddprun" --nnodes 1 --nproc-per-node 1 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --no-python true >"$tmp/out" 2>&1
  rc=$?
  took=$((SECONDS - start))
  if [ $rc = 0 ] || [ $rc = 124 ] || [ $took -ge 15 ]; then
    fail "$mode: ddprun exited $rc after $took s (want a failure within 15 s): $(cat "$tmp/out")"
  elif ! grep -q "127.0.0.1:$port" "$tmp/out" ||
       ! grep -q "not a ddprun or PyTorch store" "$tmp/out"; then
    fail "$mode: the message does not name the endpoint and say it is no store: $(cat "$tmp/out")"
  else
    ok "$mode listener: ddprun exited $rc after $took s: $(grep -m1 'not a ddprun' "$tmp/out")"
  fi
  kill -KILL "$lpid" 2>/dev/null
  wait "$lpid" 2>/dev/null
  exec {lfd}<&-
  lpid=
done
[ $fails = 0 ] && echo PASS
exit $((fails > 0))
