#!/usr/bin/env bash
# Environment contract: ddprun gives each worker the environment torchrun gives it.
#
# Usage: env_contract.sh DDPRUN PYTHON
#
# PYTHON's torch supplies the reference torchrun: torch 1.x runs through torchrun113.py (which
# repairs torch 1.13's torchrun on Python 3.11), torch 2.x as `PYTHON -m torch.distributed.run`.
# For each case below, dump_env.py runs on every rank under torchrun and under DDPRUN with the
# same launcher options; env_compare.py then
#   - checks each launcher's dumps on their own (ranks, sizes, run id, restart count, error-file
#     layout, agent store listening; see `check` there), and
#   - compares DDPRUN's against torchrun's variable by variable. The variables allowed to differ
#     (random ports and run ids, temporary error-file paths, the variables only one torch
#     generation sets) are listed and explained at the top of env_compare.py.
# DDPRUN "none" runs the torchrun half alone (checks the reference and this test itself).
#
# Launcher options are spelled with hyphens for both; torchrun113.py maps them to 1.13's
# underscores. --monitor-interval 0.1 keeps torchrun from sleeping 5 s (1.13's default) before
# it first notices that its workers exited. Static cases pick a free port by binding port 0
# and closing it, separately for each launcher. Every launch runs under `timeout`; nothing
# synchronises by sleeping.
#
# Exit status: 0 pass, 1 fail, 77 skip (PYTHON missing or without torch.distributed).

set -uo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 DDPRUN|none PYTHON" >&2
    exit 1
fi
ddprun=$1
py=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
launch_timeout=60

# shellcheck source-path=SCRIPTDIR source=probe_torch.sh
. "$here/probe_torch.sh"
probe_torch "$py" 'd.is_available() and __import__("torch.distributed.run")'
if [[ $version == 1.* ]]; then
    torchrun=("$pyexe" "$here/torchrun113.py")
else
    torchrun=("$pyexe" -m torch.distributed.run)
fi
echo "reference: torch $version torchrun: ${torchrun[*]}"
if [[ $ddprun != none && ! -x $ddprun ]]; then
    echo "FAIL: $ddprun is not an executable" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/env_contract.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

free_port() {
    "$pyexe" -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

failed=0
fail() {
    echo "FAIL: $*"
    failed=1
}

# run_one LAUNCHER_NAME OUTDIR EXTRA_ENV LAUNCHER... -- WORKER...
# Runs one launch under timeout with EXTRA_ENV (space-separated NAME=VALUE), logs to OUTDIR.log.
run_one() {
    local name=$1 out=$2 extra=$3
    shift 3
    mkdir -p "$out"
    # shellcheck disable=SC2086  # EXTRA_ENV is a list of words
    if ! env $extra timeout -k 5 "$launch_timeout" "$@" >"$out.log" 2>&1; then
        fail "$name exited with status $? ($*)"
        tail -n 20 "$out.log" | sed 's/^/    | /'
        return 1
    fi
}

# case NAME NPROC FLAGS EXTRA_ENV ATTEMPTS MAX_RESTARTS MODE
#   FLAGS: launcher options besides --nproc-per-node (static cases get --master-port appended)
#   MODE: static | standalone;  ATTEMPTS > 1 makes attempt 0 fail (dump_env --fail-attempt 0)
#   "script" in NAME runs dump_env.py as a python script (launcher picks the interpreter,
#   PYTHON's directory first on PATH) instead of --no-python PYTHON dump_env.py
run_case() {
    local name=$1 nproc=$2 flags=$3 extra=$4 attempts=$5 restarts=$6 mode=$7
    local -a worker cmp_args
    local ref_port="" test_port="" ref_flags=$flags test_flags=$flags
    if [[ $mode == static ]]; then
        ref_port=$(free_port)
        test_port=$(free_port)
        ref_flags+=" --master-port $ref_port"
        test_flags+=" --master-port $test_port"
    fi
    cmp_args=(--nproc "$nproc" --attempts "$attempts" --max-restarts "$restarts")
    [[ $mode == standalone ]] && cmp_args+=(--standalone)
    local wextra=()
    ((attempts > 1)) && wextra=(--fail-attempt 0)
    if [[ $name == *script* ]]; then
        extra+=" PATH=$(dirname "$pyexe"):$PATH"
        worker=("$here/dump_env.py")
    else
        worker=(--no-python "$pyexe" "$here/dump_env.py")
    fi
    local ref=$tmp/$name/torchrun test=$tmp/$name/ddprun
    echo "--- $name: --nproc-per-node $nproc $flags ${extra:+(env $extra)}"
    # shellcheck disable=SC2086
    run_one "torchrun $name" "$ref" "$extra" "${torchrun[@]}" --monitor-interval 0.1 \
        --nproc-per-node "$nproc" $ref_flags "${worker[@]}" "$ref" "${wextra[@]}" || return
    # shellcheck disable=SC2086
    env $extra "$pyexe" "$here/env_compare.py" check "$ref" "${cmp_args[@]}" ${ref_port:+--port $ref_port} \
        --label "torchrun $name" || fail "torchrun $name: check"
    [[ $ddprun == none ]] && return
    # shellcheck disable=SC2086
    run_one "ddprun $name" "$test" "$extra" "$ddprun" --monitor-interval 0.1 \
        --nproc-per-node "$nproc" $test_flags "${worker[@]}" "$test" "${wextra[@]}" || return
    # shellcheck disable=SC2086
    env $extra "$pyexe" "$here/env_compare.py" check "$test" "${cmp_args[@]}" ${test_port:+--port $test_port} \
        --label "ddprun $name" || fail "ddprun $name: check"
    # shellcheck disable=SC2086
    env $extra "$pyexe" "$here/env_compare.py" compare "$ref" "$test" "${cmp_args[@]}" \
        ${ref_port:+--ref-port $ref_port --test-port $test_port} --label "$name" ||
        fail "$name: ddprun's environment differs from torchrun's"
}

static="--nnodes 1 --node-rank 0 --master-addr 127.0.0.1"
#        name               nproc flags                 extra env  attempts restarts mode
run_case static-n1          1     "$static"             ""         1 0 static
run_case static-n2          2     "$static"             ""         1 0 static
run_case static-n4          4     "$static"             ""         1 0 static
run_case standalone-n1      1     "--standalone"        ""         1 0 standalone
run_case standalone-n2      2     "--standalone"        ""         1 0 standalone
run_case standalone-n4      4     "--standalone"        ""         1 0 standalone
# all ranks fail on attempt 0 after dumping, so both attempts have a dump from every rank
run_case restart-n2         2     "--standalone --max-restarts 1" "" 2 1 standalone
# the caller's settings win over the launcher's defaults; --role names the role
run_case user-env-n2        2     "--standalone --role trainer" \
    "OMP_NUM_THREADS=3 NCCL_ASYNC_ERROR_HANDLING=0 TORCH_NCCL_ASYNC_ERROR_HANDLING=0 ENV_CONTRACT_MARK=x" 1 0 standalone
# only the deprecated name set: it reaches the workers as the caller's, untouched, and the
# current name still gets the launcher's default (env_compare.py's DEPRECATED)
run_case user-deprecated-n2 2    "--standalone"        "NCCL_ASYNC_ERROR_HANDLING=0" 1 0 standalone
run_case script-n2          2     "$static"             ""         1 0 static

if ((failed)); then
    echo "env_contract: FAIL (torch $version)"
    exit 1
fi
echo "env_contract: PASS (torch $version${ddprun/#none/, torchrun only})"
exit 0
