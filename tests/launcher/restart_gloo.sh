#!/usr/bin/env bash
# A gloo job whose rank 1 fails after init on the first attempt; with --max-restarts 1 the second
# attempt forms a new process group on the same launcher store (the failed attempt's keys are
# cleared in between) and succeeds. Usage: restart_gloo.sh DDPRUN PYTHON. 0 pass, 1 fail, 77 skip.
set -uo pipefail
ddprun=$1 py=$2
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "skip: no torch for $py"; exit 77; }
here=$(dirname "$0")
out=$(PYTHON_EXEC=$py timeout 150 "$ddprun" --standalone --nproc-per-node 2 --max-restarts 1 \
      --shutdown-timeout 2 "$here/restart_gloo.py" 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q 'restart OK rank 0 attempt 1' <<<"$out" && grep -q 'restart OK rank 1 attempt 1' <<<"$out"; then
  echo "ok: restarted gloo job passed on attempt 1"
  exit 0
fi
echo "FAIL (rc=$rc):"; echo "$out"
exit 1
