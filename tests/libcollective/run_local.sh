#!/usr/bin/env bash
# libcollective on one host (shared memory): coll-check under ddprun --standalone.
# World sizes 1 to 8 run ops (every operation x dtype x reduction x count x root), args and
# barrier; 3 and 6 ranks run ops again with tiny chunks (one odd-sized)
# and a tiny small-message threshold, so that the pipelined paths see the odd counts; 4 and 3
# ranks run algos, and 4 ranks ops again with COLL_CPU_ALGO=latency and =ring; 4 ranks run
# big, inflight, split, p2p, abort, timeout and kill; 3 ranks split, p2p, inflight, abort,
# timeout and kill (an odd size); 8 ranks timeout. Every ddprun is bounded by timeout(1).
# Usage: run_local.sh DDPRUN COLL_CHECK [FILTER]. FILTER (a grep -E pattern) picks jobs by name.
# Exit 0 pass, 1 fail, 77 skip (missing programs).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DDPRUN COLL_CHECK [FILTER]"; exit 2; }
ddprun=$(readlink -f "$1")
check=$(readlink -f "$2")
filter=${3:-.}
[ -x "$ddprun" ] && [ -x "$check" ] || { echo "skip: $1 or $2 missing"; exit 77; }
command -v timeout >/dev/null || { echo "skip: no timeout(1)"; exit 77; }

tmp=$(mktemp -d)
[ -n "${KEEP_TMP:-}" ] && echo "tmp=$tmp"
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# job NAME NPROC SECONDS WANT ARGS...: coll-check ARGS on NPROC local ranks, bounded by
# SECONDS. WANT: "all" (ddprun exits 0 and every rank prints PASS for each scenario in ARGS) or
# "kill:V" (every rank but V prints PASS for kill; rank V announces its death).
job() {
  local name=$1 np=$2 secs=$3 want=$4 rc bad="" out t0=$SECONDS
  shift 4
  grep -Eq -- "$filter" <<<"$name" || return 0
  timeout -k 10 "$secs" "$ddprun" --standalone --nproc-per-node "$np" --shutdown-timeout 90 \
    "$check" --expect-hosts 1 "$@" >"$tmp/$name" 2>&1
  rc=$?
  out=$(cat "$tmp/$name")
  if [ "$want" = all ]; then
    [ $rc = 0 ] || bad+=" ddprun exit code $rc;"
    local s n
    for s in "$@"; do
      case $s in -*|[0-9]*) continue ;; esac
      n=$(grep -Ec "coll-check: rank [0-9]+/$np $s: PASS" <<<"$out")
      [ "$n" = "$np" ] || bad+=" $s: $n of $np ranks passed;"
    done
  else
    local v=${want#kill:} n
    n=$(grep -Ec "coll-check: rank [0-9]+/$np kill: PASS" <<<"$out")
    [ "$n" = $((np - 1)) ] || bad+=" kill: $n of $((np - 1)) survivors passed;"
    grep -q "coll-check: rank $v/$np \[kill\]: issued the allreduce" <<<"$out" ||
      bad+=" the victim did not reach its death;"
  fi
  if [ -z "$bad" ]; then
    ok "$name ($((SECONDS - t0)) s)"
    grep -E 'GB/s|max error|\[(kill|timeout)\]: allreduce|\[abort\]: .*(aborted|naming)' <<<"$out" |
      grep -E '^\[0\]|\[kill\]|\[timeout\]|\[abort\]' | sed 's/^/    /'
  else
    fail "$name ($((SECONDS - t0)) s):$bad"
    grep -E 'FAIL|WATCHDOG|rror|signal|exit' <<<"$out" | head -60 | sed 's/^/    /'
    [ -n "${VERBOSE:-}" ] && sed 's/^/    | /' <<<"$out"
  fi
}

for n in 1 2 3 4 5 6 7 8; do
  job "ops-$n" $n 300 all ops args barrier
done
job ops-3-chunks 3 300 all ops --chunk-bytes 4096 --small-bytes 256
job ops-6-chunks 6 300 all ops --quick --chunk-bytes 1001 --small-bytes 0
# The reduction algorithms of the cpu backend: algos checks that forced and automatic choices
# agree bit for bit (and refuses bad values); ops runs again with each one forced.
job algos-4 4 300 all algos
job algos-3-chunks 3 300 all algos --quick --chunk-bytes 4096 --small-bytes 256
COLL_CPU_ALGO=latency job ops-4-latency 4 300 all ops --quick
COLL_CPU_ALGO=ring job ops-4-ring 4 300 all ops --quick
job misc-4 4 600 all big inflight split p2p
job misc-3 3 600 all split p2p inflight
job abort-4 4 120 all abort
job abort-3 3 120 all abort
job timeout-4 4 120 all timeout
job timeout-3 3 120 all timeout --skipper 1
job timeout-8 8 120 all timeout --skipper 0
job kill-4 4 120 kill:2 --timeout-ms 20000 --victim 2 kill
job kill-3 3 120 kill:0 --timeout-ms 20000 --victim 0 kill

echo "$fails failed"
[ $fails = 0 ]
