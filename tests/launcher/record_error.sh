#!/usr/bin/env bash
# ddprun reads the error file PyTorch's @record writes and puts its message in the summary's
# root-cause row, with the file's path under it. Usage: record_error.sh DDPRUN PYTHON. Exit 0 pass, 1 fail, 77 no torch.
set -uo pipefail
ddprun=$1 py=$2
"$py" -c 'import torch.distributed.elastic.multiprocessing.errors' 2>/dev/null || { echo "skip: no torch for $py"; exit 77; }
here=$(dirname "$0")
out=$(PYTHON_EXEC=$py timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$here/record_error.py" 2>&1)
rc=$?
# The row says the message. With --log-dir (the run directory is kept), under it the error
# file's path (as torchrun's error_file:), a file that holds the message.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out2=$(PYTHON_EXEC=$py timeout 120 "$ddprun" --standalone --nproc-per-node 2 --log-dir "$tmp" "$here/record_error.py" 2>&1)
rc2=$?
ef=$(sed -nE 's/^ +error_file: (.*)$/\1/p' <<<"$out2" | head -1)
if [ $rc = 1 ] && grep -E '^root .* 1 +1 +exit 1 .*ValueError: rank one could not load its shard' <<<"$out" >/dev/null &&
   ! grep -q 'error_file:' <<<"$out" && [ $rc2 = 1 ] &&
   [ -n "$ef" ] && grep -q 'rank one could not load its shard' "$ef"; then
  echo "ok: summary shows the @record message and its error file ($("$py" -c 'import torch; print(torch.__version__)'))"
  exit 0
fi
echo "FAIL (rc=$rc, $rc2):"; echo "$out"; echo "$out2"
exit 1
