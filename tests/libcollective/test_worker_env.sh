#!/usr/bin/env bash
# The worker programs' reading of the torchrun environment (coll_comm_init_env(), through ddp-hello
# and coll-check): a missing or malformed variable ends the program with its "bad environment" exit
# status (2 for both) and a message on stderr that names the variable; and
# ddp-hello still passes its store barrier under `ddprun --standalone --nproc-per-node 4`.
#
# Usage: test_worker_env.sh DDPRUN DDP_HELLO COLL_CHECK
# Exit: 0 pass, 1 fail, 77 skip (coreutils' timeout missing).
#
# Each bad-environment case runs under `env -i`, so nothing from the caller's environment (a
# MASTER_ADDR of an outer job, say) leaks in, and under timeout(1): none of them may reach for a
# store.
set -euo pipefail

DDPRUN=${1:?usage: test_worker_env.sh DDPRUN DDP_HELLO COLL_CHECK}
HELLO=${2:?usage: test_worker_env.sh DDPRUN DDP_HELLO COLL_CHECK}
CHECK=${3:?usage: test_worker_env.sh DDPRUN DDP_HELLO COLL_CHECK}

command -v timeout >/dev/null 2>&1 || { echo "SKIP: timeout not found"; exit 77; }
for b in "$DDPRUN" "$HELLO" "$CHECK"; do
    [[ -x $b ]] || { echo "FAIL: $b is not an executable" >&2; exit 1; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# expect STATUS WORD [VAR=VALUE...] -- PROGRAM [ARGS...]: runs PROGRAM with only those variables
# set and checks its exit status and that its stderr contains WORD.
expect() {
    local want=$1 word=$2 rc=0
    shift 2
    local vars=()
    while [[ $1 != -- ]]; do
        vars+=("$1")
        shift
    done
    shift
    timeout 20 env -i PATH="$PATH" ${vars[@]+"${vars[@]}"} "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    [[ $rc == "$want" ]] ||
        fail "exit $rc, expected $want: ${vars[*]-} $* (stderr: $(cat "$tmp/err"))"
    grep -qF -- "$word" "$tmp/err" || fail "stderr lacks '$word': ${vars[*]-} $*: $(cat "$tmp/err")"
    echo "ok: ${vars[*]-(no variables)} $(basename "$1") -> $rc, names $word"
}

good=(RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500)

for prog in hello check; do
    if [[ $prog == hello ]]; then
        cmd=("$HELLO")
        bad=2
    else
        cmd=("$CHECK" args)
        bad=2
    fi
    expect "$bad" RANK -- "${cmd[@]}"
    expect "$bad" WORLD_SIZE RANK=0 WORLD_SIZE=abc MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 -- \
        "${cmd[@]}"
    expect "$bad" MASTER_PORT RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 -- "${cmd[@]}"
    expect "$bad" WORLD_SIZE RANK=0 -- "${cmd[@]}"
    expect "$bad" MASTER_PORT "${good[@]:0:3}" MASTER_PORT=70000 -- "${cmd[@]}"
    expect "$bad" RANK RANK=2 "${good[@]:1}" -- "${cmd[@]}"
    expect "$bad" LOCAL_RANK "${good[@]}" LOCAL_RANK=x -- "${cmd[@]}"
    expect "$bad" TORCHELASTIC_RESTART_COUNT "${good[@]}" TORCHELASTIC_RESTART_COUNT=-1 -- \
        "${cmd[@]}"
done

# The happy path: four ranks on one node, each through rdzv_env_read() and rdzv_env_connect().
rc=0
timeout 60 "$DDPRUN" --standalone --nproc-per-node 4 "$HELLO" >"$tmp/out" 2>"$tmp/err" || rc=$?
[[ $rc == 0 ]] || fail "ddprun --standalone --nproc-per-node 4 ddp-hello exited $rc: $(cat "$tmp/err")"
grep -q 'ddp-hello: 4 ranks passed the barrier' "$tmp/out" ||
    fail "ddp-hello printed no barrier line: $(cat "$tmp/out")"
echo "ok: ddprun --standalone --nproc-per-node 4 ddp-hello"
echo "PASS"
