#!/usr/bin/env bash
# One usage exit status across the project's programs: each given program, run with an option
# it does not know, exits 2 (as ddprun(1), ddp-rendezvous(1), ddp-train(1), ddp-ckpt(1) and
# coll-bench(1) document under EXIT STATUS) and says on standard error which option it was.
# Programs with commands (ddp-rendezvous, ddp-ckpt) are also given the option after a command.
#
# Usage: test_usage_exit.sh PROGRAM...
# Exit: 0 pass, 1 fail. Each run is bounded by timeout(1), under `env -i` (a worker program
# must refuse the option before it reads the environment) with standard input closed.
set -uo pipefail
[[ $# -gt 0 ]] || { echo "usage: $0 PROGRAM..." >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flag=--bogus-flag-xyz
fails=0

check() { # PROGRAM ARGS...
    local rc=0
    timeout 20 env -i PATH="$PATH" "$@" </dev/null >"$tmp/out" 2>"$tmp/err" || rc=$?
    if [[ $rc -ne 2 ]]; then
        echo "FAIL: $(basename "$1") ${*:2}: exit $rc, want 2"
        sed 's/^/    | /' "$tmp/err" | head -5
        fails=$((fails + 1))
    elif ! grep -qF -- "$flag" "$tmp/err"; then
        echo "FAIL: $(basename "$1") ${*:2}: exit 2, but standard error does not name $flag:"
        sed 's/^/    | /' "$tmp/err" | head -5
        fails=$((fails + 1))
    else
        echo "ok: $(basename "$1") ${*:2}: exit 2, $(grep -m1 -F -- "$flag" "$tmp/err")"
    fi
}

for prog in "$@"; do
    check "$prog" "$flag"
    case $(basename "$prog") in
    ddp-rendezvous) check "$prog" serve "$flag" ;;
    ddp-ckpt) check "$prog" verify "$flag" ;;
    esac
done
[[ $fails -eq 0 ]] || { echo "$fails program(s) without the usage exit status 2"; exit 1; }
echo "PASS: $# programs exit 2 naming an unknown option"
