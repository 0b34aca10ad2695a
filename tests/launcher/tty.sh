#!/usr/bin/env bash
# Worker terminals (ddprun(1), OUTPUT, "On a terminal"; --tty):
#   1. under script(1), each worker's stdout and stderr are terminals (of ddprun's size, narrowed
#      by the prefix "[0]:" and one column), and neither is its controlling terminal;
#   2. with ddprun's output a file, or --tty off on a terminal, workers write to pipes; --tty on
#      (and PET_TTY=on) gives them terminals even into a file;
#   3. a C worker's two printf() lines before abort() reach the console (0 lines with --tty off:
#      stdio's buffer dies with the process);
#   4. in tmux, two ranks redrawing progress bars with "\r" (20 redraws each, with colour) show
#      two live lines, one per rank, rewritten in place, then completed above later lines; the
#      console's byte stream has a handful of newlines, not one per redraw, and no empty
#      prefixed line; --tee's log files get each line's final state, without escape sequences;
#   5. in tmux, resizing ddprun's terminal resizes the workers' and sends them SIGWINCH;
#   6. the README's main command (ddp-train on 2 ranks, 6 steps) under script(1): rank 0's
#      progress bar, prefixed, drawn as a live line and never ended as a line of its own;
#   7. a terminal's output is complete at its end (46000 lines a run, ten runs).
# Waits are bounded polls on files and on tmux's screen.
# Usage: tty.sh DDPRUN PRINT_ABORT [DDP_TRAIN]. Exit 0 pass, 1 fail, 77 skipped (no script(1);
# with script(1) but no tmux, 1-3 and 6 run and then 77). 6 needs DDP_TRAIN and Fashion-MNIST.
set -uo pipefail
ddprun=$1
print_abort=$2
train=${3:-}
. "$(dirname "$0")/lib.sh"
command -v script >/dev/null || { echo "SKIP: script (util-linux) not found"; exit 77; }

# Runs a command on a fresh 100x30 pseudo-terminal of script(1); its output, lines ending \r\n.
# script(1) runs the command with $SHELL, which may be dash: printf %q's quoting is bash's.
tty_run() {
  SHELL=$BASH timeout 60 script -qfec "stty cols 100 rows 30; $(printf '%q ' "$@")" /dev/null \
    </dev/null
}
has() { tr -d '\r' <"$1" | grep -qxF -- "$2"; }

# 1. Terminals, of the terminal's size less "[0]:" and a column; no controlling terminal
#    (field 7 of /proc/PID/stat, tty_nr, is 0).
tty_run "$ddprun" --standalone --nproc-per-node 2 --no-python sh -c \
  'test -t 1 && echo "out tty $RANK"; test -t 2 && echo "err tty $RANK" >&2
   exec 3>&1; echo "size $RANK $(stty size <&3) $(stty size <&2)"
   echo "ctty $RANK $(cut -d" " -f7 /proc/$$/stat)"' >"$tmp/o1"
rc=$?
if [ $rc = 0 ] && has "$tmp/o1" "[0]:out tty 0" && has "$tmp/o1" "[1]:out tty 1" &&
   has "$tmp/o1" "[0]:err tty 0" && has "$tmp/o1" "[1]:err tty 1" &&
   has "$tmp/o1" "[0]:size 0 30 95 30 95" && has "$tmp/o1" "[1]:ctty 1 0"; then
  ok "workers' stdout and stderr are terminals of 30x95, not controlling ones"
else
  fail "terminals: rc $rc; $(cat -A "$tmp/o1")"
fi

# 2. Pipes when ddprun's output is not a terminal, and with --tty off; --tty on forces terminals.
probe='test -t 1 && echo "out tty" || echo "out pipe"; test -t 2 && echo "err tty" >&2 || echo "err pipe" >&2'
timeout 30 "$ddprun" --standalone --nproc-per-node 2 --no-python sh -c "$probe" >"$tmp/o2" 2>&1
rc=$?
tty_run "$ddprun" --standalone --nproc-per-node 1 --tty off --no-python sh -c "$probe" >"$tmp/o2b"
rc_b=$?
PET_TTY=on timeout 30 "$ddprun" --standalone --nproc-per-node 1 --no-python sh -c "$probe" \
  >"$tmp/o2c" 2>&1
rc_c=$?
if [ $rc = 0 ] && has "$tmp/o2" "[1]:out pipe" && has "$tmp/o2" "[0]:err pipe" &&
   ! grep -q tty "$tmp/o2" && [ $rc_b = 0 ] && has "$tmp/o2b" "[0]:out pipe" &&
   has "$tmp/o2b" "[0]:err pipe" && [ $rc_c = 0 ] && has "$tmp/o2c" "[0]:out tty" &&
   has "$tmp/o2c" "[0]:err tty"; then
  ok "pipes into a file and with --tty off; PET_TTY=on gives terminals into a file"
else
  fail "pipes: rc $rc $rc_b $rc_c; $(cat "$tmp/o2"); $(cat -A "$tmp/o2b"); $(cat "$tmp/o2c")"
fi

# 3. printf() then abort(): on a terminal stdio writes each line at its newline.
tty_run "$ddprun" --standalone --nproc-per-node 1 --no-python "$print_abort" >"$tmp/o3"
tty_run "$ddprun" --standalone --nproc-per-node 1 --tty off --no-python "$print_abort" >"$tmp/o3b"
n=$(grep -c 'before abort' "$tmp/o3")
n_off=$(grep -c 'before abort' "$tmp/o3b")
if has "$tmp/o3" "[0]:line 1 before abort" && has "$tmp/o3" "[0]:line 2 before abort" &&
   grep -q "signal 6 (ABRT)" "$tmp/o3" && [ "$n_off" = 0 ]; then
  ok "printf before abort(): $n lines reach the console ($n_off with --tty off)"
else
  fail "printf before abort(): $(cat -A "$tmp/o3"); --tty off: $(cat -A "$tmp/o3b")"
fi

# 7. Nothing is lost at the end of a terminal's output: its last close comes with the rest of the
#    output still waiting in the terminal (read until EIO, not to the first short read). Ten
#    runs of two ranks writing 20000 lines to stdout and 3000 to stderr, with --tty on into a
#    file.
lost=0
for run in 1 2 3 4 5 6 7 8 9 10; do
  timeout 60 "$ddprun" --standalone --nproc-per-node 2 --tty on --no-python sh -c \
    'seq 1 20000; seq 1 3000 >&2' >"$tmp/o7" 2>&1
  n=$(grep -cE '^\[[01]\]:[0-9]+$' "$tmp/o7")
  [ "$n" = 46000 ] && grep -qx '\[1\]:20000' "$tmp/o7" || { lost=$((lost + 1)); echo "run $run: $n lines"; }
done
if [ $lost = 0 ]; then
  ok "terminals' output complete at their end: 10 runs of 46000 lines"
else
  fail "terminals' output cut at their end in $lost runs of 10"
fi

# 6. ddp-train's bar: "[0]:[########................] step 2/6 epoch 1/1 loss ... ETA 0m01s" and
#    its "\e[K", rewritten in place until the epoch's line replaces it.
if [ -n "$train" ] && [ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  tty_run "$ddprun" --standalone --nproc-per-node 2 "$train" --device cpu --max-steps 6 \
    --log-every 2 >"$tmp/o6"
  rc=$?
  esc=$'\033'
  bar="\[0\]:\[[#.]{24}\] step [246]/6 epoch 1/1 loss [0-9.]+ [0-9]+ samples/s ETA [0-9]+m[0-9]{2}s$esc\[K"
  if [ $rc = 0 ] && grep -aEq "$bar" "$tmp/o6" && ! grep -aEq "$bar"$'\r*$' "$tmp/o6" &&
     ! grep -aEq '\[1\]:.*step [0-9]' "$tmp/o6" && ! grep -aq '| epoch' "$tmp/o6" &&
     grep -aq "\[0\]:$esc\[Kepoch 1/1 (step 6): test loss" "$tmp/o6"; then
    ok "ddp-train under ddprun on a terminal: rank 0's bar is a live line ($(grep -aEo "$bar" "$tmp/o6" | wc -l) drawn)"
  else
    fail "ddp-train's bar: rc $rc; $(cat -A "$tmp/o6")"
  fi
else
  echo "skip: ddp-train's bar (no DDP_TRAIN or no Fashion-MNIST)"
fi

if ! command -v tmux >/dev/null; then
  echo "SKIP: tmux not found: the live lines and SIGWINCH are not checked"
  [ $fails = 0 ] && exit 77 || exit 1
fi
tmx() { tmux -S "$tmp/tmux.sock" "$@"; }
cleanup_hook() { tmx kill-server 2>/dev/null; }
screen() { tmx capture-pane -p -t t | sed -e 's/ *$//' -e '/^$/d'; }
screen_has() { screen | grep -qxF -- "$1"; }

# 4. Two ranks' bars. Each rank prints a line, redraws its bar 20 times (paced, so that the
#    redraws reach ddprun one by one), says it is done and waits for the test (which looks at
#    the screen while both bars are live), then ends the bar and prints a last line.
cat >"$tmp/bar.sh" <<'EOF'
T=$1
printf 'start %s\n' "$RANK"
i=1
while [ $i -le 20 ]; do
  printf '\rbar %s %s/20 \033[32m%s\033[0m' "$RANK" $i "$(printf "%${i}s" | tr ' ' '#')"
  i=$((i + 1))
  sleep 0.06
done
touch "$T/live.$RANK"
n=0
until [ -e "$T/go" ] || [ $n -ge 400 ]; do sleep 0.05; n=$((n + 1)); done
printf '\n'
printf 'end %s\n' "$RANK"
EOF
hashes=$(printf '%20s' | tr ' ' '#')
tmx new-session -d -s t -x 100 -y 30 \
  "script -qfc '$ddprun --standalone --nproc-per-node 2 --tee 3 --log-dir $tmp/logs --no-python sh $tmp/bar.sh $tmp' $tmp/raw; touch $tmp/finished; sleep 600"
live=0
wait_for 60 sh -c "[ -e $tmp/live.0 ] && [ -e $tmp/live.1 ]" &&
  wait_for 10 screen_has "[0]:bar 0 20/20 $hashes" && wait_for 10 screen_has "[1]:bar 1 20/20 $hashes" &&
  live=1
screen >"$tmp/s4.live"
touch "$tmp/go"
wait_for 30 test -e "$tmp/finished" || fail "bars: the run did not finish"
wait_for 10 screen_has "[1]:end 1"
screen >"$tmp/s4.end"
# The byte stream, without script's header and footer.
grep -av '^Script ' "$tmp/raw" >"$tmp/raw4"
nl=$(tr -cd '\n' <"$tmp/raw4" | wc -c)
d0=$(ls -d "$tmp"/logs/*/attempt_0/0)
d1=$(ls -d "$tmp"/logs/*/attempt_0/1)
clean=$(printf 'start 0\nbar 0 20/20 %s\nend 0\n' "$hashes")
if [ $live = 1 ] && [ "$(grep -c '^\[.\]:bar' "$tmp/s4.live")" = 2 ] &&
   [ "$(tail -n 2 "$tmp/s4.live" | grep -c '^\[.\]:bar . 20/20')" = 2 ] &&
   [ "$(grep -c ':bar' "$tmp/s4.end")" = 2 ] && grep -qx '\[0\]:end 0' "$tmp/s4.end" &&
   [ "$nl" -le 12 ] && ! grep -aqE '\[[01]\]:(\r|$)' "$tmp/raw4" &&
   grep -aq "bar 0 20/20 "$'\033\\[32m' "$tmp/raw4" &&
   [ "$(cat "$d0/stdout.log")" = "$clean" ] && grep -qx "bar 1 20/20 $hashes" "$d1/stdout.log" &&
   ! grep -q $'[\r\033]' "$d0/stdout.log" "$d1/stdout.log"; then
  ok "two bars, 20 redraws each: two live lines rewritten in place ($nl newlines on the console in all), clean log files"
else
  fail "bars: live $live, $nl newlines; live screen:
$(cat "$tmp/s4.live")
final screen:
$(cat "$tmp/s4.end")
log: $(cat -A "$d0/stdout.log")
console: $(cat -A "$tmp/raw4" | head -c 3000)"
fi
# Session t stays (killing the last session ends the server, which a new session could race).

# 5. SIGWINCH: the worker reports its size, then waits for SIGWINCH (a trap) and reports again.
cat >"$tmp/winch.sh" <<'EOF'
T=$1
got=0
trap 'got=1' WINCH
exec 3>&1
echo "size $(stty size <&3)"
touch "$T/ready"
n=0
until [ $got = 1 ] || [ $n -ge 400 ]; do sleep 0.05; n=$((n + 1)); done
echo "winch $got $(stty size <&3)"
EOF
rm -f "$tmp/finished"
tmx new-session -d -s w -x 100 -y 30 \
  "$ddprun --standalone --nproc-per-node 1 --no-python sh $tmp/winch.sh $tmp; touch $tmp/finished; sleep 600"
wait_for 30 test -e "$tmp/ready"
wait_for 10 sh -c "tmux -S $tmp/tmux.sock capture-pane -p -t w | grep -q 'size 30 95'"
tmx resize-window -t w -x 90 -y 25
wait_for 30 test -e "$tmp/finished"
if tmx capture-pane -p -t w | grep -qx '\[0\]:winch 1 25 85 *'; then
  ok "SIGWINCH: the worker's terminal went from 30x95 to 25x85, and it was told"
else
  fail "SIGWINCH: $(tmx capture-pane -p -t w)"
fi

[ $fails = 0 ]
