#!/usr/bin/env bash
# ddp-train's progress bar: with standard error a terminal (a pseudo-terminal from script(1) of
# util-linux), rank 0 rewrites one bar in place (ddp-train(1), OUTPUT) instead of writing a line
# per report. Six steps alone, a report every two: the bars of steps 2, 4 and 6 on one line,
# each with its fill, step, epoch, loss, samples/s and ETA, then the epoch's line clearing it.
# Usage: test_ddp_train_tty.sh DDP_TRAIN
# Exit: 0 pass, 1 fail, 77 skipped (no script(1), or Fashion-MNIST is not installed).
set -uo pipefail

TRAIN=${1:?usage: test_ddp_train_tty.sh DDP_TRAIN}
DATA=/usr/share/datasets/fashion-mnist
command -v script >/dev/null || { echo "SKIP: script (util-linux) not found"; exit 77; }
if [[ ! -r $DATA/train-images-idx3-ubyte.gz ]]; then
    echo "SKIP: $DATA (Debian's dataset-fashion-mnist) is not installed"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
    echo "FAIL: $*" >&2
    fails=$((fails + 1))
}

# script -e: its exit status is the command's; -c runs the command on the pseudo-terminal, whose
# output (stdout and stderr alike, lines ending \r\n) comes out on script's standard output.
cmd=$(printf '%q ' "$TRAIN" --max-steps 6 --log-every 2)
timeout 60 script -qec "$cmd" /dev/null </dev/null >"$tmp/out"
st=$?
[[ $st -eq 0 ]] || fail "ddp-train under script exited $st"

esc=$'\033' cr=$'\r'
num='[0-9]+' rest="epoch 1/1 loss [0-9]+\.[0-9]{4} [0-9]+ samples/s ETA [0-9]+m[0-9]{2}s"
# The three bars in turn on one line: each starts with \r, ends by clearing the line's rest.
bars="${cr}\[#{8}\.{16}\] step 2/6 $rest$esc\[K"
bars+="${cr}\[#{16}\.{8}\] step 4/6 $rest$esc\[K"
bars+="${cr}\[#{24}\] step 6/6 $rest$esc\[K"
grep -Eq -- "$bars$cr${esc}\[Kepoch 1/1 \(step 6\): test loss $num\.$num, test accuracy" \
    "$tmp/out" || fail "no bars for steps 2, 4 and 6 rewritten in place, then the epoch's line"
# Not the line format of a pipe or file.
grep -Eq '\| (epoch|norm) ' "$tmp/out" && fail "report lines written to a terminal"
grep -q "test accuracy .* after 6 steps" "$tmp/out" || fail "no summary after 6 steps"

if [[ $fails -ne 0 ]]; then
    echo "FAIL: $fails check(s); the terminal's output (cat -A):" >&2
    cat -A "$tmp/out" >&2
    exit 1
fi
tr '\r' '\n' <"$tmp/out" | grep -m1 'step 6/6' | sed "s/$esc\[K//"
echo "PASS"
