# shellcheck shell=bash
# lib.sh: what bench/train's drivers (compare.sh, gpt.sh) share, sourced by them: run() runs one
# benchmark process with its output in $OUT and records the machine's other load around it.
# The sourcing script sets OUT (an existing directory) and WAIT_QUIET (seconds), and reads
# `failed` (set to 1 by a failed run) at its end.

# shellcheck disable=SC2034 # read by the sourcing script
failed=0
# Clock ticks of CPU time: the whole machine's busy and total, and this shell's reaped children.
machine_ticks() {
    local a
    read -r -a a < <(grep '^cpu ' /proc/stat)
    echo $((a[1] + a[2] + a[3] + a[6] + a[7] + a[8])) \
        $((a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7] + a[8]))
}
child_ticks() { # utime + stime of children this shell has waited for (fields 16 and 17)
    local s
    s=$(</proc/$$/stat)
    s=${s##*) }
    read -r -a f <<<"$s"
    echo $((f[13] + f[14]))
}

# Percent of the CPU that was not idle over one second (nothing of ours runs then).
busy() {
    local a b
    read -r -a a < <(machine_ticks)
    sleep 1
    read -r -a b < <(machine_ticks)
    local t=$((b[1] - a[1]))
    echo $((t > 0 ? 100 * (b[0] - a[0]) / t : 0))
}
quiet() { # busy, repeated while above 10%, for up to WAIT_QUIET seconds; prints the last
    local start=$SECONDS pct
    while :; do
        pct=$(busy)
        if [[ $pct -le 10 || $((SECONDS - start)) -ge $WAIT_QUIET ]]; then
            echo "$pct"
            return
        fi
    done
}

# run NAME CMD...: runs CMD with stdout in $OUT/NAME.out and stderr in $OUT/NAME.err, and
# appends "NAME before% other%" to busy.txt: the machine's load before, and the share of the
# machine's CPU that other processes used during the run.
run() {
    local name=$1 before m0 m1 c0 c1 rc=0
    shift
    before=$(quiet)
    echo "# $name (other processes before: $before% CPU)" >&2
    read -r -a m0 < <(machine_ticks)
    c0=$(child_ticks)
    "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" || rc=$?
    c1=$(child_ticks)
    read -r -a m1 < <(machine_ticks)
    local total=$((m1[1] - m0[1])) other=$((m1[0] - m0[0] - (c1 - c0)))
    ((other < 0)) && other=0
    echo "$name $before $((total > 0 ? 100 * other / total : 0))" >>"$OUT/busy.txt"
    if ((rc != 0)); then
        echo "${0##*/}: failed ($rc): $*" >&2
        tail -n 20 "$OUT/$name.err" >&2
        # shellcheck disable=SC2034 # read by the sourcing script
        failed=1
    fi
}
