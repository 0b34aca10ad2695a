#!/usr/bin/env bash
# The store's admission of connections (issue 20, points 1 and 2): the other-user rule fails
# closed, and strangers cannot take the job's connection slots.
#
#  1. Another local user (nobody, through setpriv) whose socket the kernel's exact-match owner
#     query cannot see, in four cases: bound to a device (SO_BINDTODEVICE, "--dev lo"; IPv4 and
#     ::1), from ::1, from a scoped IPv6 link-local address (fe80::b%v1, on a veth pair made
#     here), and arriving when the store has no descriptor left but one (EMFILE). Each case runs
#     against each store: ddp-rendezvous serve with and without --token-file, a tokened one-node
#     ddprun job (its own secret) and a token-less two-node job (where it also forges the
#     round's failure record). Each connection is refused (PING, LIST_KEYS unanswered), logged
#     and counted (security.refused_user), while the owner's connection the same way is served
#     (but under EMFILE); the jobs exit 0. With the kernel unable to answer (no_netlink.so makes
#     socket(AF_NETLINK) fail), serve refuses every connection from this host, the owner's too:
#     the rule fails closed.
#  2. Strangers from a third network namespace: a persistent flood (every closed connection
#     reopened) against serve --token-file --max-connections 60, while a node joins and works
#     (once with the defaults, once with every slot open to strangers); then the issue's 20,000
#     idle sockets against a tokened two-node job whose store has `ulimit -n 300`, while the
#     job restarts: both nodes exit 0.
#
# Synchronisation is by FIFOs and bounded polls of a condition (ss(8), the status JSON, the
# log), never by sleeping; every wait is bounded by timeout(1).
# Usage: test_admission.sh DDPRUN DDP_RENDEZVOUS COLL_CHECK [NO_NETLINK_SO]. Exit 0 pass, 1 fail,
# 77 skip.
set -uo pipefail
ddprun=$(readlink -f "$1")
rdzv=$(readlink -f "$2")
check=$(readlink -f "$3")
no_netlink=$([ -n "${4:-}" ] && readlink -f "$4")
here=$(dirname "$(readlink -f "$0")")
peer="$here/admission_peer.py"
. "$here/../netns_lib.sh"
netns_test_begin
for tool in timeout setpriv python3 ss prlimit; do
  command -v $tool >/dev/null || { echo "skip: no $tool"; exit 77; }
done
id nobody >/dev/null 2>&1 || { echo "skip: no user nobody"; exit 77; }
nob=$(id -u nobody)

as_nobody() { timeout 20 setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
# A python3 that nobody may run, reading admission_peer.py (a pyenv shim under /root is not).
py=""
for cand in "$(command -v python3)" /usr/bin/python3; do
  if [ -x "$cand" ] && as_nobody "$cand" -c "open('$peer').close()" 2>/dev/null; then
    py=$cand
    break
  fi
done
[ -n "$py" ] || { echo "skip: no python3 that user nobody can run with $peer"; exit 77; }
# nsnobody NS ARGS...: admission_peer.py ARGS as nobody in network namespace NS.
nsnobody() { local ns=$1; shift; timeout 20 ip netns exec "$ns" setpriv --reuid=nobody \
  --regid=nogroup --clear-groups "$py" "$peer" "$@"; }
# security FIELD JSON: a number from the status's "security" object.
field() { grep -o "\"$1\": *[0-9]*" <<<"$2" | grep -o '[0-9]*$'; }
# poll CMD...: true once CMD succeeds, tried every 50 ms for at most 10 s.
poll() { for _ in $(seq 200); do "$@" && return 0; timeout 0.05 tail -f /dev/null; done; return 1; }
# serve_start NAME [netns] ARGS...: runs ddp-rendezvous serve, sets $sport; log in $tmp/NAME.log
serve_start() {
  local name=$1 ns=$2
  shift 2
  mkfifo "$tmp/$name.port"
  if [ -n "$ns" ]; then
    ip netns exec "$ns" "$rdzv" serve --port 0 "$@" >"$tmp/$name.port" 2>"$tmp/$name.log" &
  else
    "$rdzv" serve --port 0 "$@" >"$tmp/$name.port" 2>"$tmp/$name.log" &
  fi
  srv=$!
  pids+=("$srv")
  sport=$(timeout 20 head -n1 "$tmp/$name.port")
}
serve_stop() { kill -TERM "$srv"; timeout 20 tail --pid="$srv" -f /dev/null; wait "$srv"; }
# reap SECONDS: waits (at most SECONDS each) for the two nodes ${np[0]} and ${np[1]}; their exit
# codes into $rcs.
reap() {
  rcs=""
  for i in 0 1; do
    timeout "$1" tail --pid="${np[$i]}" -f /dev/null
    wait "${np[$i]}"
    rcs+="$? "
  done
}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/job.token"
chmod 600 "$tmp/job.token"

# Namespaces: node 0 (every store of part 1, with a veth pair v0 fe80::a - v1 fe80::b for the
# link-local case), node 1, a stranger.
if ! netns_setup adm "$tag" 10.213.20 3; then
  fail "cannot make network namespaces"
  exit 1
fi
nodes=("${NETNS_NODES[@]}")
addr=("${NETNS_ADDRS[@]}")
n0=${nodes[0]}
port=29590 # the namespaces are new and empty: nothing else listens there
forged='{"time":1.0,"node":"attacker","rank":0,"local_rank":0,"exit_code":42,"pid":1,"message":"forged root cause"}'
if ! { ip -n "$n0" link add v0 type veth peer name v1 &&
       ip -n "$n0" addr add fe80::a/64 dev v0 nodad && ip -n "$n0" addr add fe80::b/64 dev v1 nodad &&
       ip -n "$n0" link set v0 up && ip -n "$n0" link set v1 up; }; then
  fail "cannot make the link-local veth pair"
  exit 1
fi

# ---------------------------------------------------------------------------------------------
# 1. The matrix. A target is a store in node 0: its port $tport, its log $tlog, the options
#    its status needs ($tauth), what nobody's connections try to set ($tforge), its name $tname.
# refused: the target's security.refused_user, asked by its owner.
refused() { field refused_user "$(timeout 20 ip netns exec "$n0" "$rdzv" status --port "$tport" \
  "${tauth[@]}" 2>/dev/null)"; }
# A cell: cell_begin, probes (nprobe as nobody: exit codes into $got; oprobe as the owner: the
# first word, "admitted" or "refused", into $mine), cell_end CASE REFUSALS GOT MINE.
cell_begin() { got="" said="" mine="" before=$(refused) off=$(wc -l <"$tlog"); }
nprobe() {
  local o rc
  o=$(nsnobody "$n0" probe "$1" "$tport" "${@:2}" "${tforge[@]}" 2>&1)
  rc=$?
  got+="$rc " said+="'$o' "
}
oprobe() {
  local o
  o=$(timeout 20 ip netns exec "$n0" python3 "$peer" probe "$1" "$tport" "${@:2}" 2>&1)
  mine+="${o%% *} "
}
# logged: a line since the cell began says nobody's socket was refused (at once, or in the
# summary of a burst of refusals, within a second or two).
logged() { tail -n +$((off + 1)) "$tlog" | grep -q "belongs to uid $nob"; }
cell_end() {
  local what=$1 want=$2 after
  poll logged
  after=$(refused)
  if [ "$got" = "$3" ] && [ "$mine" = "$4" ] && logged && [ -n "$before" ] && [ -n "$after" ] &&
     [ $((after - before)) = "$want" ]; then
    ok "$tname: nobody $what refused, logged, counted ($want)${4:+, the owner served}"
  else
    fail "$tname: nobody $what: exit codes '$got' (want '$3') $said; owner '$mine';" \
      "refused_user ${before:-none} -> ${after:-none} (want +$want);" \
      "log since: $(tail -n +$((off + 1)) "$tlog" | head -4)"
  fi
}
# EMFILE: the target's descriptor limit lowered to 8 more than it has open (a few free numbers
# below the limit: inherited descriptors may sit above it); the owner holds 40 connections (the
# store takes what it can, refuses the rest), then closes one: the store has one descriptor
# left, which nobody's connection takes. The limit is put back after.
drained() { [ "$(ip netns exec "$n0" ss -Hltn "sport = :$tport" | awk '{print $2}')" = 0 ]; }
no_close_wait() { [ -z "$(ip netns exec "$n0" ss -Htn state close-wait "sport = :$tport")" ]; }
filled() { grep -q "^$1" "$tmp/$tname.fill"; }
emfile_fill() {
  tpid=$(ip netns exec "$n0" ss -Hltnp "sport = :$tport" | grep -o '"ddp[-a-z]*",pid=[0-9]*' |
    head -1 | grep -o '[0-9]*$')
  soft=$(prlimit --pid "$tpid" --nofile -o SOFT --noheadings | tr -d ' ')
  prlimit --pid "$tpid" --nofile=$(($(ls /proc/"$tpid"/fd | wc -l) + 8)):
  : >"$tmp/$tname.fill"
  mkfifo "$tmp/$tname.in"
  ip netns exec "$n0" python3 "$peer" hold 127.0.0.1 "$tport" 40 <"$tmp/$tname.in" \
    >"$tmp/$tname.fill" 2>&1 &
  holder=$!
  pids+=("$holder")
  exec {fillfd}<>"$tmp/$tname.in" # read-write: does not wait for the reader
  poll filled opened && poll drained && echo close1 >&$fillfd && poll filled "closed one" &&
    poll no_close_wait
}
emfile_free() {
  exec {fillfd}>&-
  timeout 20 tail --pid="$holder" -f /dev/null
  prlimit --pid "$tpid" --nofile="$soft":
}
# The cases. case_dev ADDR...: bound to lo, to each ADDR.
case_dev() {
  local to="$*"
  cell_begin
  for a in "$@"; do nprobe "$a" --dev lo; done
  oprobe "$1" --dev lo
  cell_end "bound to lo (to ${to// / and })" $# "$(printf '1 %.0s' "$@")" "admitted "
}
case_v6() {
  cell_begin
  nprobe ::1
  oprobe ::1
  cell_end "from ::1" 1 "1 " "admitted "
}
case_ll() {
  cell_begin
  nprobe "fe80::a%v1" --src "fe80::b%v1"
  oprobe "fe80::a%v1" --src "fe80::b%v1"
  cell_end "from a scoped link-local address" 1 "1 " "admitted "
}
case_emfile() {
  cell_begin
  emfile_fill || said+="(not at EMFILE: $(tail -1 "$tmp/$tname.fill")) "
  nprobe 127.0.0.1
  emfile_free
  cell_end "on the store's last descriptor (EMFILE)" 1 "1 " ""
}
matrix() { case_dev 127.0.0.1 ::1; case_v6; case_ll; case_emfile; }

# 1a. ddp-rendezvous serve, with and without --token-file, on every address.
tforge=()
for mode in token none; do
  tname="serve ($mode)" tauth=() args=(--bind ::)
  [ $mode = token ] && tauth=(--token-file "$tmp/job.token") && args+=("${tauth[@]}")
  serve_start "serve-$mode" "$n0" "${args[@]}"
  tport=$sport tlog=$tmp/serve-$mode.log
  matrix
  serve_stop
done

# 1b. A tokened one-node job (ddprun's own secret) on every address of node 0; a --standalone
#     one, whose store listens on 127.0.0.1 only, on that.
worker='echo "$MASTER_PORT" > "$0/ready"; read -r _ < "$0/go"'
for kind in static standalone; do
  rm -f "$tmp/ready" "$tmp/go"
  mkfifo "$tmp/ready" "$tmp/go"
  args=(--nnodes 1 --master-addr "${addr[0]}" --master-port $((port + 2)))
  [ $kind = standalone ] && args=(--standalone)
  timeout -k 5 120 ip netns exec "$n0" env -u DDPRUN_TOKEN_FILE -u DDPRUN_TOKEN "$ddprun" \
    "${args[@]}" --nproc-per-node 1 sh -c "$worker" "$tmp" >"$tmp/job-$kind" 2>&1 &
  job=$!
  pids+=("$job")
  tname="tokened one-node job ($kind)" tlog=$tmp/job-$kind tauth=()
  tport=$(timeout 60 cat "$tmp/ready")
  if [ $kind = static ]; then matrix; else case_dev 127.0.0.1; case_emfile; fi
  timeout 20 sh -c 'echo go > "$1/go"' sh "$tmp"
  timeout 60 tail --pid="$job" -f /dev/null
  wait "$job"
  rc_job=$?
  if [ "$rc_job" = 0 ] && ! grep -q "has no secret" "$tmp/job-$kind"; then
    ok "$tname: exit 0"
  else
    fail "$tname: exit $rc_job: $(tail -5 "$tmp/job-$kind")"
  fi
done

# 1c. A token-less two-node job, its store on node 0: nobody's connections also try to forge the
#     round's failure record.
for i in 0 1; do mkfifo "$tmp/r$i" "$tmp/g$i"; done
worker='echo "$TORCHELASTIC_RUN_ID" > "$0/r$GROUP_RANK"; read -r _ < "$0/g$GROUP_RANK"'
for i in 0 1; do
  env -u DDPRUN_TOKEN_FILE -u DDPRUN_TOKEN timeout -k 5 120 ip netns exec "${nodes[$i]}" \
    "$ddprun" --nnodes 2 --node-rank $i --master-addr "${addr[0]}" --master-port $port \
    --rdzv-id adm --nproc-per-node 1 sh -c "$worker" "$tmp" >"$tmp/tl$i" 2>&1 &
  pids+=($!)
  np[$i]=$!
done
r0=$(timeout 60 cat "$tmp/r0")
r1=$(timeout 60 cat "$tmp/r1")
tname="token-less two-node job" tport=$port tlog=$tmp/tl0 tauth=()
tforge=(--set /ddprun/adm/round_0/failed "$forged")
matrix
for i in 0 1; do timeout 20 sh -c 'echo go > "$1"' sh "$tmp/g$i"; done
reap 60
if [ -n "$r0" ] && [ -n "$r1" ] && [ "$rcs" = "0 0 " ] && ! grep -q "forged" "$tmp/tl0" "$tmp/tl1"; then
  ok "$tname: the failure record not forged, exit 0 0"
else
  fail "$tname: exit codes '$rcs'; node0: $(tail -5 "$tmp/tl0")"
fi

# 1d. The kernel cannot be asked (socket(AF_NETLINK) fails): nobody and the owner refused.
if [ -n "$no_netlink" ]; then
  mkfifo "$tmp/nonl.port"
  LD_PRELOAD=$no_netlink "$rdzv" serve --port 0 --token-file "$tmp/job.token" \
    >"$tmp/nonl.port" 2>"$tmp/nonl.log" &
  srv=$!
  pids+=("$srv")
  sport=$(timeout 20 head -n1 "$tmp/nonl.port")
  outn=$(as_nobody "$py" "$peer" probe 127.0.0.1 "$sport" 2>&1)
  rcn=$?
  minen=$(timeout 20 python3 "$peer" probe 127.0.0.1 "$sport" 2>&1)
  rcmine=$?
  serve_stop
  if [ "$rcn" = 1 ] && [ "$rcmine" = 1 ] &&
     grep -q "its owner cannot be established" "$tmp/nonl.log"; then
    ok "kernel cannot be asked: nobody and the owner refused (fail closed), logged"
  else
    fail "kernel cannot be asked: nobody rc=$rcn '$outn', owner rc=$rcmine '$minen';" \
      "log: $(head -5 "$tmp/nonl.log")"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 2a. A persistent flood of 300 strangers (every closed connection reopened) from one address
#     against serve --token-file --max-connections 60 (defaults otherwise): a node joining for
#     the first time authenticates and works, its unauthenticated workers too; strangers hold
#     at most max_probation_per_address (8) slots and are closed after --auth-timeout (10 s).
# 2b. The same flood with every slot open to strangers (--max-probation 60, no cap per
#     address) after the node authenticated: the node's new connections take strangers' slots.
for variant in fresh known; do
  args=(--bind 0.0.0.0 --token-file "$tmp/job.token" --max-connections 60)
  [ $variant = known ] && args+=(--max-probation 60 --max-probation-per-address 0)
  serve_start "flood-$variant" "${nodes[0]}" "${args[@]}"
  nodecli() { timeout 30 ip netns exec "${nodes[1]}" "$rdzv" --host "${addr[0]}" --port "$sport" \
    --timeout 20 "$@"; }
  [ $variant = known ] && nodecli --token-file "$tmp/job.token" set /ddprun/job/k before >/dev/null 2>&1
  mkfifo "$tmp/flood-$variant.up"
  ip netns exec "${nodes[2]}" prlimit --nofile=4096:4096 python3 "$peer" flood "${addr[0]}" \
    "$sport" 300 "$tmp/flood-$variant.up" >"$tmp/flood-$variant.out" 2>&1 &
  fl=$!
  pids+=("$fl")
  flood_up=$(timeout 30 cat "$tmp/flood-$variant.up")
  nodecli --token-file "$tmp/job.token" set /ddprun/job/k node >/dev/null 2>&1
  rc_node=$?
  nodecli set open/key worker >/dev/null 2>&1
  rc_worker=$?
  got=$(nodecli get open/key 2>/dev/null)
  # fresh: strangers closed for the deadline; known: strangers shed for the node. Polled in
  # the status (bounded).
  want=$([ $variant = fresh ] && echo auth_timeouts || echo probation_shed)
  st=""
  end=$((SECONDS + 30))
  while [ $SECONDS -lt $end ]; do
    st=$(nodecli --token-file "$tmp/job.token" --timeout 5 status 2>/dev/null)
    [ "$(field "$want" "$st")" -ge 1 ] 2>/dev/null && break
    timeout 0.1 tail -f /dev/null
  done
  kill "$fl"
  serve_stop
  prob=$(field probation "$st")
  conns=$(grep -o '"connections": *[0-9]*' <<<"$st" | grep -o '[0-9]*$')
  limit=$([ $variant = fresh ] && echo 8 || echo 60)
  if [ "$flood_up" = up ] && [ "$rc_node" = 0 ] && [ "$rc_worker" = 0 ] && [ "$got" = worker ] &&
     [ "${prob:-99}" -le "$limit" ] && [ "${conns:-99}" -le 60 ] &&
     [ "$(field "$want" "$st")" -ge 1 ] 2>/dev/null; then
    ok "flood of 300 strangers ($variant node): node and worker served; probation $prob <= $limit," \
      "connections $conns <= 60, shed $(field probation_shed "$st"), timed out $(field auth_timeouts "$st")"
  else
    fail "flood ($variant node): node rc=$rc_node worker rc=$rc_worker got '$got' status: $st;" \
      "log: $(grep -v 'refus' "$tmp/flood-$variant.log" | head -5)"
  fi
done

# 2c. The issue's scenario: 20,000 idle sockets from the stranger's namespace while a tokened
#     two-node job (store with ulimit -n 300) restarts; attempt 1 runs coll-check's barrier.
for i in 0 1; do mkfifo "$tmp/ready$i" "$tmp/go$i"; done
mkfifo "$tmp/flood2.up"
# Attempt 0: node 1's rank fails when told; node 0's waits until the restart ends it.
worker='if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  echo up > "$1/ready$GROUP_RANK"; read -r _ < "$1/go$GROUP_RANK"; exit 1
fi
exec "$0" --expect-hosts 2 barrier'
for i in 0 1; do
  DDPRUN_TOKEN_FILE="$tmp/job.token" timeout -k 5 240 ip netns exec "${nodes[$i]}" \
    prlimit --nofile=300:300 "$ddprun" --nnodes 2 --node-rank $i --master-addr "${addr[0]}" \
    --master-port $((port + 1)) --rdzv-id adm2 --max-restarts 1 --nproc-per-node 1 \
    sh -c "$worker" "$check" "$tmp" >"$tmp/rs$i" 2>&1 &
  pids+=($!)
  np[$i]=$!
done
up0=$(timeout 60 cat "$tmp/ready0")
up1=$(timeout 60 cat "$tmp/ready1")
# As many as this process may open, up to 20,000 (the hard RLIMIT_NOFILE, less a few).
hard=$(ulimit -Hn)
[ "$hard" = unlimited ] && hard=1048576
count=$((hard - 16 < 20000 ? hard - 16 : 20000))
ip netns exec "${nodes[2]}" prlimit --nofile=$((count + 16)):$((count + 16)) python3 "$peer" \
  flood "${addr[0]}" $((port + 1)) $count "$tmp/flood2.up" --once >"$tmp/flood2.out" 2>&1 &
fl=$!
pids+=("$fl")
flood_up=$(timeout 60 cat "$tmp/flood2.up")
# Node 1's rank fails: both nodes restart their workers while the flood is on.
timeout 20 sh -c 'echo go > "$1/go1"' sh "$tmp"
reap 200
kill "$fl" 2>/dev/null
passes=$(cat "$tmp/rs0" "$tmp/rs1" | grep -c "barrier: PASS")
if [ -n "$up0" ] && [ -n "$up1" ] && [ "$flood_up" = up ] && [ "$rcs" = "0 0 " ] &&
   [ "$passes" = 2 ]; then
  ok "$count idle strangers during a two-node restart (ulimit -n 300): exit 0 0, both ranks passed the barrier"
else
  fail "flood during restart: exit codes '$rcs', barrier passes $passes;" \
    "flood of $count up: '$flood_up'; node0: $(tail -8 "$tmp/rs0") node1: $(tail -5 "$tmp/rs1")" \
    "flood: $(tail -2 "$tmp/flood2.out")"
fi

[ "$fails" = 0 ] && echo "all passed" || echo "$fails failed"
[ "$fails" = 0 ]
