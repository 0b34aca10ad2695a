#!/usr/bin/env bash
# Interop test: real PyTorch clients against ddp-rendezvous and against PyTorch's own server.
#
# Usage: run_interop.sh PATH_TO_ddp-rendezvous PYTHON [PATH_TO_proxy_serve]
#
# With a third argument every client of ddp-rendezvous goes through a store proxy
# (rdzv_proxy, tests/rendezvous/proxy_serve.c) in front of it: the transcripts must still match
# PyTorch's server's, and the proxy must have coalesced nothing it should not have.
#
# 1. Runs store_scenario.py (one line per step) against `ddp-rendezvous serve` and against
#    torch_store_server.py started with the same PYTHON, and requires identical transcripts.
# 2. Runs 4 gloo_allreduce.py ranks with TORCHELASTIC_USE_AGENT_STORE=True, so every rank is
#    a pure client of the external store, against each of the two servers.
#
# PYTHON's torch decides the protocol: torch 1.x speaks the legacy one, torch 2.x the modern
# one. Servers bind port 0 and report the port on their first stdout line, read here through
# a fifo with `read -t`; nothing waits by sleeping. Every child runs under `timeout` against
# one overall deadline, so the script ends within about 90 s, and the EXIT trap kills what is
# still running. torch_store_server.py also exits when the fifo on its stdin loses its last
# writer, which is this shell, so it cannot outlive a killed run.
#
# Exit status: 0 pass, 1 fail, 77 skip (PYTHON missing or without torch.distributed).

set -euo pipefail

if [[ $# -ne 2 && $# -ne 3 ]]; then
    echo "usage: $0 PATH_TO_ddp-rendezvous PYTHON [PATH_TO_proxy_serve]" >&2
    exit 1
fi
rdzv=$1
py=$2
proxy=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
host=127.0.0.1
world=4
deadline=$((SECONDS + 85))

if ! command -v "$py" >/dev/null 2>&1; then
    echo "SKIP: $py not found"
    exit 77
fi
if ! version=$("$py" -c 'import torch, torch.distributed as d; assert d.is_available(); print(torch.__version__)' 2>/dev/null); then
    echo "SKIP: $py has no usable torch.distributed"
    exit 77
fi
echo "python: $(command -v "$py"), torch $version"
if [[ ! -x $rdzv ]]; then
    echo "FAIL: $rdzv is not an executable" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/interop.XXXXXX")
pids=()
# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# Seconds left before the overall deadline, capped at $1; at least 1.
budget() {
    local left=$((deadline - SECONDS))
    ((left > $1)) && left=$1
    ((left < 1)) && left=1
    echo "$left"
}

# Keep the stdin fifo of the PyTorch servers open for writing for this shell's lifetime. The
# children are started with that descriptor closed so that our exit is their end of file.
mkfifo "$tmp/stdin"
exec {keep}<>"$tmp/stdin"

# start_server NAME COMMAND...: start a server whose first stdout line is its port; sets
# $port and $server_pid, or fails. Its output stays in $tmp/NAME.out and $tmp/NAME.err.
start_server() {
    local name=$1 fd line
    shift
    mkfifo "$tmp/$name.fifo"
    "$@" <"$tmp/stdin" >"$tmp/$name.fifo" 2>"$tmp/$name.err" {keep}>&- &
    server_pid=$!
    pids+=($!)
    exec {fd}<"$tmp/$name.fifo"
    if ! read -r -t "$(budget 30)" -u "$fd" line || [[ ! $line =~ ^[0-9]+$ ]]; then
        echo "FAIL: $name did not print a port (got '${line:-}')" >&2
        sed 's/^/    /' "$tmp/$name.err" >&2
        exit 1
    fi
    # Drain the rest of stdout so a chatty server never blocks on a full pipe.
    cat <&"$fd" >"$tmp/$name.out" &
    pids+=($!)
    exec {fd}<&-
    port=$line
    echo "$name: listening on $host:$port"
}

# run_scenario NAME PORT: write the transcript to $tmp/NAME.txt.
run_scenario() {
    local name=$1 port=$2 rc=0
    timeout -k 2 "$(budget 40)" "$py" "$here/store_scenario.py" "$host" "$port" \
        >"$tmp/$name.txt" 2>"$tmp/$name.scenario.err" {keep}>&- || rc=$?
    if ((rc != 0)); then
        echo "FAIL: scenario against $name exited $rc$( ((rc == 124)) && echo ' (timed out)')" >&2
        echo "    last steps:" >&2
        tail -n 5 "$tmp/$name.txt" | sed 's/^/    /' >&2
        grep -v '^\[W\|^frame #\|^Exception raised\|<omitting' "$tmp/$name.scenario.err" |
            tail -n 10 | sed 's/^/    /' >&2 || true
        return 1
    fi
    echo "scenario against $name: $(wc -l <"$tmp/$name.txt") steps"
}

# run_gloo NAME PORT: start $world ranks, all must print OK.
run_gloo() {
    local name=$1 port=$2 rank rc fail=0 limit
    local -a ranks=()
    limit=$(budget 40)
    for ((rank = 0; rank < world; rank++)); do
        RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$world \
            MASTER_ADDR=$host MASTER_PORT=$port \
            TORCHELASTIC_USE_AGENT_STORE=True TORCHELASTIC_RESTART_COUNT=0 \
            timeout -k 2 "$limit" "$py" "$here/gloo_allreduce.py" \
            >"$tmp/$name.gloo$rank.out" 2>"$tmp/$name.gloo$rank.err" {keep}>&- &
        ranks+=($!)
    done
    for ((rank = 0; rank < world; rank++)); do
        rc=0
        wait "${ranks[$rank]}" || rc=$?
        if ((rc != 0)) || ! grep -qx "OK rank $rank/$world" "$tmp/$name.gloo$rank.out"; then
            echo "FAIL: gloo rank $rank against $name exited $rc$( ((rc == 124)) && echo ' (timed out)')" >&2
            grep -v '^\[W\|^frame #\|^Exception raised\|<omitting\|NumPy\|_conversion_method' \
                "$tmp/$name.gloo$rank.err" | tail -n 8 | sed 's/^/    /' >&2 || true
            fail=1
        fi
    done
    ((fail == 0)) && echo "gloo all_reduce, $world ranks against $name: OK"
    return "$fail"
}

status=0

start_server ours "$rdzv" serve --bind "$host" --port 0
ours_port=$port
ours_pid=$server_pid
if [[ -n $proxy ]]; then
    start_server proxy "$proxy" "$host" "$ours_port"
    ours_port=$port
    proxy_pid=$server_pid
fi
start_server torch "$py" "$here/torch_store_server.py" "$host"
torch_port=$port
torch_pid=$server_pid

run_scenario ours "$ours_port" || status=1
run_scenario torch "$torch_port" || status=1
if [[ -s $tmp/ours.txt && -s $tmp/torch.txt ]]; then
    if diff -u --label "torch $version server" --label ddp-rendezvous \
        "$tmp/torch.txt" "$tmp/ours.txt"; then
        echo "scenario transcripts identical"
    else
        echo "FAIL: scenario transcripts differ (- PyTorch's server, + ddp-rendezvous)" >&2
        status=1
    fi
fi

run_gloo ours "$ours_port" || status=1
run_gloo torch "$torch_port" || status=1

# Both servers must still be running: a crash during the tests is a failure even if the
# clients happened not to notice.
for pid in "$ours_pid" "$torch_pid" ${proxy_pid:+"$proxy_pid"}; do
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "FAIL: server process $pid died during the run" >&2
        status=1
    fi
done

if ((status == 0)); then
    echo "PASS ($SECONDS s)"
else
    echo "FAIL ($SECONDS s)"
fi
exit "$status"
