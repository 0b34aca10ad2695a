#!/usr/bin/env bash
# ddprun --store-proxy: what the store sees with and without the proxy, and the fallback.
#
# Usage: store_proxy.sh DDPRUN
#
# 1. 8 workers (store_probe.py: raw protocol, no torch) pass a barrier with --store-proxy on and
#    off; rank 0 prints the root store's STATUS. On: the workers' MASTER_PORT is the proxy's,
#    the root serves them over one multiplexed connection and accepted fewer connections than
#    with the proxy off (where it has none multiplexed) and saw fewer WAITs.
# 2. A c10d endpoint that is PyTorch's own store (no multiplexing): ddprun says so in one line
#    and the workers reach the store directly.
# 3. The proxy loses the store while its workers wait (its upstream connection destroyed with
#    ss -K): its workers' connections close, they fail, the node fails, and with
#    --max-restarts 1 the next round gets a new proxy and passes the barrier through it.
# Every run is bounded by `timeout`. Exit status: 0 pass, 1 fail, 77 skip (no python3).
set -uo pipefail
ddprun=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/store_proxy.XXXXXX")
spid=
cleanup() {
    [[ -n $spid ]] && kill "$spid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# field FILE EXPR: a value of the STATUS line in FILE (a Python expression over `d`).
field() {
    sed -n 's/^\[0\]:STATUS //p' "$1" |
        python3 -c "import json, sys; d = json.load(sys.stdin); print($2)"
}

for mode in on off; do
    timeout -k 5 90 "$ddprun" --store-proxy "$mode" --nproc-per-node 8 --no-python python3 \
        "$here/store_probe.py" >"$tmp/$mode.out" 2>&1
    rc=$?
    if ((rc != 0)) || ! grep -q '^\[0\]:STATUS ' "$tmp/$mode.out"; then
        fail "--store-proxy $mode: exit $rc"
        tail -n 20 "$tmp/$mode.out" | sed 's/^/    | /'
        continue
    fi
    mux=$(field "$tmp/$mode.out" 'd["multiplexed_connections"]')
    accepted=$(field "$tmp/$mode.out" 'd["connections_total"]["accepted"]')
    waits=$(field "$tmp/$mode.out" 'd["ops"]["wait"]')
    echo "--store-proxy $mode: root accepted $accepted connections, $mux multiplexed, $waits WAITs"
    declare "mux_$mode=$mux" "accepted_$mode=$accepted" "waits_$mode=$waits"
done
if [[ -n ${mux_on:-} && -n ${mux_off:-} ]]; then
    ((mux_on == 1)) && ok "proxy on: one multiplexed connection" || fail "proxy on: $mux_on multiplexed"
    ((mux_off == 0)) && ok "proxy off: none multiplexed" || fail "proxy off: $mux_off multiplexed"
    ((accepted_on < accepted_off)) && ok "fewer connections at the root ($accepted_on < $accepted_off)" ||
        fail "root connections: $accepted_on with the proxy, $accepted_off without"
    ((waits_on < waits_off)) && ok "fewer WAITs at the root ($waits_on < $waits_off)" ||
        fail "root WAITs: $waits_on with the proxy, $waits_off without"
fi

# 2. PyTorch's store as the c10d endpoint (python3's torch; skipped without one).
if python3 -c 'import torch.distributed' 2>/dev/null; then
    exec {sfd}< <(exec timeout 120 python3 "$here/../interop/torch_store_server.py" 127.0.0.1 </dev/zero)
    spid=$!
    if read -r -t 60 -u "$sfd" port && [[ $port =~ ^[0-9]+$ ]]; then
        timeout -k 5 90 "$ddprun" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
            --store-proxy on --nproc-per-node 2 --no-python python3 "$here/store_probe.py" \
            --no-status >"$tmp/torch.out" 2>&1
        rc=$?
        lines=$(grep -c 'does not multiplex' "$tmp/torch.out")
        if ((rc == 0 && lines == 1)); then
            ok "a PyTorch store: one line, and the workers use it directly"
        else
            fail "a PyTorch store: exit $rc, $lines lines about multiplexing"
            tail -n 20 "$tmp/torch.out" | sed 's/^/    | /'
        fi
    else
        fail "PyTorch's store server did not start"
    fi
else
    echo "skip: python3 has no torch: the fallback to a PyTorch store is not tried"
fi

# 3. Needs ss -K (SOCK_DESTROY) and root.
if (($(id -u) == 0)) && ss -K dst 127.0.0.2 dport = 1 >/dev/null 2>&1; then
    "$ddprun" --store-proxy on --max-restarts 1 --nproc-per-node 2 --no-python python3 \
        "$here/store_probe.py" --hold-first >"$tmp/loss.out" 2>&1 &
    dpid=$!
    for _ in $(seq 300); do
        (($(grep -c 'ready ' "$tmp/loss.out") >= 2)) && break
        sleep 0.05
    done
    pport=$(sed -n 's/^\[0\]:ready //p' "$tmp/loss.out")
    # ddprun's two listeners: the store's and the proxy's (MASTER_PORT); then its connections
    # to the store: the agent's, and the proxy's, opened later (the higher descriptor).
    sport=$(ss -tlnpH | grep "pid=$dpid," | awk '{print $4}' | sed 's/.*://' | grep -vx "$pport")
    mux=$(ss -tnpH state established "( dport = :$sport )" | grep "pid=$dpid," |
        sed -E 's/.*:([0-9]+) +[^ ]+:[0-9]+ .*fd=([0-9]+).*/\2 \1/' | sort -n | tail -n 1 |
        cut -d' ' -f2)
    if [[ -z $pport || -z $sport || -z $mux ]]; then
        fail "proxy loss: cannot find the proxy's connection (proxy $pport, store $sport)"
        kill "$dpid" 2>/dev/null
    else
        t0=$SECONDS
        ss -K dst 127.0.0.1 dport = "$sport" sport = "$mux" >/dev/null 2>&1
        rc=
        for _ in $(seq 600); do
            kill -0 "$dpid" 2>/dev/null || { wait "$dpid"; rc=$?; break; }
            sleep 0.05
        done
        [[ -z $rc ]] && { kill "$dpid" 2>/dev/null; wait "$dpid"; rc=timeout; }
        if [[ $rc == 0 ]] && grep -q 'lost the connection to the store' "$tmp/loss.out" &&
            grep -q 'restart' "$tmp/loss.out" &&
            [[ $(field "$tmp/loss.out" 'd["multiplexed_connections"]') == 1 ]]; then
            ok "proxy loss: the node failed, and the next round passed through a new proxy ($((SECONDS - t0)) s)"
        else
            fail "proxy loss: exit $rc"
            tail -n 25 "$tmp/loss.out" | sed 's/^/    | /'
        fi
    fi
else
    echo "skip: ss -K (SOCK_DESTROY) unavailable: the proxy's loss is not tried"
fi

((fails == 0)) && echo PASS || echo "FAIL ($fails)"
((fails == 0))
