#!/usr/bin/env bash
# Worker output is never lost without an error, and reaches the console as it is written:
#   1. --log-dir that cannot be created (under a regular file): rc 1 before any worker starts,
#      with a line naming --log-dir and the system's reason;
#   2. --redirects without --log-dir: the output is kept in a temporary directory (torchrun's
#      behaviour), which ddprun names; without any log flag no temporary directory is left;
#   3. two runs into one --log-dir: torchrun's layout <dir>/<run id>_XXXXXX/attempt_0/<local
#      rank>/{stdout.log,stderr.log}, TORCHELASTIC_ERROR_FILE in the same directory, and the
#      second run leaves the first run's logs alone;
#   4. a log file that cannot be written (RLIMIT_FSIZE): a line says so, and the rest of the
#      output goes to the console; a worker environment cut by that limit fails the start;
#   5. a partial line (a prompt) reaches the console, with its prefix, while the worker waits
#      for input, and its continuation gets no second prefix; a carriage return starts a
#      prefixed stretch ("\r\n" stays a line end); another worker's line ends the partial line;
#   6. --log-line-prefix-template expands ${hostname} (and $rank, torchrun's $name form).
# Waits are bounded polls on files the test controls (FIFOs make the workers wait).
# Usage: output.sh DDPRUN. Exit 0 pass, 1 fail.
set -uo pipefail
ddprun=$1
. "$(dirname "$0")/lib.sh"
feed() { # text fifo: writes a line to a FIFO, giving up after 10 s when nobody reads it
  timeout 10 sh -c 'echo "$1" >"$2"' _ "$1" "$2" || fail "nobody read $2"
}
# A ddprun line: "[2026-11-24 21:03:04.123] ddprun: ..."
TS='^\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}\] ddprun: '

# 1. --log-dir under a regular file.
touch "$tmp/file"
timeout 20 "$ddprun" --standalone --nproc-per-node 1 --log-dir "$tmp/file/logs" --redirects 3 \
  --no-python sh -c "touch $tmp/started" >"$tmp/o1" 2>&1
rc=$?
if [ $rc = 1 ] && [ ! -e "$tmp/started" ] &&
   grep -Eq "$TS--log-dir: cannot create '$tmp/file/logs': Not a directory" "$tmp/o1"; then
  ok "unusable --log-dir: rc 1, no worker, reason given"
else
  fail "unusable --log-dir: rc $rc, started: $([ -e "$tmp/started" ] && echo yes || echo no); $(cat "$tmp/o1")"
fi

# 2. --redirects 3 without --log-dir: kept under $TMPDIR, and named.
mkdir -p "$tmp/t2" "$tmp/t2b"
TMPDIR=$tmp/t2 timeout 20 "$ddprun" --standalone --nproc-per-node 2 --redirects 3 --no-python \
  sh -c 'echo "kept $RANK"; echo "kept err $RANK" >&2' >"$tmp/o2" 2>&1
rc=$?
dir=$(sed -nE "s/.*ddprun: worker logs and error files: (.*)/\1/p" "$tmp/o2")
if [ $rc = 0 ] && [[ "$dir" == "$tmp"/t2/ddprun_*/*_* ]] && grep -qx 'kept 1' "$dir/attempt_0/1/stdout.log" &&
   grep -qx 'kept err 0' "$dir/attempt_0/0/stderr.log" && ! grep -q kept "$tmp/o2"; then
  ok "--redirects without --log-dir: kept in $dir"
else
  fail "--redirects without --log-dir: rc $rc, dir '$dir'; $(cat "$tmp/o2"); $(find "$tmp/t2")"
fi
TMPDIR=$tmp/t2b timeout 20 "$ddprun" --standalone --nproc-per-node 1 --no-python true >"$tmp/o2b" 2>&1
rc=$?
if [ $rc = 0 ] && [ -z "$(ls -A "$tmp/t2b")" ] && ! grep -q "worker logs" "$tmp/o2b"; then
  ok "no log flag: no directory left, none announced"
else
  fail "no log flag: rc $rc; left: $(find "$tmp/t2b"); $(cat "$tmp/o2b")"
fi

# 3. Two runs into one --log-dir.
for run in 1 2; do
  timeout 20 "$ddprun" --standalone --nproc-per-node 2 --log-dir "$tmp/logs" -t 3 --no-python \
    sh -c "echo \"run $run rank \$RANK\"; echo \"err $run \$LOCAL_RANK\" >&2; echo \"ef \$TORCHELASTIC_ERROR_FILE\"" \
    >"$tmp/o3.$run" 2>&1 || fail "log run $run: rc $?; $(cat "$tmp/o3.$run")"
done
d1=$(sed -nE "s/.*ddprun: worker logs and error files: (.*)/\1/p" "$tmp/o3.1")
d2=$(sed -nE "s/.*ddprun: worker logs and error files: (.*)/\1/p" "$tmp/o3.2")
if [ -n "$d1" ] && [ -n "$d2" ] && [ "$d1" != "$d2" ] && [ "$(dirname "$d1")" = "$tmp/logs" ] &&
   [ "$(dirname "$d2")" = "$tmp/logs" ] &&
   grep -qx 'run 1 rank 1' "$d1/attempt_0/1/stdout.log" && grep -qx 'run 2 rank 1' "$d2/attempt_0/1/stdout.log" &&
   grep -qx 'err 1 0' "$d1/attempt_0/0/stderr.log" && grep -qx "ef $d2/attempt_0/1/error.json" "$d2/attempt_0/1/stdout.log" &&
   grep -q '\[1\]:run 2 rank 1' "$tmp/o3.2"; then
  ok "per-run log directories: $(basename "$d1"), $(basename "$d2")"
else
  fail "per-run log directories: '$d1' '$d2'; $(find "$tmp/logs" -type f | sort)"
fi

# 4. A log file past RLIMIT_FSIZE (64 KiB, room for the worker's environment, which goes to its
#    guard through a memfd): reported, and the rest reaches the console. The console is a pipe
#    (cat), which the limit does not concern.
(ulimit -f 64; exec timeout 20 "$ddprun" --standalone --nproc-per-node 1 --log-dir "$tmp/l4" \
  --redirects 1 --no-python sh -c 'head -c 100000 /dev/zero | tr "\0" x; echo; echo tail-marker') 2>&1 |
  cat >"$tmp/o4"
rc=${PIPESTATUS[0]}
if [ $rc = 0 ] && grep -Eq "${TS}rank 0: cannot write $tmp/l4/.*/attempt_0/0/stdout.log: File too large" "$tmp/o4" &&
   grep -q '^\[0\]:tail-marker$' "$tmp/o4"; then
  ok "log file past its size limit: reported, rest on the console"
else
  fail "log file past its size limit: rc $rc; $(grep -v xxxxx "$tmp/o4")"
fi

# A 1 KiB limit cuts the worker's environment: its start fails, and says why.
(ulimit -f 1; exec timeout 20 "$ddprun" --standalone --nproc-per-node 1 --no-python /bin/true) 2>&1 |
  cat >"$tmp/o4b"
rc=${PIPESTATUS[0]}
if [ $rc != 0 ] && grep -Eq "${TS}cannot start local rank 0: writing its environment: File too large" "$tmp/o4b"; then
  ok "an environment cut by RLIMIT_FSIZE fails the start (rc $rc)"
else
  fail "environment past RLIMIT_FSIZE: rc $rc; $(cat "$tmp/o4b")"
fi

# 5. Partial lines. Rank 0 prints a prompt and waits on a FIFO; rank 1 waits on another FIFO,
#    then prints a line; then rank 0 gets its answer and finishes its line, then prints a
#    progress bar with carriage returns.
mkfifo "$tmp/f0" "$tmp/f1"
timeout 30 "$ddprun" --standalone --nproc-per-node 2 --no-python sh -c "
  if [ \$RANK = 0 ]; then
    printf 'name? '; read x <$tmp/f0; echo \"hello \$x\"; printf 'bar 1\rbar 2\r\ndone\n'
  else
    read x <$tmp/f1; echo 'rank one'
  fi" >"$tmp/o5" 2>"$tmp/e5" &
pids+=($!)
if wait_for 10 grep -q 'name?' "$tmp/o5"; then
  if [ "$(cat "$tmp/o5")" = '[0]:name? ' ]; then
    ok "a prompt reaches the console while the worker waits"
  else
    fail "prompt: console shows '$(cat -A "$tmp/o5")'"
  fi
else
  fail "prompt: not on the console within 10 s: '$(cat -A "$tmp/o5")'"
fi
feed go "$tmp/f1"
wait_for 10 grep -q 'rank one' "$tmp/o5" || fail "rank 1's line did not come: $(cat -A "$tmp/o5")"
feed bob "$tmp/f0"
wait_for 10 grep -q 'done' "$tmp/o5"
wait "${pids[-1]}"; rc=$?
want=$'[0]:name? \n[1]:rank one\n[0]:hello bob\n[0]:bar 1\r[0]:bar 2\r\n[0]:done'
if [ $rc = 0 ] && [ "$(cat "$tmp/o5")" = "$want" ]; then
  ok "continuations, carriage returns and another worker's line"
else
  fail "partial lines: rc $rc; got:"; cat -A "$tmp/o5"; echo "want:"; cat -A <<<"$want"
fi

# 6. ${hostname} in the prefix template, and torchrun's $name form.
out=$(timeout 20 "$ddprun" --standalone --nproc-per-node 2 --no-python \
  --log-line-prefix-template '${hostname}/${role_name}/$rank/${local_rank}: ' echo hi 2>&1)
rc=$?
h=$(uname -n)
if [ $rc = 0 ] && grep -qx "$h/default/1/1: hi" <<<"$out" && grep -qx "$h/default/0/0: hi" <<<"$out"; then
  ok "prefix template with \${hostname}"
else
  fail "prefix template (rc $rc): $out"
fi

[ $fails = 0 ] && echo "all passed" || echo "$fails failed"
[ $fails = 0 ]
