#!/usr/bin/env bash
# libcollective's TCP path across "hosts" made of network namespaces (see ../netns_lib.sh):
# 2 and 3 hosts with one rank each, a mixed layout of 2 hosts x 2 ranks (shared memory within a
# host, TCP between host leaders) and an uneven one of 1, 2 and 3 ranks on 3 hosts. Each host is a ddprun in its own network namespace
# and, where unshare(1) allows, its own UTS namespace with a hostname of its own, started with
# static rendezvous (--nnodes/--node-rank/--master-addr/--master-port) and running coll-check:
# ops (also with tiny chunks), algos (2 x 2), big, split, p2p, inflight, timeout, abort, and kill
# with the victim on another host than the store; in the mixed layout the victim (and the rank
# that skips in timeout) is a host's non-leader or the other host's leader.
# Every ddprun is bounded by timeout(1). The namespaces are removed on exit.
# Usage: run_netns.sh DDPRUN COLL_CHECK [FILTER]. FILTER (a grep -E pattern) picks jobs by name.
# Exit 0 pass, 1 fail, 77 skip (not root, no ip/netns, missing programs).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DDPRUN COLL_CHECK [FILTER]"; exit 2; }
ddprun=$(readlink -f "$1")
check=$(readlink -f "$2")
filter=${3:-.}
[ -x "$ddprun" ] && [ -x "$check" ] || { echo "skip: $1 or $2 missing"; exit 77; }
command -v timeout >/dev/null || { echo "skip: no timeout(1)"; exit 77; }

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"

netns_test_begin

netns_setup coll "$tag" 10.213.8 3 || exit $?
nodes=("${NETNS_NODES[@]}")
addr=("${NETNS_ADDRS[@]}")

# A UTS namespace per node, so that hosts also differ by name, when unshare can make one.
uts=()
if ip netns exec "${nodes[0]}" unshare --uts true 2>/dev/null; then
  uts=(unshare --uts)
else
  echo "note: no UTS namespaces: the nodes share a hostname"
fi

# The namespaces are new and empty, so a fixed port cannot collide with anything there.
port=29600

# job NAME NNODES NPROC SECONDS WANT ARGS...: coll-check ARGS on nodes 0..NNODES-1 with NPROC
# ranks each (or "a,b,c": a ranks on node 0, b on node 1, ...), every ddprun bounded by SECONDS. WANT: "all" (every ddprun exits 0 and every rank
# prints PASS for each scenario in ARGS) or "kill:V" (every rank but V prints PASS for the
# kill scenario; rank V announces its death).
job() {
  local name=$1 nn=$2 secs=$4 want=$5 i rcs="" world=0 np
  IFS=, read -ra np <<<"$3"
  for ((i = 0; i < nn; i++)); do
    [ -n "${np[$i]:-}" ] || np[$i]=${np[0]}
    world=$((world + np[i]))
  done
  shift 5
  grep -Eq -- "$filter" <<<"$name" || return 0
  port=$((port + 1))
  local t0=$SECONDS
  for ((i = 0; i < nn; i++)); do
    local host=""
    [ ${#uts[@]} -gt 0 ] && host=collhost$i-$tag
    ip netns exec "${nodes[$i]}" "${uts[@]}" \
      sh -c '[ -z "$1" ] || hostname "$1"; shift; exec "$@"' sh "$host" \
      timeout -k 10 "$secs" "$ddprun" --nnodes "$nn" --node-rank "$i" --master-addr "${addr[0]}" \
      --master-port "$port" --nproc-per-node "${np[$i]}" --shutdown-timeout 90 \
      "$check" --expect-hosts "$nn" "$@" >"$tmp/$name.$i" 2>&1 &
    pids[$i]=$!
  done
  for ((i = 0; i < nn; i++)); do
    wait "${pids[$i]}"
    rcs+="$? "
  done
  local el=$((SECONDS - t0)) out
  out=$(cat "$tmp/$name".*)
  local bad=""
  if [ "$want" = all ]; then
    [ "$rcs" = "$(printf '0 %.0s' $(seq "$nn"))" ] || bad+=" ddprun exit codes: $rcs;"
    local s
    for s in "$@"; do
      case $s in -*|[0-9]*) continue ;; esac
      local n
      n=$(grep -Ec "coll-check: rank [0-9]+/$world $s: PASS" <<<"$out")
      [ "$n" = "$world" ] || bad+=" $s: $n of $world ranks passed;"
    done
  else
    local v=${want#kill:} n
    n=$(grep -Ec "coll-check: rank [0-9]+/$world kill: PASS" <<<"$out")
    [ "$n" = $((world - 1)) ] || bad+=" kill: $n of $((world - 1)) survivors passed;"
    grep -q "coll-check: rank $v/$world \[kill\]: issued the allreduce" <<<"$out" ||
      bad+=" the victim did not reach its death;"
  fi
  if [ -z "$bad" ]; then
    ok "$name (${el} s)"
    grep -E 'GB/s|\[(kill|timeout)\]: allreduce|\[abort\]: .*(aborted|naming)' <<<"$out" |
      sed 's/^/    /'
  else
    fail "$name (${el} s):$bad"
    grep -E 'FAIL|WATCHDOG|error|Error|rror:|signal|exit' <<<"$out" | head -60 | sed 's/^/    /'
    [ -n "${VERBOSE:-}" ] && sed 's/^/    | /' <<<"$out"
  fi
}

job 2x1-ops  2 1 300 all ops big split p2p inflight barrier args
job 2x1-abort 2 1 120 all abort
job 2x1-timeout 2 1 120 all timeout
job 2x1-kill 2 1 120 kill:1 --timeout-ms 20000 --victim 1 kill
job 3x1-ops  3 1 300 all ops big split p2p inflight
job 3x1-abort 3 1 120 all abort
job 3x1-timeout 3 1 120 all timeout --skipper 1
job 3x1-kill 3 1 120 kill:2 --timeout-ms 20000 --victim 2 kill
job 2x2-ops  2 2 400 all ops big split p2p inflight barrier
job 2x2-chunks 2 2 300 all ops --quick --chunk-bytes 4096 --small-bytes 256
job 2x2-algos 2 2 300 all algos --quick
job 2x2-abort 2 2 120 all abort
job 2x2-timeout-leader 2 2 120 all timeout --skipper 2
job 2x2-kill 2 2 120 kill:3 --timeout-ms 20000 --victim 3 kill
job 2x2-kill-local 2 2 120 kill:1 --timeout-ms 20000 --victim 1 kill
job 2x2-kill-leader 2 2 120 kill:2 --timeout-ms 20000 --victim 2 kill
job 2x2-timeout-nonleader 2 2 120 all timeout --skipper 3
job 3x123-ops 3 1,2,3 400 all ops --quick big split p2p inflight
job 3x123-kill 3 1,2,3 120 kill:4 --timeout-ms 20000 --victim 4 kill

echo "$fails failed"
[ $fails = 0 ]
