#!/usr/bin/env bash
# README.md's commands work as printed:
#   1. every path in its top-level command blocks and `code` spans that starts with build/,
#      bench/ or .ci/ exists from the repository root (build/ is the build directory), and no
#      command block starts with one of the project's programs by bare name (not on PATH there);
#   2. "Using the store with PyTorch": the environment it gives `python3 train.py` makes
#      init_process_group(init_method="env://") work against `ddp-rendezvous serve`, on two ranks,
#      for each PYTHON given that has torch (Debian's 1.13, current).
# Usage: test_readme.sh README SOURCE_ROOT BUILD_ROOT DDP_RENDEZVOUS PYTHON...
# Exit 0 pass, 1 fail (part 2 is skipped for a python without torch).
set -uo pipefail
readme=$1 src=$2 build=$3 server=$4
shift 4
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# 1. Paths. Command blocks: lines indented by exactly four spaces (list items indent more).
{
  grep -E '^    [^ ]' "$readme" | tr -s ' \t' '\n'
  grep -oE '`[^`]+`' "$readme" | tr -d '`' | tr -s ' \t' '\n'
} | grep -E '^(build|bench|\.ci)/' | sed -E 's/[),.;:]+$//' | sort -u >"$tmp/paths"
n=0
while read -r p; do
  n=$((n + 1))
  case $p in
    build/*) f=$build/${p#build/} ;;
    *) f=$src/$p ;;
  esac
  [ -e "$f" ] || fail "README names $p, which does not exist ($f)"
done <"$tmp/paths"
bare=$(grep -E '^    (ddprun|ddp-rendezvous|ddp-train|coll-bench|store-bench) ' "$readme")
[ -z "$bare" ] || fail "README runs programs by bare name (not on PATH from the repository root): $bare"
[ $fails = 0 ] && ok "$n paths in README exist from the repository root"

# 2. "Using the store with PyTorch": the block's second command, continuation lines joined.
block=$(sed -n '/^## Using the store with PyTorch/,/^## /p' "$readme" | grep -E '^    ' |
  sed 's/^    //' | sed -e ':a' -e '/\\$/N; s/\\\n//; ta')
envline=$(grep -m1 'python3' <<<"$block")
vars=$(tr -s ' ' '\n' <<<"${envline%%python3*}" | grep -E '^[A-Z_]+=')
if ! grep -q 'ddp-rendezvous serve' <<<"$block" || [ -z "$vars" ]; then
  fail "cannot find the commands of 'Using the store with PyTorch': $block"
fi
cat >"$tmp/train.py" <<'EOF'
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} sum {int(t.item())}", flush=True)
dist.destroy_process_group()
EOF
ran=0
for py in "$@"; do
  "$py" -c 'import torch.distributed' 2>/dev/null || { echo "skip: no torch for $py"; continue; }
  ran=$((ran + 1))
  ver=$("$py" -c 'import torch; print(torch.__version__)')
  mkfifo "$tmp/port.$ran"
  "$server" serve --bind 127.0.0.1 --port 0 >"$tmp/port.$ran" 2>"$tmp/server.$ran.err" &
  spid=$!
  pids+=($spid)
  exec {fd}<"$tmp/port.$ran"
  if ! read -r -t 20 -u "$fd" port || [[ ! $port =~ ^[0-9]+$ ]]; then
    fail "ddp-rendezvous printed no port: $(cat "$tmp/server.$ran.err")"
    continue
  fi
  cat <&"$fd" >/dev/null &
  pids+=($!)
  exec {fd}<&-
  rpids=()
  for r in 0 1; do
    # The README's variables, then the test's own values for this run (host, port, ranks).
    env $vars MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" RANK=$r WORLD_SIZE=2 \
      timeout 90 "$py" "$tmp/train.py" >"$tmp/r$r.$ran" 2>&1 &
    rpids+=($!)
    pids+=($!)
  done
  rcs=""
  for p in "${rpids[@]}"; do wait "$p"; rcs+="$? "; done
  if [ "$rcs" = "0 0 " ] && grep -qx 'rank 0 sum 3' "$tmp/r0.$ran" && grep -qx 'rank 1 sum 3' "$tmp/r1.$ran"; then
    ok "README's store example with torch $ver ($py)"
  else
    fail "README's store example with torch $ver ($py): rcs=$rcs; $(tail -n 5 "$tmp/r0.$ran" "$tmp/r1.$ran")"
  fi
  kill -TERM "$spid" 2>/dev/null
done
[ $ran -gt 0 ] || echo "skip: no python with torch; the store example was not run"
[ $fails = 0 ]
