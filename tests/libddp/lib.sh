# Shared preamble of the shell tests of libddp and of the trainer (tests/libddp/*.sh,
# tests/trainer/*.sh); source it after set -uo pipefail.
# It sources tests/launcher/lib.sh ($tmp, pids to SIGKILL at exit, fail/ok counting $fails,
# wait_for) and adds:
#   need_data            skip (77) without Debian's dataset-fashion-mnist
#   need_python          skip (77) without python3
#   need_cuda_trainer T  skip (77) unless ddp-train T trains on a GPU; prints its first line
#   accuracy NAME        the last test accuracy (a number of %) printed in $tmp/NAME.log
#   finish               exit 1 naming the failed checks, or print PASS and exit 0
#   ckpt_check S N DIR [ARGS...]  ddp-ckpt-check ($CHECK) scenario S on N ranks under $DDPRUN,
#                        DIR created, bounded by 180 s: a failure unless every rank passes;
#                        prints rank 0's "S ..." summary lines
# shellcheck source=../launcher/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../launcher/lib.sh"

DATA=/usr/share/datasets/fashion-mnist
need_data() {
    [[ -r $DATA/train-images-idx3-ubyte.gz ]] || { echo "SKIP: $DATA is not installed"; exit 77; }
}
need_python() {
    command -v python3 >/dev/null || { echo "SKIP: python3 not found"; exit 77; }
}
need_cuda_trainer() {
    if ! timeout 120 "$1" --device cuda --max-steps 1 --hidden 16 >/dev/null 2>"$tmp/probe"; then
        if grep -q -- "--device cuda: " "$tmp/probe"; then
            echo "SKIP: $(head -1 "$tmp/probe")"
            exit 77
        fi
        echo "FAIL: ddp-train --device cuda --max-steps 1:" >&2
        cat "$tmp/probe" >&2
        exit 1
    fi
    head -1 "$tmp/probe" | sed 's/^/  /'
}
accuracy() { grep -o 'test accuracy [0-9.]*%' "$tmp/$1.log" | tail -1 | grep -o '[0-9.]*'; }
ckpt_check() {
    local scen=$1 n=$2 out
    shift 2
    mkdir -p "$1"
    out=$(timeout 180 "$DDPRUN" --standalone --nproc-per-node "$n" "$CHECK" "$scen" "$@" 2>&1)
    if [[ $(grep -c "ddp-ckpt-check: rank [0-9]*/$n $scen: PASS" <<<"$out") -ne $n ]]; then
        fail "ddp-ckpt-check $scen on $n ranks"
        sed 's/^/    /' <<<"$out" >&2
    fi
    grep -E "^\[0\]:ddp-ckpt-check: $scen[: ]" <<<"$out" | sed 's/^\[0\]:/  /'
}
finish() {
    if [[ $fails -ne 0 ]]; then
        echo "FAIL: $fails check(s)"
        exit 1
    fi
    echo PASS
    exit 0
}
