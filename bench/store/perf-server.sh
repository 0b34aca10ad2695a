#!/bin/sh
# perf-server.sh: runs a store server under perf for store-bench, as its --server (or
# --python-modern / --python-legacy) program. perf attaches to this process and the server is
# exec'd in its place, so the server keeps the pid store-bench spawned: its CPU rows stay right
# and perf's own work is not counted in them. perf starts with its events off and the server
# starts once perf acknowledges turning them on (its control FIFOs), so no request is missed.
#
#   PERF_PROG   the program to run (default: ddp-rendezvous of the build tree next to store-bench)
#   PERF_MODE   record (perf record -g, the default) or stat (system calls and context switches)
#   PERF_OUT    perf's output file (default: perf-server.<mode>.<pid> in $TMPDIR or /tmp)
#   PERF_FLAGS  more options for perf
#
# Example (see bench/README.md, Profiling the server):
#   PERF_PROG=build/rendezvous/ddp-rendezvous build/bench/store-bench --only ours \
#       --protocol modern --rows rate32 --server bench/store/perf-server.sh
set -eu
mode=${PERF_MODE:-record}
dir=${TMPDIR:-/tmp}
prog=${PERF_PROG:-$(dirname "$0")/../../rendezvous/ddp-rendezvous}
out=${PERF_OUT:-$dir/perf-server.$mode.$$}
ctl=$dir/perf-server.ctl.$$
ack=$dir/perf-server.ack.$$
mkfifo "$ctl" "$ack"
if [ "$mode" = stat ]; then
    perf stat -e 'raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl,context-switches,task-clock' \
        -D -1 --control "fifo:$ctl,$ack" -o "$out" ${PERF_FLAGS:-} -p $$ >/dev/null 2>&1 &
else
    perf record -g -D -1 --control "fifo:$ctl,$ack" -o "$out" ${PERF_FLAGS:-} -p $$ >/dev/null 2>&1 &
fi
echo enable >"$ctl"
read -r _ <"$ack"
rm -f "$ctl" "$ack"
exec "$prog" "$@"
