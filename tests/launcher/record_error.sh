#!/usr/bin/env bash
# ddprun reads the error file PyTorch's @record writes and puts its message in the summary's
# root-cause row. Usage: record_error.sh DDPRUN PYTHON. Exit 0 pass, 1 fail, 77 no torch.
set -uo pipefail
ddprun=$1 py=$2
"$py" -c 'import torch.distributed.elastic.multiprocessing.errors' 2>/dev/null || { echo "skip: no torch for $py"; exit 77; }
here=$(dirname "$0")
out=$(PYTHON_EXEC=$py timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$here/record_error.py" 2>&1)
rc=$?
if [ $rc = 1 ] && grep -E '^root .* 1 +1 +exit 1 .*ValueError: rank one could not load its shard' <<<"$out" >/dev/null; then
  echo "ok: summary shows the @record message ($("$py" -c 'import torch; print(torch.__version__)'))"
  exit 0
fi
echo "FAIL (rc=$rc):"; echo "$out"
exit 1
