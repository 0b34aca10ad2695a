#!/usr/bin/env bash
# End-to-end test of `ddp-rendezvous proxy`: a real `serve --port 0` with a token, a proxy in
# front of it on a free port, the client commands (set, get, add, wait, barrier, keys) through
# the proxy, the root's status showing the proxy as one multiplexed connection, the token holding
# through the proxy, usage errors, a clean exit 0 on SIGTERM, and exit 1 when the root dies.
#
# Usage: test_cli_proxy.sh DDP_RENDEZVOUS_BINARY
# Exit: 0 pass, 1 fail, 77 skip (python3 or coreutils' timeout missing).
#
# Synchronisation is by events, never by sleeping: ports are read from the first stdout line of
# serve and proxy (read -t), their exits are seen as EOF on that pipe, and a waiter is known to
# be blocked once the root's status counts it. Every client runs under timeout(1); a watchdog
# bounds the whole test.
set -euo pipefail

BIN=${1:?usage: test_cli_proxy.sh DDP_RENDEZVOUS_BINARY}

for tool in python3 timeout; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool not found"
        exit 77
    fi
done
[[ -x $BIN ]] || { echo "FAIL: $BIN is not an executable" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in ${pids[@]+"${pids[@]}"}; do
        kill -TERM "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    local f
    echo "FAIL: $*" >&2
    for f in root proxy proxy2; do
        if [[ -s $tmp/$f.err ]]; then
            echo "--- $f log:" >&2
            cat "$tmp/$f.err" >&2
        fi
    done
    exit 1
}
ok() { echo "ok: $*"; }

# The watchdog's sleep must not hold the test's stdout or stderr open.
(sleep 50 >/dev/null 2>&1 && echo "FAIL: watchdog: test ran for 50 s" >&2 &&
    kill -TERM $$) &
pids+=($!)

now_ms() { date +%s%3N; }

# expect STATUS CMD...: runs CMD, checks its exit status; stderr goes to $tmp/err.
expect() {
    local want=$1 rc=0
    shift
    "$@" 2>"$tmp/err" || rc=$?
    [[ $rc == "$want" ]] || fail "exit $rc, expected $want: $* (stderr: $(cat "$tmp/err"))"
}
stderr_has() {
    grep -qF -- "$1" "$tmp/err" || fail "stderr lacks '$1': $(cat "$tmp/err")"
}
json_field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

# start NAME FD CMD...: runs CMD in the background with stdout on a FIFO opened on descriptor FD
# (its first line is the port; EOF later means it exited) and stderr in $tmp/NAME.err. Sets
# $started_pid and $started_port.
start() {
    local name=$1 fd=$2
    shift 2
    mkfifo "$tmp/$name.out"
    "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    started_pid=$!
    pids+=("$started_pid")
    eval "exec $fd<\"\$tmp/\$name.out\""
    started_port=
    read -r -t 10 started_port <&"$fd" || fail "$name printed no port within 10 s"
    [[ $started_port =~ ^[0-9]+$ ]] && ((started_port > 0 && started_port <= 65535)) ||
        fail "$name: bad port line '$started_port'"
}

# waits_for_exit NAME FD PID: waits (bounded) for EOF on FD, then reaps PID into $exit_code.
waits_for_exit() {
    local name=$1 fd=$2 pid=$3 rest
    read -r -t 10 rest <&"$fd" && fail "$name printed more than its port: '$rest'"
    (($? > 128)) && fail "$name did not exit within 10 s"
    exit_code=0
    wait "$pid" || exit_code=$?
}

# ---------------------------------------------------------------------------------------------
# Usage errors: exit 2 naming the flag, before anything is started.
expect 2 "$BIN" proxy --port 0
stderr_has "proxy: --upstream HOST:PORT is required"
expect 2 "$BIN" proxy --upstream localhost
stderr_has "--upstream: expected HOST:PORT"
expect 2 "$BIN" proxy --upstream 127.0.0.1:70000
stderr_has "--upstream: expected HOST:PORT"
expect 2 "$BIN" proxy --upstream 127.0.0.1:1 --timeout 5
stderr_has "--timeout: does not apply to 'proxy'"
expect 2 "$BIN" get k --upstream 127.0.0.1:1
stderr_has "--upstream: does not apply to 'get'"
expect 0 "$BIN" proxy --help >"$tmp/help"
grep -qF -- "--upstream HOST:PORT" "$tmp/help" || fail "proxy --help lacks --upstream"
ok "proxy usage errors exit 2 and name the flag"

# ---------------------------------------------------------------------------------------------
# The root, with a token, and a proxy in front of it.
printf 'proxy-test-token-0123456789\n' >"$tmp/token"
start root 3 "$BIN" serve --port 0 --token-file "$tmp/token"
ROOT_PID=$started_pid ROOT=$started_port
start proxy 4 "$BIN" proxy --upstream "127.0.0.1:$ROOT" --port 0 --token-file "$tmp/token"
PROXY_PID=$started_pid PROXY=$started_port
grep -qF "listening on 127.0.0.1:$PROXY for the store at 127.0.0.1:$ROOT" "$tmp/proxy.err" ||
    fail "no 'listening on' line in the proxy's log"
ok "proxy --port 0 listens on $PROXY in front of the root on $ROOT"

# A proxy with the wrong token cannot start: the root rejects it.
printf 'a-wrong-token-for-this-job-000\n' >"$tmp/bad-token"
expect 1 timeout 10 "$BIN" proxy --upstream "127.0.0.1:$ROOT" --port 0 \
    --token-file "$tmp/bad-token"
stderr_has "proxy: cannot start in front of 127.0.0.1:$ROOT"
ok "a proxy with a wrong token exits 1"

rdzv() { timeout 10 "$BIN" --token-file "$tmp/token" --timeout 5 "$@"; }
via() { rdzv --port "$PROXY" "$@"; }
root() { rdzv --port "$ROOT" "$@"; }

# SET, GET, ADD through the proxy; what the proxy stored is at the root, and back.
expect 0 via set greeting hello
expect 0 root get greeting >"$tmp/out"
printf hello | cmp -s - "$tmp/out" || fail "root get greeting returned '$(cat "$tmp/out")'"
expect 0 root set reply world
expect 0 via get reply >"$tmp/out"
printf world | cmp -s - "$tmp/out" || fail "get reply via proxy returned '$(cat "$tmp/out")'"
expect 0 via add counter 5 >"$tmp/out"
expect 0 root add counter 2 >"$tmp/out"
[[ $(cat "$tmp/out") == 7 ]] || fail "add through both paths gave $(cat "$tmp/out"), not 7"
expect 0 via set /ddprun/secret s
expect 0 via keys >"$tmp/out"
grep -qx greeting "$tmp/out" && grep -qx /ddprun/secret "$tmp/out" ||
    fail "keys via proxy: $(cat "$tmp/out")"
ok "set, get, add and keys through the proxy reach the root's keys"

# The private key space holds through the proxy: without the token, a private key is refused.
expect 1 timeout 10 "$BIN" --port "$PROXY" --timeout 5 get /ddprun/secret
expect 0 timeout 10 "$BIN" --port "$PROXY" --timeout 5 set public p
ok "without the token, the proxy refuses a private key and serves a public one"

# WAIT through the proxy: two waiters on the same keys block at the root (its status counts a
# waiter), the root's status shows the proxy as one multiplexed connection, and a SET at the
# root releases both.
for i in 1 2; do
    timeout 10 "$BIN" --port "$PROXY" --token-file "$tmp/token" --timeout 8 wait late1 late2 \
        2>"$tmp/wait$i.err" &
    eval "waiter$i=\$!"
    pids+=($!)
done
deadline=$(($(now_ms) + 5000))
while :; do
    root status >"$tmp/status.json" 2>/dev/null || fail "status failed while waits were pending"
    (($(json_field waiters <"$tmp/status.json") >= 1)) && break
    (($(now_ms) < deadline)) || fail "the root never counted the waiters: $(cat "$tmp/status.json")"
    sleep 0.02 # poll interval, not synchronisation
done
mux=$(json_field multiplexed_connections <"$tmp/status.json")
conns=$(json_field connections <"$tmp/status.json")
((mux == 1)) || fail "root's multiplexed_connections is $mux, not 1: $(cat "$tmp/status.json")"
# The proxy's connection and this status client's, whatever the proxy's workers.
((conns == 2)) || fail "root's connections is $conns, not 2: $(cat "$tmp/status.json")"
kill -0 "$waiter1" 2>/dev/null && kill -0 "$waiter2" 2>/dev/null ||
    fail "a wait through the proxy returned before its keys existed"
expect 0 root set late1 x
expect 0 root set late2 y
for w in "$waiter1" "$waiter2"; do
    rc=0
    wait "$w" || rc=$?
    ((rc == 0)) || fail "wait through the proxy exited $rc: $(cat "$tmp"/wait*.err)"
done
ok "two waits through the proxy block and return; the root sees 1 multiplexed connection ($conns in all)"

# A barrier of three through the proxy and one directly at the root.
bpids=()
for i in 1 2 3; do
    via barrier meet 4 2>"$tmp/b$i.err" &
    bpids+=($!)
done
expect 0 root barrier meet 4
for p in "${bpids[@]}"; do
    rc=0
    wait "$p" || rc=$?
    ((rc == 0)) || fail "barrier through the proxy exited $rc: $(cat "$tmp"/b*.err)"
done
ok "a barrier of 3 workers through the proxy and 1 at the root passes"

# SIGTERM: the proxy closes, logs its counters and exits 0; the root loses its multiplexed
# connection and keeps serving.
kill -TERM "$PROXY_PID"
waits_for_exit proxy 4 "$PROXY_PID"
((exit_code == 0)) || fail "the proxy exited $exit_code on SIGTERM, not 0"
grep -qF "received SIGTERM, shutting down" "$tmp/proxy.err" || fail "no shutdown line in the log"
grep -qE "info: [0-9]+ worker connections, [0-9]+ worker requests, [0-9]+ sent upstream" \
    "$tmp/proxy.err" || fail "the proxy logged no counters at exit"
deadline=$(($(now_ms) + 5000))
while root status >"$tmp/status.json" &&
    (($(json_field multiplexed_connections <"$tmp/status.json") != 0)); do
    (($(now_ms) < deadline)) || fail "the root still counts the stopped proxy's connection"
    sleep 0.02 # poll interval, not synchronisation
done
ok "SIGTERM stops the proxy with exit 0 and its counters logged; the root drops its connection"

# The root dying takes its proxies with it: exit 1.
start proxy2 5 "$BIN" proxy --upstream "127.0.0.1:$ROOT" --port 0 --token-file "$tmp/token" \
    --quiet
PROXY2_PID=$started_pid
kill -TERM "$ROOT_PID"
waits_for_exit root 3 "$ROOT_PID"
((exit_code == 0)) || fail "the root exited $exit_code on SIGTERM"
waits_for_exit proxy2 5 "$PROXY2_PID"
((exit_code == 1)) || fail "the proxy exited $exit_code when its root died, not 1"
grep -qF "the root store is gone" "$tmp/proxy2.err" || fail "proxy2 did not say why it stopped"
ok "a proxy whose root dies exits 1"

echo "PASS"
