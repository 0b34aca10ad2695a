#!/usr/bin/env bash
# End-to-end test of the ddp-rendezvous program: a real `serve --port 0` in the background,
# every client command and exit status against it, the option table against the man page,
# and a clean shutdown on SIGTERM and SIGINT.
#
# Usage: test_cli.sh DDP_RENDEZVOUS_BINARY MAN_PAGE
# Exit: 0 pass, 1 fail, 77 skip (python3 or coreutils' timeout missing).
#
# Synchronisation is by events, never by sleeping: the port is read from the server's first
# stdout line (read -t), the server's exit is seen as EOF on that pipe, and a waiter is known to
# be blocked once the server's status counts it. Every client runs under timeout(1), so a hang
# fails the test instead of stalling it; the whole test takes a few seconds.
set -euo pipefail

BIN=${1:?usage: test_cli.sh DDP_RENDEZVOUS_BINARY MAN_PAGE}
MAN=${2:?usage: test_cli.sh DDP_RENDEZVOUS_BINARY MAN_PAGE}

for tool in python3 timeout; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool not found"
        exit 77
    fi
done
[[ -x $BIN ]] || { echo "FAIL: $BIN is not an executable" >&2; exit 1; }
[[ -r $MAN ]] || { echo "FAIL: cannot read $MAN" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
    local p
    # TERM, not KILL: timeout(1) passes it on to the command it runs, and serve exits on it.
    for p in ${pids[@]+"${pids[@]}"}; do
        kill -TERM "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() {
    echo "FAIL: $*" >&2
    if [[ -s $tmp/srv.err ]]; then
        echo "--- server log:" >&2
        cat "$tmp/srv.err" >&2
    fi
    exit 1
}
ok() { echo "ok: $*"; }

# A watchdog, in case something escapes the per-command timeouts. Its sleep must not hold the
# test's stdout or stderr open, or a harness reading them would wait for it after the test ends.
(sleep 50 >/dev/null 2>&1 && echo "FAIL: watchdog: test ran for 50 s" >&2 &&
    kill -TERM $$) &
pids+=($!)

now_ms() { date +%s%3N; }

# Runs a command and checks its exit status: expect STATUS CMD...; stderr goes to $tmp/err.
expect() {
    local want=$1 rc=0
    shift
    "$@" 2>"$tmp/err" || rc=$?
    [[ $rc == "$want" ]] || fail "exit $rc, expected $want: $* (stderr: $(cat "$tmp/err"))"
}
# Checks that the last expect's stderr contains a fixed string.
stderr_has() {
    grep -qF -- "$1" "$tmp/err" || fail "stderr lacks '$1': $(cat "$tmp/err")"
}

# The program's version and help need no server.
expect 0 "$BIN" --version >"$tmp/out"
grep -qE '^ddp-rendezvous [0-9]+\.[0-9]+' "$tmp/out" || fail "--version printed: $(cat "$tmp/out")"
expect 0 "$BIN" --help >"$tmp/help"
grep -q '^Usage: ddp-rendezvous' "$tmp/help" || fail "--help lacks a usage line"
ok "--version, --help"

# ---------------------------------------------------------------------------------------------
# The option table against the man page, both ways. Documented options are the ones the man page
# lists as .TP items (.B/.BI/.BR lines right after .TP); examples may show other tools' flags.
grep -oE -- '--[a-z][a-z0-9-]*' "$tmp/help" | sort -u >"$tmp/help-opts"
awk 'prev == ".TP" && /^\.B[IR]? / && /\\-\\-/ { print } { prev = $1 }' "$MAN" |
    sed 's/\\-/-/g' | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u >"$tmp/man-opts"
[[ $(wc -l <"$tmp/help-opts") -ge 15 ]] || fail "--help shows too few options"
missing=$(comm -23 "$tmp/help-opts" "$tmp/man-opts" | tr '\n' ' ')
[[ -z $missing ]] || fail "options in --help but not documented in $MAN: $missing"
extra=$(comm -13 "$tmp/help-opts" "$tmp/man-opts" | tr '\n' ' ')
[[ -z $extra ]] || fail "options documented in $MAN but not in --help: $extra"
for section in NAME SYNOPSIS DESCRIPTION OPTIONS 'EXIT STATUS' ENVIRONMENT EXAMPLES 'SEE ALSO'; do
    grep -qxE "\.SH \"?$section\"?" "$MAN" || fail "$MAN lacks section $section"
done
if command -v groff >/dev/null 2>&1; then
    warnings=$(groff -man -Tutf8 -ww -z "$MAN" 2>&1) || fail "groff failed on $MAN"
    [[ -z $warnings ]] || fail "groff warns about $MAN: $warnings"
fi
expect 0 "$BIN" get --help >"$tmp/out"
grep -qF -- '--host' "$tmp/out" || fail "get --help lacks --host"
! grep -qF -- '--bind' "$tmp/out" || fail "get --help shows --bind, which is serve's"
ok "$(wc -l <"$tmp/help-opts") options in --help all documented in the man page, and no others"

# ---------------------------------------------------------------------------------------------
# Usage errors: exit 2 (as ddprun's) with the culprit named, before any connection is tried.
expect 2 "$BIN" keys --bogus
stderr_has "ddp-rendezvous: unknown option '--bogus'"
expect 2 "$BIN" keys --bogus=3
stderr_has "unknown option '--bogus'"
expect 2 "$BIN" keys --port abc
stderr_has "ddp-rendezvous: --port: expected an integer 0..65535, got 'abc'"
expect 2 "$BIN" keys --port=70000
stderr_has "--port"
expect 2 "$BIN" keys --timeout -1
stderr_has "--timeout"
expect 2 "$BIN" serve --max-key-bytes 12Q
stderr_has "--max-key-bytes"
expect 2 "$BIN" serve --max-value-bytes 0
stderr_has "--max-value-bytes"
expect 2 "$BIN" get k --bind 0.0.0.0
stderr_has "--bind"
expect 2 "$BIN" serve --listen-fd 3 --port 1
stderr_has "--listen-fd"
expect 2 "$BIN" keys --port
stderr_has "--port: missing argument"
expect 2 "$BIN" keys --quiet
expect 2 "$BIN" get
expect 2 "$BIN" set onlykey
expect 2 "$BIN" add k notanumber
stderr_has "DELTA"
expect 2 "$BIN" barrier b 0
stderr_has "WORLD_SIZE"
expect 2 "$BIN" frobnicate
stderr_has "frobnicate"
expect 2 "$BIN"
expect 2 "$BIN" -x
stderr_has "'-x'"
expect 2 "$BIN" keys --connect-timeout -1
stderr_has "--connect-timeout"
ok "usage errors exit 2 and name the flag"

# The server's limits have the library's ranges: a value out of one is a usage error naming the
# flag and the range, never the server's "cannot listen on 127.0.0.1:0: Invalid argument".
# (serve runs under timeout(1) in case a value is taken and it starts serving.)
range_error() { # FLAG VALUE RANGE
    expect 2 timeout 5 "$BIN" serve --port 0 "$1" "$2"
    stderr_has "ddp-rendezvous: $1: expected "
    stderr_has "$3, got '$2'"
    ! grep -q "cannot listen" "$tmp/err" || fail "$1 $2: $(cat "$tmp/err")"
}
range_error --max-key-bytes 17M "from 1 to 16777216"
range_error --max-key-bytes 0 "from 1 to 16777216"
range_error --max-request-bytes 1 "from 16 to 1073741824"
range_error --max-request-bytes 2G "from 16 to 1073741824"
range_error --keepalive 40000 "0..32767"
range_error --idle-timeout 1e18 "0..2147483"
expect 2 "$BIN" keys --timeout 1e18
stderr_has "--timeout: expected a number of seconds greater than 0 and at most 2147483, got '1e18'"
allow=()
for i in $(seq 0 4096); do allow+=(--allow "10.0.$((i / 256)).$((i % 256))"); done
expect 2 timeout 5 "$BIN" serve --port 0 "${allow[@]}"
stderr_has "ddp-rendezvous: --allow: at most 4096 networks"
grep -q "(8K; 1 to 16M)" "$tmp/help" && grep -q "(64M; 16 to 1G)" "$tmp/help" &&
    grep -q "(60; 0 to 32767)" "$tmp/help" || fail "--help lacks the ranges: $(cat "$tmp/help")"
ok "out-of-range limits exit 2 naming the flag and its range (--help shows them)"

# ---------------------------------------------------------------------------------------------
# The server. Its stdout is a FIFO held open on fd 3: the first line is the port, and EOF later
# means the server has exited.
mkfifo "$tmp/srv.out"
"$BIN" serve --port 0 --max-value-bytes 4M >"$tmp/srv.out" 2>"$tmp/srv.err" &
SRV=$!
pids+=("$SRV")
exec 3<"$tmp/srv.out"
PORT=
read -r -t 5 PORT <&3 || fail "the server printed no port within 5 s"
if ! [[ $PORT =~ ^[0-9]+$ ]] || ((PORT == 0 || PORT > 65535)); then
    fail "bad port line '$PORT'"
fi
grep -qF "ddp-rendezvous: info: listening on 127.0.0.1:$PORT" "$tmp/srv.err" ||
    fail "no 'listening on 127.0.0.1:$PORT' in the server log"
ok "serve --port 0 listens on $PORT"

# Every client gets the server's port and a bounded run time; options before the command.
rdzv() { timeout 10 "$BIN" --port "$PORT" --timeout 5 "$@"; }

# A second server on the same port cannot bind: operation failed.
expect 1 timeout 5 "$BIN" serve --port "$PORT" --quiet >/dev/null
stderr_has "$PORT"
ok "serve on a busy port exits 1"

# set/get round trips: text, the empty value, a value that starts with '-', binary on stdin.
expect 0 rdzv set greeting hello
expect 0 rdzv get greeting >"$tmp/out"
printf hello | cmp -s - "$tmp/out" || fail "get greeting returned '$(cat "$tmp/out")'"
expect 0 rdzv set empty ''
expect 0 rdzv get empty >"$tmp/out"
[[ ! -s $tmp/out ]] || fail "get empty returned bytes"
expect 0 rdzv set dash -- -x
expect 0 rdzv get dash >"$tmp/out"
printf -- -x | cmp -s - "$tmp/out" || fail "get dash returned '$(cat "$tmp/out")'"
printf 'a\0b\n\377\000end\n\n' >"$tmp/bin.in"
expect 0 rdzv set blob - <"$tmp/bin.in"
expect 0 rdzv get blob >"$tmp/bin.out"
cmp -s "$tmp/bin.in" "$tmp/bin.out" || fail "binary value changed in a set/get round trip"
head -c 300000 /dev/urandom >"$tmp/big.in"
expect 0 rdzv set big - <"$tmp/big.in"
expect 0 rdzv get big >"$tmp/big.out"
cmp -s "$tmp/big.in" "$tmp/big.out" || fail "300 kB binary value changed in a set/get round trip"
# Options after the command work as well as before it.
expect 0 timeout 10 "$BIN" get greeting --timeout 5 --port="$PORT" >"$tmp/out"
printf hello | cmp -s - "$tmp/out" || fail "get with trailing options returned '$(cat "$tmp/out")'"
ok "set/get round trips (text, empty, '-x', binary via stdin, 300 kB)"

# --prefix is prepended to every key.
expect 0 rdzv --prefix job1/ set a 1
expect 0 rdzv get job1/a >"$tmp/out"
[[ $(cat "$tmp/out") == 1 ]] || fail "--prefix set did not land under job1/a"
expect 0 rdzv get a --prefix job1/ >"$tmp/out"
[[ $(cat "$tmp/out") == 1 ]] || fail "--prefix get did not read job1/a"
ok "--prefix"

# add prints the new value; negative deltas are arguments, not options.
expect 0 rdzv add counter 5 >"$tmp/out"
[[ $(cat "$tmp/out") == 5 ]] || fail "add counter 5 printed '$(cat "$tmp/out")'"
expect 0 rdzv add counter -2 >"$tmp/out"
[[ $(cat "$tmp/out") == 3 ]] || fail "add counter -2 printed '$(cat "$tmp/out")'"
expect 0 rdzv get counter >"$tmp/out"
[[ $(cat "$tmp/out") == 3 ]] || fail "counter holds '$(cat "$tmp/out")'"
# Adding to a value that is not an integer, or out of the 64-bit range: the server drops the
# connection, and the message says why -> exit 1.
expect 1 rdzv add greeting 1
stderr_has "the value under 'greeting' (5 bytes: 'hello') is not a decimal integer"
expect 0 rdzv set huge 99999999999999999999
expect 1 rdzv add huge 1
stderr_has "not a decimal integer in the 64-bit range"
expect 0 rdzv del huge >/dev/null
ok "add, and add on a non-integer or out-of-range value exits 1 saying why"

# set KEY - reads at most --max-value-bytes (8M by default) and keeps to --timeout.
head -c $((8 * 1024 * 1024 + 1)) /dev/zero >"$tmp/over.in"
expect 1 rdzv set over - <"$tmp/over.in"
stderr_has "longer than 8M"
head -c $((4 * 1024 * 1024)) /dev/zero >"$tmp/four.in"
expect 1 rdzv set over - --max-value-bytes 2M <"$tmp/four.in"
stderr_has "longer than 2M"
t0=$(now_ms)
expect 3 timeout 10 "$BIN" --port "$PORT" --timeout 0.5 set over - < <(sleep 8)
t=$(($(now_ms) - t0))
((t < 3000)) || fail "set - with a silent stdin and --timeout 0.5 took $t ms"
stderr_has "reading the value from stdin"
ok "set - caps stdin at --max-value-bytes and keeps to --timeout ($t ms for 0.5 s)"

# status is JSON with at least keys, connections and waiters.
json_field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
expect 0 rdzv status >"$tmp/status.json"
python3 - "$tmp/status.json" <<'EOF' || fail "status JSON: $(cat "$tmp/status.json")"
import json, sys
with open(sys.argv[1]) as f:
    d = json.load(f)
for field in ("keys", "connections"):
    assert field in d, "no field " + field
    assert isinstance(d[field], int) and d[field] >= 0, field
assert d["keys"] >= 6, "keys %d after six sets" % d["keys"]
EOF
# Floats print as short as they are: uptime_s in whole milliseconds, never 0.83099999999999996.
grep -E '"uptime_s": [0-9]+(\.[0-9]{1,3})?,?$' "$tmp/status.json" >/dev/null ||
    fail "status: uptime_s printed as $(grep uptime_s "$tmp/status.json")"
ok "status prints JSON with keys and connections, uptime_s to the millisecond"

# wait that succeeds because a set arrives while it blocks. The waiter is known to be blocked
# once the server counts it (polling the status, not sleeping a guessed time).
timeout 10 "$BIN" --port "$PORT" --timeout 8 wait late1 late2 2>"$tmp/wait.err" &
waiter=$!
pids+=("$waiter")
deadline=$(($(now_ms) + 5000))
while :; do
    rdzv status >"$tmp/status.json" 2>/dev/null || fail "status failed while a wait was pending"
    [[ $(json_field waiters <"$tmp/status.json") -ge 1 ]] && break
    (($(now_ms) < deadline)) || fail "the server never counted the blocked waiter"
    sleep 0.02 # poll interval, not synchronisation
done
kill -0 "$waiter" 2>/dev/null || fail "wait returned before its keys existed"
expect 0 rdzv set late1 x
expect 0 rdzv set late2 y
rc=0
wait "$waiter" || rc=$?
((rc == 0)) || fail "wait exited $rc after its keys arrived: $(cat "$tmp/wait.err")"
ok "wait returns once a later set supplies the keys"

# wait, get and barrier that time out: exit 3, within bounds.
t0=$(now_ms)
expect 3 timeout 10 "$BIN" --port "$PORT" --timeout 0.5 wait never
t=$(($(now_ms) - t0))
((t >= 400 && t < 3000)) || fail "wait --timeout 0.5 took $t ms"
stderr_has "timed out"
expect 3 timeout 10 "$BIN" --port "$PORT" --timeout 0.3 get never >/dev/null
expect 3 timeout 10 "$BIN" --port "$PORT" --timeout 0.3 barrier lonely 2
ok "wait/get/barrier time out with exit 3 (wait: $t ms for 0.5 s)"

# A barrier of three concurrent processes, twice under the same name (reuse).
for round in 1 2; do
    bpids=()
    for i in 1 2 3; do
        timeout 10 "$BIN" --port "$PORT" --timeout 8 barrier b3 3 2>"$tmp/b$i.err" &
        bpids+=($!)
        pids+=($!)
    done
    for i in 0 1 2; do
        rc=0
        wait "${bpids[$i]}" || rc=$?
        ((rc == 0)) || fail "barrier round $round, process $i exited $rc: $(cat "$tmp/b$((i + 1)).err")"
    done
done
ok "barrier with 3 processes, two rounds"

# Issue 11 item 1: a lone caller retrying a barrier never passes; a name reused with another
# world size after a completed round does not pass alone; a caller with another world size
# than the round under way fails at once (exit 1).
for try in 1 2; do
    expect 3 rdzv barrier retry 2 --timeout 0.5
    stderr_has "withdrawn"
done
expect 3 rdzv barrier b3 2 --timeout 0.5
expect 3 rdzv barrier b3 3 --timeout 0.5
timeout 10 "$BIN" --port "$PORT" --timeout 8 barrier mixed 2 2>"$tmp/mixed.err" &
mixed=$!
pids+=("$mixed")
deadline=$(($(now_ms) + 5000))
until rdzv status >"$tmp/status.json" 2>/dev/null &&
    (($(json_field waiters <"$tmp/status.json") >= 1)); do
    (($(now_ms) < deadline)) || fail "the server never counted the barrier's waiter"
    sleep 0.02 # poll interval, not synchronisation
done
expect 1 rdzv barrier mixed 3
stderr_has "not 3"
expect 0 rdzv barrier mixed 2
rc=0
wait "$mixed" || rc=$?
((rc == 0)) || fail "the first caller of barrier mixed exited $rc: $(cat "$tmp/mixed.err")"
ok "barrier: lone retries time out, a reused name with another size does not pass alone, a mismatched size fails"

# del prints 1 then 0, exit 0 both times; keys lists the keys, sorted, under --prefix.
expect 0 rdzv del greeting >"$tmp/out"
[[ $(cat "$tmp/out") == 1 ]] || fail "del of an existing key printed '$(cat "$tmp/out")'"
expect 0 rdzv del greeting >"$tmp/out"
[[ $(cat "$tmp/out") == 0 ]] || fail "del of a missing key printed '$(cat "$tmp/out")'"
expect 0 rdzv keys >"$tmp/out"
grep -qx 'counter' "$tmp/out" || fail "keys does not list 'counter': $(cat "$tmp/out")"
! grep -qx 'greeting' "$tmp/out" || fail "keys lists the deleted 'greeting'"
LC_ALL=C sort -c "$tmp/out" 2>/dev/null || fail "keys are not sorted: $(cat "$tmp/out")"
n1=$(wc -l <"$tmp/out")
expect 0 rdzv set one-more 1
expect 0 rdzv keys >"$tmp/out"
n2=$(wc -l <"$tmp/out")
((n2 == n1 + 1)) || fail "keys went from $n1 to $n2 lines after one set"
expect 0 rdzv keys --prefix job1/ >"$tmp/out"
[[ $(cat "$tmp/out") == a ]] || fail "keys --prefix job1/ printed '$(cat "$tmp/out")'"
ok "del (1, then 0), keys ($n1 -> $n2 lines, --prefix)"

# SIGTERM: the server exits 0 within 2 s; its exit closes the FIFO (EOF on fd 3).
t0=$(now_ms)
kill -TERM "$SRV"
rc=0
read -r -t 2 _ <&3 || rc=$?
((rc == 1)) || fail "server still running 2 s after SIGTERM (read status $rc)"
rc=0
wait "$SRV" || rc=$?
((rc == 0)) || fail "server exited $rc after SIGTERM"
exec 3<&-
ok "SIGTERM: server exited 0 in $(($(now_ms) - t0)) ms"

# Nobody listens any more: a refused connection fails at once (exit 1) with a hint, not after
# --timeout; with --connect-timeout it is retried that long, saying what it waits for.
t0=$(now_ms)
expect 1 timeout 10 "$BIN" --port "$PORT" --timeout 300 keys
t=$(($(now_ms) - t0))
((t < 2000)) || fail "a refused connection took $t ms to fail"
stderr_has "Connection refused"
stderr_has "--connect-timeout"
t0=$(now_ms)
expect 1 timeout 10 "$BIN" --port "$PORT" --connect-timeout 0.5 keys
t=$(($(now_ms) - t0))
((t >= 400 && t < 3000)) || fail "--connect-timeout 0.5 took $t ms"
stderr_has "waiting up to 0.5 s for a store to listen there"
ok "a refused connection fails at once; --connect-timeout 0.5 waits $t ms"

# SIGINT, --quiet (no info lines), and --listen-fd with an inherited socket, in one server that
# python3 starts on a socket it bound itself.
python3 - "$BIN" "$tmp/q.err" <<'EOF' || fail "--listen-fd / SIGINT / --quiet: see above"
import select, signal, socket, subprocess, sys
binary, errpath = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
with open(errpath, "wb") as err:
    p = subprocess.Popen([binary, "serve", "--quiet", "--listen-fd", str(s.fileno())],
                         stdout=subprocess.PIPE, stderr=err, pass_fds=[s.fileno()])
s.close()
try:
    if not select.select([p.stdout], [], [], 5)[0]:
        sys.exit("no port line within 5 s")
    line = p.stdout.readline().decode()
    if line != "%d\n" % port:
        sys.exit("--listen-fd: port line %r, socket bound to %d" % (line, port))
    got = subprocess.run([binary, "--port", str(port), "--timeout", "5", "keys"],
                         capture_output=True, timeout=10)
    if got.returncode != 0 or got.stdout != b"":
        sys.exit("keys on the --listen-fd server: %r" % (got,))
    p.send_signal(signal.SIGINT)
    rc = p.wait(timeout=2)
    if rc != 0:
        sys.exit("exit %d after SIGINT" % rc)
finally:
    if p.poll() is None:
        p.kill()
log = open(errpath).read()
if "info:" in log:
    sys.exit("--quiet still logged info lines: %r" % log)
EOF
ok "--listen-fd, --quiet, SIGINT -> exit 0"

echo "PASS"
