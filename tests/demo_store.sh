#!/usr/bin/env bash
# The main job until the launcher lands: start the store daemon on a free port, drive it with
# the CLI the way a scheduler's script would (set, get, add, a 3-party barrier, status), and
# stop it with SIGTERM. Usage: tests/demo_store.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
bin="$build/rendezvous/ddp-rendezvous"

fifo=$(mktemp -u); mkfifo "$fifo"
"$bin" serve --port 0 >"$fifo" &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$fifo"' EXIT
exec 3<"$fifo"
read -r -t 10 port <&3
echo "store listening on 127.0.0.1:$port (pid $server)"

cli() { "$bin" "$1" --port "$port" "${@:2}"; }
cli set greeting "hello from the store"
echo "get greeting -> $(cli get greeting)"
echo "add counter 5 -> $(cli add counter 5)"
pids=()
for i in 1 2 3; do cli barrier demo 3 --timeout 10 & pids+=($!); done
for p in "${pids[@]}"; do wait "$p"; done
echo "3 processes passed barrier 'demo'"
cli status
kill -TERM $server
wait $server
echo "store stopped cleanly"
