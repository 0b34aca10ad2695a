#!/usr/bin/env bash
# libddp against a serial reference: ddp-serial under ddprun --standalone on one host (written
# with the first, parallel draft of libddp; its misuse scenario follows that draft's API choices
# and is not run: tests/libddp/ddp-check.c covers misuse for this libddp).
# World sizes 1 to 4 run equiv, accum, nonfinite, layout, memory and trace (3 ranks:
# odd sizes, so groups pad); 2 and 3 ranks run kill at every stage (a rank SIGKILLed in the
# middle of a step; survivors must name it within the 5 s communicator timeout) and stall (a rank
# sleeping past a 3 s timeout: survivors time out naming it). Every ddprun is bounded by
# timeout(1).
# Usage: run_serial.sh DDPRUN DDP_SERIAL [FILTER]. FILTER (a grep -E pattern) picks jobs by name.
# Exit 0 pass, 1 fail, 77 skip (missing programs).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DDPRUN DDP_SERIAL [FILTER]"; exit 2; }
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

# job NAME NPROC SECONDS WANT ARGS...: ddp-serial ARGS on NPROC local ranks, bounded by SECONDS.
# WANT: "all" (ddprun exits 0 and every rank prints PASS for each scenario in ARGS) or "kill:V"
# (every rank but V prints PASS for kill, and V announced its death) or "stall:V" (likewise for
# stall).
job() {
  local name=$1 np=$2 secs=$3 want=$4 rc bad="" out t0=$SECONDS
  shift 4
  grep -Eq -- "$filter" <<<"$name" || return 0
  timeout -k 10 "$secs" "$ddprun" --standalone --nproc-per-node "$np" --shutdown-timeout 30 \
    "$check" "$@" >"$tmp/$name" 2>&1
  rc=$?
  out=$(cat "$tmp/$name")
  if [ "$want" = all ]; then
    [ $rc = 0 ] || bad+=" ddprun exit code $rc;"
    local s n
    for s in "$@"; do
      case $s in -*|[0-9]*) continue ;; esac
      n=$(grep -Ec "ddp-serial: rank [0-9]+/$np $s: PASS" <<<"$out")
      [ "$n" = "$np" ] || bad+=" $s: $n of $np ranks passed;"
    done
  else
    local s=${want%%:*} v=${want#*:} n
    n=$(grep -Ec "ddp-serial: rank [0-9]+/$np $s: PASS" <<<"$out")
    [ "$n" = $((np - 1)) ] || bad+=" $s: $n of $((np - 1)) survivors passed;"
    grep -Eq "ddp-serial: rank $v/$np \[$s\]: (dying|stalling)" <<<"$out" ||
      bad+=" the victim did not reach its fault;"
  fi
  if [ -z "$bad" ]; then
    ok "$name ($((SECONDS - t0)) s)"
    grep -E 'ddp-serial: rank 0/|\[(kill|stall)\]: stage' <<<"$out" | grep -v ': PASS' |
      sed 's/^/    /'
    grep -E ': PASS .*max parameter error' <<<"$out" | head -1 | sed 's/^/    /'
  else
    fail "$name ($((SECONDS - t0)) s):$bad"
    grep -E 'FAIL|WATCHDOG|rror|signal|exit' <<<"$out" | head -40 | sed 's/^/    /'
    [ -n "${VERBOSE:-}" ] && sed 's/^/    | /' <<<"$out"
  fi
}

all="equiv accum nonfinite layout memory trace"
for n in 1 2 3 4; do
  job "all-$n" $n 120 all $all
done
for s in 0 1 2 3; do
  job "kill-2-stage$s" 2 60 kill:1 --timeout-ms 5000 --stage $s kill
done
job kill-3-stage3 3 60 kill:0 --timeout-ms 5000 --victim 0 --stage 3 kill
job kill-3-stage1 3 60 kill:1 --timeout-ms 5000 --victim 1 --stage 1 kill
job stall-2-stage0 2 60 stall:1 --timeout-ms 3000 --stage 0 stall
job stall-3-stage3 3 60 stall:2 --timeout-ms 3000 --stage 3 stall

echo "$fails failed"
[ $fails = 0 ]
