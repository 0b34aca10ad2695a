#!/usr/bin/env bash
# ddp-train's progress bar: with standard error a terminal (a pseudo-terminal from script(1) of
# util-linux), rank 0 rewrites one bar in place (ddp-train(1), OUTPUT) instead of writing a line
# per report. Six steps alone on the host, a report every two: the bars of steps 2, 4 and 6 on
# one line, each with its fill, step, epoch, loss, samples/s and ETA, then the epoch's line
# clearing it.
# Usage: test_ddp_train_tty.sh DDP_TRAIN
# Exit: 0 pass, 1 fail, 77 skipped (no script(1), or Fashion-MNIST is not installed).
set -uo pipefail

TRAIN=${1:?usage: test_ddp_train_tty.sh DDP_TRAIN}
command -v script >/dev/null || { echo "SKIP: script (util-linux) not found"; exit 77; }
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] ||
    { echo "SKIP: Fashion-MNIST (Debian's dataset-fashion-mnist) is not installed"; exit 77; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
bad() {
    echo "FAIL: $*; the terminal's output (cat -A):" >&2
    cat -A "$out" >&2
    exit 1
}

# script -e: its exit status is the command's; -c runs the command on the pseudo-terminal, whose
# output (stdout and stderr alike, lines ending \r\n) comes out on script's standard output. It
# runs the command with $SHELL, which may be dash: printf %q's quoting is bash's.
SHELL=$BASH timeout 60 script -qec "$(printf '%q ' "$TRAIN" --device cpu --max-steps 6 --log-every 2)" /dev/null \
    </dev/null >"$out"
st=$?
[[ $st -eq 0 ]] || bad "ddp-train under script exited $st"

esc=$'\033' cr=$'\r'
rest="epoch 1/1 loss [0-9]+\.[0-9]{4} [0-9]+ samples/s ETA [0-9]+m[0-9]{2}s$esc\[K"
# The three bars in turn on one line: each starts with \r and ends by clearing the line's rest.
bars="$cr\[#{8}\.{16}\] step 2/6 $rest$cr\[#{16}\.{8}\] step 4/6 $rest$cr\[#{24}\] step 6/6 $rest"
grep -Eq -- "$bars$cr$esc\[Kepoch 1/1 \(step 6\): test loss [0-9.]+, test accuracy" "$out" ||
    bad "no bars for steps 2, 4 and 6 rewritten in place, then the epoch's line"
# Not the line format of a pipe or a file.
! grep -Eq '\| (epoch|norm) ' "$out" || bad "report lines written to a terminal"
grep -q "test accuracy .* after 6 steps" "$out" || bad "no summary after 6 steps"
tr '\r' '\n' <"$out" | grep -m1 'step 6/6' | sed "s/$esc\[K//"
echo "PASS"
