#!/usr/bin/env bash
# DDP under a launcher: ddp_gloo.py on 4 ranks must print "DDP OK rank R" for R = 0..3.
#
# Usage: run_ddp.sh DDPRUN|torchrun PYTHON [NPROC]
#
# DDPRUN runs the script with PYTHON (PYTHON_EXEC, which ddprun and torchrun both honour);
# "torchrun" runs PYTHON's own torchrun instead (torchrun113.py for torch 1.x) as a reference.
# Bounded by `timeout`. Exit status: 0 pass, 1 fail, 77 skip (PYTHON missing or without torch).
set -uo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 DDPRUN|torchrun PYTHON [NPROC]" >&2
    exit 1
fi
launcher=$1
py=$2
nproc=${3:-4}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# shellcheck source-path=SCRIPTDIR source=probe_torch.sh
. "$here/probe_torch.sh"
probe_torch "$py" 'd.is_available() and d.is_gloo_available()'
if [[ $launcher == torchrun ]]; then
    if [[ $version == 1.* ]]; then
        cmd=("$pyexe" "$here/torchrun113.py" --monitor-interval 0.1)
    else
        cmd=("$pyexe" -m torch.distributed.run --monitor-interval 0.1)
    fi
elif [[ -x $launcher ]]; then
    cmd=("$launcher")
else
    echo "FAIL: $launcher is not an executable" >&2
    exit 1
fi

out=$(mktemp "${TMPDIR:-/tmp}/run_ddp.XXXXXX")
trap 'rm -f "$out"' EXIT
# run: one launch; sets rc and ok (the distinct ranks that reported; lines may carry a "[R]:"
# prefix, ddprun's default and torchrun's with --tee, and two unprefixed lines can run together).
run() {
    echo "torch $version: ${cmd[*]} --nproc-per-node $nproc ddp_gloo.py"
    PYTHON_EXEC=$pyexe timeout -k 5 120 "${cmd[@]}" --nproc-per-node "$nproc" "$here/ddp_gloo.py" \
        >"$out" 2>&1
    rc=$?
    grep -a "DDP" "$out" || true
    ok=$(grep -aoE "DDP OK rank [0-9]+" "$out" | sort -u | wc -l)
}
run
if ((rc != 0 || ok != nproc)); then
    echo "FAIL: exit status $rc, $ok of $nproc ranks reported DDP OK"
    tail -n 30 "$out" | sed 's/^/    | /'
    exit 1
fi
echo "PASS"
