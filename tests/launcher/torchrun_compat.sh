#!/usr/bin/env bash
# ddprun run as a torchrun user would (ddprun(1), "Coming from torchrun" in README.md):
#   1. a Python script named `trainer` (no .py) runs under $PYTHON_EXEC -u, as torchrun runs it;
#      binaries and shell scripts still run as they are;
#   2. --virtual-local-rank: LOCAL_RANK 0 and one device per worker, as torchrun;
#   3. options that change nothing in ddprun say so, one line each, and the job still runs;
#   4. exit status: a worker's 2 and a usage error (2) are told apart by what ddprun prints;
#   5. --run-path with a relative path runs the script from the working directory, as torchrun
#      does, with -m or not (--run-path takes precedence).
# Usage: torchrun_compat.sh DDPRUN. Exit 0 pass, 1 fail, 77 skip (no python3).
set -uo pipefail
ddprun=$(readlink -f "$1")
python=$(command -v python3) || { echo "skip: no python3"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# 1. `trainer`: Python without .py, without the execute bit, then with a python '#!' line.
# PYTHON_EXEC names the interpreter (a wrapper that marks its output), as with torchrun.
cat >pywrap <<EOF
#!/bin/sh
echo "via PYTHON_EXEC \$*"
exec "$python" "\$@"
EOF
chmod +x pywrap
printf 'import os, sys\nprint("trainer rank", os.environ["RANK"], sys.argv[1:])\n' >trainer
out=$(PYTHON_EXEC=$tmp/pywrap timeout 30 "$ddprun" --nproc-per-node 2 trainer --lr 0.1 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q "^\[0\]:via PYTHON_EXEC -u trainer --lr 0.1" <<<"$out" &&
   grep -q "^\[1\]:trainer rank 1 \['--lr', '0.1'\]" <<<"$out"; then
  ok "trainer (no .py) runs as PYTHON_EXEC -u trainer"
else
  fail "trainer: rc=$rc: $out"
fi
{ echo '#!/usr/bin/env python3'; cat trainer; } >trainer2 && chmod +x trainer2
out=$(PYTHON_EXEC=$tmp/pywrap timeout 30 "$ddprun" --nproc-per-node 1 ./trainer2 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q "via PYTHON_EXEC -u ./trainer2" <<<"$out" &&
   grep -q "trainer rank 0" <<<"$out"; then
  ok "executable python script (#!/usr/bin/env python3) runs under PYTHON_EXEC -u"
else
  fail "./trainer2: rc=$rc: $out"
fi
printf '#!/bin/sh\necho "shell rank $RANK"\n' >job && chmod +x job
out=$(PYTHON_EXEC=$tmp/pywrap timeout 30 "$ddprun" --nproc-per-node 2 ./job 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q '^\[1\]:shell rank 1' <<<"$out" && ! grep -q PYTHON_EXEC <<<"$out"; then
  ok "a /bin/sh script runs as it is"
else
  fail "./job: rc=$rc: $out"
fi

# 2. --virtual-local-rank.
out=$(CUDA_VISIBLE_DEVICES=5,7 timeout 30 "$ddprun" --nproc-per-node 2 --virtual-local-rank \
  sh -c 'echo "lr=$LOCAL_RANK cvd=$CUDA_VISIBLE_DEVICES"' 2>&1)
rc=$?
if [ $rc = 0 ] && grep -qx '\[0\]:lr=0 cvd=5' <<<"$out" && grep -qx '\[1\]:lr=0 cvd=7' <<<"$out"; then
  ok "--virtual-local-rank: LOCAL_RANK 0, one device each"
else
  fail "--virtual-local-rank: rc=$rc: $out"
fi

# 3. Options without effect: accepted, one warning line each, the job runs.
out=$(timeout 30 "$ddprun" --nproc-per-node 1 --numa-binding node --local-addr 10.1.1.1 \
  --duplicate-stdout-filters x sh -c 'echo ran' 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q '^\[0\]:ran' <<<"$out" &&
   [ "$(grep -c 'ddprun: warning: --[a-z-]* has no effect in ddprun' <<<"$out")" = 3 ]; then
  ok "options without effect: one warning each, the job runs"
else
  fail "ignored options: rc=$rc: $out"
fi

# 4. Exit status 2: a worker's (the summary names it) and a usage error's (the flag named, no
# worker started).
out=$(timeout 30 "$ddprun" --nproc-per-node 2 sh -c 'exit 2' 2>&1)
rc=$?
if [ $rc = 2 ] && grep -Eq '^root .* exit 2 ' <<<"$out"; then
  ok "a worker's exit 2: ddprun exits 2 with the failure summary"
else
  fail "worker exit 2: rc=$rc: $out"
fi
out=$(timeout 30 "$ddprun" --nproc-per-node two sh -c 'echo started' 2>&1)
rc=$?
if [ $rc = 2 ] && grep -q '^ddprun: --nproc-per-node: ' <<<"$out" && ! grep -q 'started\|root ' <<<"$out"; then
  ok "usage error: exit 2, the flag named, nothing started"
else
  fail "usage error: rc=$rc: $out"
fi

# 5. --run-path with a relative path: torchrun's workers call runpy.run_path() on it from the
# working directory they inherit, and sys.argv[0] is the path as given.
mkdir -p sub
printf 'import sys\nprint("run-path", sys.argv[0], sys.argv[1:])\n' >sub/rp.py
for m in "" -m; do
  # shellcheck disable=SC2086 # $m: no word or -m
  out=$(timeout 30 "$ddprun" --nproc-per-node 2 $m --run-path sub/rp.py --x 1 2>&1)
  rc=$?
  if [ $rc = 0 ] && grep -qx "\[1\]:run-path sub/rp.py \['--x', '1'\]" <<<"$out"; then
    ok "--run-path ${m:+$m }with a relative path runs it from the working directory"
  else
    fail "--run-path ${m:+$m }sub/rp.py: rc=$rc: $out"
  fi
done

[ $fails = 0 ]
