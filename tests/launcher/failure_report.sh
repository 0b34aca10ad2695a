#!/usr/bin/env bash
# The failure summary points at the cause, on one host:
#   1. a shell worker that writes 12 lines to stderr and exits 3 (no error file): its row's
#      message is the last line, and under it the last 10 lines of its stderr, no more;
#   2. the same under --redirects 3 --log-dir: the lines reach neither the console directly
#      nor go missing: the summary shows them and the log files' path, which exists;
#   3. a worker killed by SIGSEGV with `ulimit -c 0`: "signal 11 (SEGV)", not "core dumped";
#      with `ulimit -c unlimited` and a core_pattern that writes a file in the worker's
#      directory, "signal 11 (SEGV), core dumped" (skipped, said so, under another pattern);
#   4. two nodes on loopback (static, two ddprun processes): rank 1 on node 1 fails with a
#      stderr line; node 0's summary row names node 1 by rank and host, with the tail, which
#      travelled in the failure record;
#   5. two nodes with different tokens: node 1 exits at once saying the tokens differ; node 0's
#      store logs the failed authentication with node 1's address, and node 0, waiting for
#      node 1, says which address failed to authenticate within 5 s.
# Usage: failure_report.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$(readlink -f "$1")
. "$(dirname "$0")/lib.sh"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Lines of the summary's stderr block ("| ..." under "stderr (last N lines):").
tail_block() { sed -n '/stderr (last [0-9]* lines\?):/,/^=/p' "$1" | grep -E '^ +\| ' | sed -E 's/^ +\| //'; }
lines12='for i in $(seq 1 12); do echo "err line $i" >&2; done'

# 1. stderr tail, bounded.
timeout 30 "$ddprun" --standalone --nproc-per-node 1 --no-python sh -c "$lines12; exit 3" \
  >"$tmp/o1" 2>&1
rc=$?
got=$(tail_block "$tmp/o1" | tr '\n' ,)
want=$(seq 3 12 | sed 's/^/err line /' | tr '\n' ,)
if [ $rc = 3 ] && [ "$got" = "$want" ] && grep -Eq '^root .* exit 3 +[0-9]+  err line 12$' "$tmp/o1" &&
   grep -q 'stderr (last 10 lines):' "$tmp/o1"; then
  ok "no error file: the row says the last stderr line, 10 lines under it"
else
  fail "stderr tail: rc $rc, tail '$got'; $(cat "$tmp/o1")"
fi

# 2. --redirects 3: nothing on the console from the worker, the summary has its last lines.
timeout 30 "$ddprun" --standalone --nproc-per-node 1 --redirects 3 --log-dir "$tmp/logs" \
  --no-python sh -c "echo 'Traceback (most recent call last):' >&2; echo 'ValueError: bad shard' >&2; exit 3" \
  >"$tmp/o2" 2>&1
rc=$?
logs=$(sed -nE 's/^ +logs: (.*)\{stdout,stderr\}\.log$/\1/p' "$tmp/o2")
if [ $rc = 3 ] && [ "$(grep -c 'ValueError: bad shard' "$tmp/o2")" = 2 ] &&
   [ -n "$logs" ] && grep -q 'ValueError: bad shard' "$logs/stderr.log" && [ -e "$logs/stdout.log" ] &&
   tail_block "$tmp/o2" | grep -q '^Traceback (most recent call last):$'; then
  ok "--redirects 3: the traceback in the summary (row and tail), the log files named"
else
  fail "--redirects 3: rc $rc, logs '$logs'; $(cat "$tmp/o2")"
fi

# 3. A signal, with and without a core.
mkdir "$tmp/core"
(cd "$tmp/core" && ulimit -c 0 && timeout 30 "$ddprun" --standalone --nproc-per-node 1 --no-python \
  sh -c 'kill -SEGV $$' >"$tmp/o3" 2>&1)
rc=$?
if [ $rc = 139 ] && grep -Eq '^root .* signal 11 \(SEGV\) +[0-9]+ ' "$tmp/o3" &&
   ! grep -q 'core dumped' "$tmp/o3" &&
   grep -Eq 'ddprun: rank 0 \(local rank 0, pid [0-9]+\) failed: signal 11 \(SEGV\)$' "$tmp/o3"; then
  ok "SIGSEGV without a core: named, no 'core dumped'"
else
  fail "SIGSEGV, ulimit -c 0: rc $rc; $(cat "$tmp/o3")"
fi
pattern=$(cat /proc/sys/kernel/core_pattern 2>/dev/null)
# The core limit a worker gets: a sanitizer's runtime in ddprun and its guard lowers it to 0
# (ASan's disable_coredump), and then no core can be dumped whatever the shell allows.
limit=$(cd "$tmp/core" && ulimit -c unlimited && timeout 30 "$ddprun" --standalone \
  --nproc-per-node 1 --no-python sh -c 'ulimit -c' 2>/dev/null)
if [[ "$limit" != *unlimited* ]]; then
  echo "skip: workers get core limit '$limit' under this ddprun: the core dumped case is unit-tested only"
elif [[ "$pattern" == core* ]]; then
  (cd "$tmp/core" && ulimit -c unlimited && timeout 30 "$ddprun" --standalone --nproc-per-node 1 \
    --no-python sh -c 'kill -SEGV $$' >"$tmp/o3b" 2>&1)
  rc=$?
  if [ $rc = 139 ] && [ -n "$(ls "$tmp/core")" ] &&
     grep -Eq '^root .* signal 11 \(SEGV\), core dumped +[0-9]+ ' "$tmp/o3b" &&
     grep -q 'failed: signal 11 (SEGV), core dumped$' "$tmp/o3b"; then
    ok "SIGSEGV with a core: 'core dumped'"
  else
    fail "SIGSEGV, ulimit -c unlimited: rc $rc, cores: $(ls "$tmp/core"); $(cat "$tmp/o3b")"
  fi
else
  echo "skip: core_pattern '$pattern' writes no file here: the core dumped case is unit-tested only"
fi

# 4. Two nodes: node 1's failure, with its tail, in node 0's summary.
port=$(free_port)
host=$(hostname)
for i in 0 1; do
  timeout 60 "$ddprun" --nnodes 2 --node-rank $i --master-addr 127.0.0.1 --master-port "$port" \
    --nproc-per-node 1 --no-python sh -c \
    "if [ \$GROUP_RANK = 1 ]; then echo 'CUDA error: out of memory' >&2; exit 5; fi; exec sleep 30" \
    >"$tmp/n$i" 2>&1 &
  pids[$i]=$!
done
wait "${pids[0]}"; r0=$?
wait "${pids[1]}"; r1=$?
if [ $r0 = 5 ] && [ $r1 = 5 ] &&
   grep -Eq "^root .* +1 +$host +1 +0 +exit 5 +[0-9]+  CUDA error: out of memory$" "$tmp/n0" &&
   grep -q "rank 1 on node 1 ($host) failed (exit 5): stopping the local workers" "$tmp/n0" &&
   [ "$(tail_block "$tmp/n0")" = "CUDA error: out of memory" ]; then
  ok "two nodes: node 1's failure in node 0's summary with its node rank, host and stderr"
else
  fail "two nodes: rc $r0 $r1; node 0: $(cat "$tmp/n0")"
fi

# 5. Two nodes, two tokens.
port=$(free_port)
DDPRUN_TOKEN=$(printf 'a%.0s' $(seq 32)) timeout 60 "$ddprun" --nnodes 2 --node-rank 0 \
  --master-addr 127.0.0.1 --master-port "$port" --rdzv-conf join_timeout=8 --no-python true \
  >"$tmp/t0" 2>&1 &
pids[0]=$!
for n in $(seq 200); do ss -ltnH "sport = :$port" | grep -q . && break; sleep 0.05; done # node 0 serves
t0=$(now_ms)
DDPRUN_TOKEN=$(printf 'b%.0s' $(seq 32)) timeout 30 "$ddprun" --nnodes 2 --node-rank 1 \
  --master-addr 127.0.0.1 --master-port "$port" --rdzv-conf join_timeout=8 --no-python true \
  >"$tmp/t1" 2>&1
r1=$?
ms1=$(($(now_ms) - t0))
said=""
for n in $(seq 100); do
  said=$(grep -m1 'waiting for the other nodes: 127\.0\.0\.1:[0-9]* failed to authenticate' "$tmp/t0") && break
  sleep 0.05
done
ms0=$(($(now_ms) - t0))
wait "${pids[0]}"; r0=$?
if [ $r1 != 0 ] && [ $ms1 -le 5000 ] && grep -q "its token is not this node's" "$tmp/t1" &&
   grep -Eq 'store: closing connection from 127\.0\.0\.1:[0-9]+: authentication failed' "$tmp/t0" &&
   [ -n "$said" ] && [ $ms0 -le 5000 ] && [ $r0 != 0 ]; then
  ok "wrong token: node 1 out in $ms1 ms; node 0 logged its address and said so within $ms0 ms"
else
  fail "wrong token: rc $r0 $r1 ($ms1 ms, $ms0 ms); node 0: $(cat "$tmp/t0"); node 1: $(cat "$tmp/t1")"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
