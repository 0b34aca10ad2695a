#!/usr/bin/env bash
# Rendezvous benchmark: ddprun's etcd and c10d backends against torchrun, on one machine.
#
# Usage: bench/rdzv/rdzv_bench.sh [DDPRUN]        (default: build/launcher/ddprun)
#
# Every "node" is a launcher process (its own agent) on loopback with --nproc-per-node 1 and
# the worker rdzv_worker.c (compiled here), which records its start time (CLOCK_REALTIME).
#
# 1. Round time: N agents started at once with --nnodes N:N (the round closes as soon as all N
#    joined), a fresh --rdzv-id per run, workers that exit 0 at once. Reported, from the start
#    of the first agent: the last worker started, and every agent exited. Median of R runs.
# 2. Node death: 3 agents, --nnodes 2:3 --max-restarts 1, workers that stay up; once all three
#    workers run, the node serving the workers' store is killed (SIGKILL to its agent and every
#    process below it). Reported: kill -> first worker of restart 1 started, or "job ends" (kill ->
#    every agent exited) where the job cannot survive that node. ddprun runs with --rdzv-conf
#    heartbeat_timeout=3,last_call_timeout=1; torchrun with last_call_timeout=1 (its
#    heartbeat interval is fixed at 5 s in torch 1.13's dynamic rendezvous, see README.md).
#    Two worker kinds: "sleep" (the agents alone must notice the lost node) and "watch" (a
#    worker exits 1 when a peer worker of its round is gone, as a collective would).
#
# Backends: ddprun etcd (a 3-member etcd cluster this script starts on loopback, v2 API on),
# ddprun c10d (endpoint 127.0.0.1:<free port>), torchrun etcd-v2 on the same cluster (needs the
# python-etcd module) and torchrun c10d.
#
# Environment:
#   NS="2 8 32 128"   node counts for the round time
#   R=3               runs per point (median printed)
#   TORCH_MAX_N=32    largest N torchrun is run at (each agent imports torch: ~1 s of CPU)
#   DEATH_R=1         runs per node-death case
#   PYTHON113=/usr/bin/python3   torchrun's interpreter (torch 1.13, through
#                     tests/launcher/torchrun113.py); "none" skips torchrun
#   ETCD=etcd         the etcd binary (3.4; needs --enable-v2 for torchrun's etcd-v2)
#   ETCD_DATA=DIR     where the members' data directories go (default: the temporary
#                     directory; e.g. /dev/shm to take the disk's fsync out of the figures)
#   SECTIONS="1 2"    which measurements to run
#   KEEP=1            keep the temporary directory (agents' logs of the last node-death runs)
#   ONLY="..."        restrict to some of: ddprun-etcd ddprun-c10d torchrun-etcd-v2 torchrun-c10d
# Ratios are torchrun / ddprun with the same backend family: above 1 means ddprun is faster.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
ddprun=${1:-$root/build/launcher/ddprun}
[[ -x $ddprun ]] || { echo "$ddprun is not an executable (build first, or pass DDPRUN)" >&2; exit 1; }
ddprun=$(cd "$(dirname "$ddprun")" && pwd)/$(basename "$ddprun")
ns=${NS:-2 8 32 128}
reps=${R:-3}
torch_max=${TORCH_MAX_N:-32}
death_reps=${DEATH_R:-1}
py113=${PYTHON113:-/usr/bin/python3}
etcd_bin=${ETCD:-etcd}
only=${ONLY:-ddprun-etcd ddprun-c10d torchrun-etcd-v2 torchrun-c10d}
stats_py=$(command -v python3 || echo /usr/bin/python3)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rdzv_bench.XXXXXX")
etcd_pids=()
agent_pids=()
etcd_data=$tmp/etcd
cleanup() {
    local p
    for p in "${agent_pids[@]}"; do kill_tree "$p"; done
    for p in "${etcd_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${etcd_pids[@]}"; do wait "$p" 2>/dev/null; done
    [[ $etcd_data != "$tmp"/* ]] && rm -rf "$etcd_data"
    if [[ -n ${KEEP:-} ]]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
descendants() {  # the pids below $1, children before grandchildren
    local c
    for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done
}
kill_tree() {  # SIGKILL to $1 and everything below it, all gathered first
    local pids
    pids=$(descendants "$1")
    # shellcheck disable=SC2086
    kill -KILL "$1" $pids 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_ports() {  # N free TCP ports on 127.0.0.1, asked of the kernel all at once
    "$stats_py" -c 'import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))' "$1"
}
now_ns() { date +%s%N; }
started() {  # the start files of restart $2's workers in $1
    find "$1" -maxdepth 1 -regex ".*/$2\.[0-9]+"
}
wants() { [[ " $only " == *" $1 "* ]]; }

worker=$tmp/rdzv_worker
cc -std=c11 -O2 -Wall -Wextra "$here/rdzv_worker.c" -o "$worker" || exit 1

# ---- the etcd cluster ----------------------------------------------------------------------
etcd_data=$tmp/etcd
if [[ -n ${ETCD_DATA:-} ]]; then
    mkdir -p "$ETCD_DATA" && etcd_data=$(mktemp -d "$ETCD_DATA/rdzv_bench_etcd.XXXXXX") || exit 1
fi
read -r -a ports <<<"$(free_ports 6)"
# shellcheck source=../../tests/etcd_lib.sh
. "$here/../../tests/etcd_lib.sh"
ETCD=$etcd_bin ETCD_ARGS=--enable-v2=true etcd_cluster_start "$etcd_data" \
    ":127.0.0.1:${ports[0]}:${ports[1]}" ":127.0.0.1:${ports[2]}:${ports[3]}" \
    ":127.0.0.1:${ports[4]}:${ports[5]}" >"$tmp/etcd.start" 2>&1 ||
    { echo "the etcd cluster did not start:" >&2; cat "$tmp/etcd.start" >&2; exit 1; }
etcd_pids=("${ETCD_PIDS[@]}")
endpoints=$ETCD_ENDPOINTS
etcd0=127.0.0.1:${ports[0]}  # torchrun's etcd backends take one member
echo "etcd $("$etcd_bin" --version | head -1 | awk '{print $3}'): 3 members at $endpoints" \
    "(data in $etcd_data, $(df -T "$etcd_data" | awk 'NR == 2 {print $2}'))"

# ---- the launchers -------------------------------------------------------------------------
torch_ver=""
if [[ $py113 != none ]] && torch_ver=$("$py113" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    torchrun=("$py113" "$root/tests/launcher/torchrun113.py" --monitor-interval 0.1)
    if ! "$py113" -c 'import etcd' 2>/dev/null; then
        echo "note: $py113 has no python-etcd module: torchrun etcd-v2 skipped" \
            "(pip install --break-system-packages python-etcd)"
        only=${only//torchrun-etcd-v2/}
    fi
else
    echo "note: no torch for $py113: torchrun skipped"
    only=${only//torchrun-etcd-v2/} only=${only//torchrun-c10d/}
fi
[[ -n $torch_ver ]] && echo "torchrun: torch $torch_ver ($py113 tests/launcher/torchrun113.py" \
    "--monitor-interval 0.1)"
echo "machine: $(nproc) CPUs, $(uname -r); N = $ns; R = $reps; torchrun up to N = $torch_max"

# launcher_cmd NAME NNODES RUN_ID ENDPOINT_PORT CONF: prints the command words, one per line.
launcher_cmd() {
    local name=$1 nnodes=$2 id=$3 port=$4 conf=$5
    case $name in
        ddprun-etcd) printf '%s\n' "$ddprun" --rdzv-backend etcd --rdzv-endpoint "$endpoints" ;;
        ddprun-c10d) printf '%s\n' "$ddprun" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" ;;
        torchrun-etcd-v2) printf '%s\n' "${torchrun[@]}" --rdzv-backend etcd-v2 --rdzv-endpoint "$etcd0" ;;
        torchrun-c10d) printf '%s\n' "${torchrun[@]}" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" ;;
    esac
    printf '%s\n' --nnodes "$nnodes" --nproc-per-node 1 --rdzv-id "$id"
    [[ -n $conf ]] && printf '%s\n' --rdzv-conf "$conf"
    [[ $name == torchrun-* ]] && printf '%s\n' --no-python
}

# ---- 1. round time -------------------------------------------------------------------------
# round NAME N RUN: starts N agents, waits for them; writes "t0 last_worker exit ok" to
# $tmp/round.NAME.N.RUN.
round() {
    local name=$1 n=$2 run=$3 d=$tmp/r.$1.$2.$3 port i t0 t1 ok=1 cmd
    mkdir -p "$d/w" "$d/log"
    port=$(free_ports 1)
    mapfile -t cmd < <(launcher_cmd "$name" "$n:$n" "bench-$name-$n-$run-$$" "$port" "")
    agent_pids=()
    t0=$(now_ns)
    for ((i = 0; i < n; i++)); do
        timeout 300 "${cmd[@]}" "$worker" "$d/w" exit >"$d/log/$i" 2>&1 &
        agent_pids+=($!)
    done
    for i in "${!agent_pids[@]}"; do
        wait "${agent_pids[i]}" || { ok=0; echo "  $name N=$n run $run: agent $i exited $?"; }
    done
    t1=$(now_ns)
    agent_pids=()
    local got
    got=$(started "$d/w" 0 | wc -l)
    if ((got != n)); then
        ok=0
        echo "  $name N=$n run $run: $got of $n workers started; last lines of agent 0's log:"
        tail -5 "$d/log/0" | sed 's/^/    /'
    fi
    if ((ok)); then
        local last
        last=$(started "$d/w" 0 | xargs cat | awk 'BEGIN {m = 0} $1 > m {m = $1} END {print m}')
        echo "$name $n $(((last - t0) / 1000)) $(((t1 - t0) / 1000))" >>"$tmp/rounds"
    fi
    ((ok)) && rm -rf "$d"
}

if [[ " ${SECTIONS:-1 2} " == *" 1 "* ]]; then
echo
echo "== 1. round time: N agents at once, --nnodes N:N, --nproc-per-node 1, worker exits at once"
: >"$tmp/rounds"
for name in $only; do
    for n in $ns; do
        if [[ $name == torchrun-* ]] && ((n > torch_max)); then continue; fi
        for ((run = 0; run < reps; run++)); do round "$name" "$n" "$run"; done
    done
done
"$stats_py" - "$tmp/rounds" "$ns" "$torch_max" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, n, last, ex = line.split()
    rows.setdefault((name, int(n)), []).append((int(last) / 1e3, int(ex) / 1e3))
ns, tmax = [int(x) for x in sys.argv[2].split()], int(sys.argv[3])
def med(name, n, i):
    r = rows.get((name, n))
    return statistics.median(x[i] for x in r) if r else None
def cell(v):
    return f"{v:8.0f}" if v is not None else f"{'-':>8}"
def ratio(t, d):
    return f"{t / d:6.1f}x" if t is not None and d else f"{'':>7}"
print(f"  ms, median of runs; ratio = torchrun / ddprun with the same backend family")
print(f"  {'N':>4} | {'ddprun etcd':^19} | {'ddprun c10d':^19} | {'torchrun etcd-v2':^35} |"
      f" {'torchrun c10d':^35}")
print(f"  {'':>4} | {'worker':>8} {'exit':>8} {'':>1} | {'worker':>8} {'exit':>8} {'':>1} |"
      f" {'worker':>8} {'ratio':>7} {'exit':>8} {'ratio':>7} {'':>1} |"
      f" {'worker':>8} {'ratio':>7} {'exit':>8} {'ratio':>7}")
for n in ns:
    de, dc = [med("ddprun-etcd", n, i) for i in (0, 1)], [med("ddprun-c10d", n, i) for i in (0, 1)]
    te, tc = [med("torchrun-etcd-v2", n, i) for i in (0, 1)], [med("torchrun-c10d", n, i) for i in (0, 1)]
    runs = max(len(rows.get((k, n), [])) for k in
               ("ddprun-etcd", "ddprun-c10d", "torchrun-etcd-v2", "torchrun-c10d"))
    print(f"  {n:>4} | {cell(de[0])} {cell(de[1])}   | {cell(dc[0])} {cell(dc[1])}   |"
          f" {cell(te[0])} {ratio(te[0], de[0])} {cell(te[1])} {ratio(te[1], de[1])}   |"
          f" {cell(tc[0])} {ratio(tc[0], dc[0])} {cell(tc[1])} {ratio(tc[1], dc[1])}"
          + ("" if n <= tmax else "   (torchrun not run)"))
PY
fi

# ---- 2. node death -------------------------------------------------------------------------
# death NAME MODE RUN: 3 agents, kill the store's node once all 3 workers run; appends
# "NAME MODE restart|ends|none ms" to $tmp/deaths.
death() {
    local name=$1 mode=$2 run=$3 d=$tmp/d.$1.$2.$3 port i conf victim="" t_kill cmd
    mkdir -p "$d/w" "$d/log"
    port=$(free_ports 1)
    if [[ $name == ddprun-* ]]; then conf=heartbeat_timeout=3,last_call_timeout=1
    else conf=last_call_timeout=1; fi
    mapfile -t cmd < <(launcher_cmd "$name" 2:3 "death-$name-$mode-$run-$$" "$port" "$conf")
    cmd+=(--max-restarts 1)
    agent_pids=()
    for i in 0 1 2; do
        timeout 120 "${cmd[@]}" "$worker" "$d/w" "$mode" >"$d/log/$i" 2>&1 &
        agent_pids+=($!)
    done
    local deadline=$((SECONDS + 60))
    until (($(started "$d/w" 0 | wc -l) == 3)); do
        if ((SECONDS > deadline)); then
            echo "  $name $mode: the first round did not start 3 workers in 60 s"
            echo "$name $mode fail 0" >>"$tmp/deaths"
            return
        fi
        sleep 0.05
    done
    # The node serving the workers' store. ddprun etcd: the agent that says so; c10d: the
    # agent listening on the endpoint's port; torchrun etcd-v2: the node of group rank 0.
    case $name in
        ddprun-etcd)
            for i in 0 1 2; do grep -q "serving the workers' store" "$d/log/$i" && victim=$i; done ;;
        *-c10d)
            local lpid
            lpid=$(ss -Htlnp "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
            for i in 0 1 2; do
                [[ ${agent_pids[i]} == "$lpid" ]] && victim=$i
                # timeout(1) runs the agent as its child
                [[ $(ps -o ppid= -p "$lpid" 2>/dev/null | tr -d ' ') == "${agent_pids[i]}" ]] && victim=$i
            done ;;
        torchrun-etcd-v2)
            local f wpid grp
            for f in $(started "$d/w" 0); do
                read -r _ wpid grp _ <"$f"
                if [[ $grp == 0 ]]; then
                    local ap
                    ap=$(ps -o ppid= -p "$wpid" | tr -d ' ')
                    for i in 0 1 2; do
                        [[ $(ps -o ppid= -p "$ap" | tr -d ' ') == "${agent_pids[i]}" ]] && victim=$i
                    done
                fi
            done ;;
    esac
    if [[ -z $victim ]]; then
        echo "  $name $mode: could not tell which node serves the store"
        echo "$name $mode fail 0" >>"$tmp/deaths"
        for i in 0 1 2; do kill_tree "${agent_pids[i]}"; done
        wait; agent_pids=(); return
    fi
    # the node's processes: its agent (timeout's child) and everything below it
    local node
    node=$(descendants "${agent_pids[victim]}")
    if [[ -n ${KEEP:-} && $name == ddprun-etcd ]]; then  # etcd's events, timed, for the logs
        local k e
        k=$(printf /ddprun/ | base64) e=$(printf /ddprun0 | base64)
        curl -sN --max-time 30 -X POST "http://$etcd0/v3/watch" \
            -d "{\"create_request\":{\"key\":\"$k\",\"range_end\":\"$e\"}}" |
            while IFS= read -r l; do echo "$(date +%T.%N | cut -c1-12) $l"; done >"$d/log/etcd-watch" &
    fi
    echo "kill at $(date '+%F %T.%N' | cut -c1-23)" >"$d/log/kill"
    t_kill=$(now_ns)
    # shellcheck disable=SC2086
    kill -KILL $node 2>/dev/null
    # wait for a restart-1 worker, or for every survivor to exit
    local result="" t
    deadline=$((SECONDS + 25))
    while :; do
        if [[ -n $(started "$d/w" 1) ]]; then
            t=$(started "$d/w" 1 | xargs cat | awk 'NR == 1 || $1 < m {m = $1} END {print m}')
            result="restart $(((t - t_kill) / 1000))"
            break
        fi
        local alive=0
        for i in 0 1 2; do
            [[ $i != "$victim" ]] && kill -0 "${agent_pids[i]}" 2>/dev/null && alive=1
        done
        if ((!alive)); then
            result="ends $((($(now_ns) - t_kill) / 1000))"
            break
        fi
        if ((SECONDS > deadline)); then
            result="none 25000000"
            break
        fi
        sleep 0.02
    done
    echo "$name $mode $result" >>"$tmp/deaths"
    echo "  $name, $mode workers, run $run: node $victim killed: $result us"
    for i in 0 1 2; do kill -TERM "${agent_pids[i]}" 2>/dev/null; done
    for i in 0 1 2; do wait "${agent_pids[i]}" 2>/dev/null; done
    agent_pids=()
    cp -r "$d/log" "$tmp/last-death-logs.$name.$mode" 2>/dev/null
    rm -rf "$d"
}

[[ " ${SECTIONS:-1 2} " == *" 2 "* ]] || exit 0
echo
echo "== 2. node death: 3 agents, --nnodes 2:3 --max-restarts 1; SIGKILL the node serving the store"
echo "   ddprun: --rdzv-conf heartbeat_timeout=3,last_call_timeout=1;" \
    "torchrun: --rdzv-conf last_call_timeout=1 (keep-alive fixed at 5 s)"
: >"$tmp/deaths"
for name in $only; do
    for mode in sleep watch; do
        for ((run = 0; run < death_reps; run++)); do death "$name" "$mode" "$run" 2>/dev/null; done
    done
done
"$stats_py" - "$tmp/deaths" <<'PY'
import statistics, sys
res = {}
for line in open(sys.argv[1]):
    name, mode, kind, us = line.split()
    res.setdefault((name, mode), []).append((kind, int(us) / 1e6))
print(f"  {'launcher':<18} {'workers':<7} {'result (s from the kill, median)':<40}")
for (name, mode), rs in res.items():
    kinds = sorted({k for k, _ in rs})
    txt = []
    for k in kinds:
        t = statistics.median(s for kk, s in rs if kk == k)
        n = sum(1 for kk, _ in rs if kk == k)
        label = {"restart": "restart 1 started after", "ends": "job ends: all agents exited after",
                 "none": "no restart within", "fail": "failed"}[k]
        txt.append(f"{label} {t:.2f} s ({n} run{'s' if n > 1 else ''})")
    print(f"  {name:<18} {mode:<7} {'; '.join(txt)}")
PY
