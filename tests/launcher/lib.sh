# Shared preamble of the launcher shell tests, which other rooms' shell tests source too
# (tests/libddp/lib.sh, tests/trainer/, tests/tools/, tests/test_nccl_floor.sh); source it after
# setting -uo pipefail. Gives a temporary directory $tmp, an array pids of processes to SIGKILL
# at exit, fail/ok reporting (failures counted in $fails) and wait_for SECONDS COMMAND..., which
# polls until COMMAND succeeds, expect CODE PATTERN COMMAND... and now_ms (the wall clock in
# milliseconds).
# A test with more to undo at exit defines cleanup_hook, which the exit trap runs after killing
# the pids and before removing $tmp.
tmp=$(mktemp -d)
pids=()
main=$BASHPID
cleanup() { # bash runs the EXIT trap in subshells too: only the main shell cleans up
  [ "$BASHPID" = "$main" ] || return 0
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if declare -F cleanup_hook >/dev/null; then cleanup_hook; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# expect CODE PATTERN CMD...: CMD exits with CODE and its output (both streams) matches PATTERN,
# within $expect_timeout seconds (60 unless the test sets it).
expect() {
    local want=$1 pattern=$2 status=0
    shift 2
    timeout "${expect_timeout:-60}" "$@" >"$tmp/out" 2>&1 || status=$?
    if [[ $status -ne $want ]] || ! grep -qE -- "$pattern" "$tmp/out"; then
        fail "$(basename "$1") ${*:2}: exit $status (expected $want), output lacks '$pattern':"
        sed 's/^/    /' "$tmp/out" >&2
        return 1
    fi
    ok "$(basename "$1") ${*:2} -> $want: $(grep -m1 -E -- "$pattern" "$tmp/out")"
}

now_ms() { echo $(($(date +%s%N) / 1000000)); } # the wall clock, in milliseconds

wait_for() { # seconds command...: polls until the command succeeds
  local end=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -ge $end ] && return 1
    sleep 0.05
  done
}

# ddprun's children are its workers' guards (named ddp-guard) and, where the workers run in a PID
# namespace, that namespace's init (ddp-init). The guards of ddprun PID:
guards_of() { pgrep -P "$1" -x ddp-guard; }
# The workers named NAME of ddprun PID: the children of its guards.
workers_of() { local g; for g in $(guards_of "$1"); do pgrep -P "$g" -x "$2"; done; }
. "$(dirname "${BASH_SOURCE[0]}")/marked.sh" # marked NAME=VALUE
