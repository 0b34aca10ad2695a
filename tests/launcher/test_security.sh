#!/usr/bin/env bash
# A job's control plane is the job's (issue 10, point 5): attacks on a running job's store by
# processes without the job's secret.
#
#  1. One-node job (coll-check's barrier scenario, then rank 0 holds the job open): a local
#     process of the same user, without the secret, forges the round's failure record and
#     tries to read and replace a collective bootstrap key (a CPU-backend address, published
#     by libcollective). Each request is refused (the store closes the connection: the client
#     sees status 2 and no value), counted (status JSON, security.refused_private) and logged,
#     and the job finishes with status 0. A PyTorch-style key stays open to that process, and a
#     client with the secret ddprun gave the workers (DDPRUN_STORE_TOKEN) reads the real key;
#     the secret appears nowhere in ddprun's output.
#  2. Another local user (nobody, through setpriv) connects to a ddp-rendezvous store: refused
#     on connect, logged, counted (security.refused_user); the store's own user still works.
#  3. Two-node job in network namespaces with a secret from DDPRUN_TOKEN_FILE: an attacker on a
#     third address forges the failure record (refused: not a node's address, did not
#     authenticate), one on node 1's address does too (refused: private key); both nodes finish
#     with status 0. A node given the wrong token stops at once with a clear message. Then
#     ddp-rendezvous serve with a token and --allow: an allowed network is served without
#     authenticating, another address only after a connection from it authenticated.
#
# Synchronisation is by FIFOs (workers announce themselves and wait for the test), never by
# sleeping; every wait is bounded by timeout(1).
# Usage: test_security.sh DDPRUN DDP_RENDEZVOUS COLL_CHECK. Exit 0 pass, 1 fail, 77 skip.
set -uo pipefail
ddprun=$(readlink -f "$1")
rdzv=$(readlink -f "$2")
check=$(readlink -f "$3")
command -v timeout >/dev/null || { echo "skip: no timeout(1)"; exit 77; }

tmp=$(mktemp -d)
[ -n "${KEEP_TMP:-}" ] && echo "tmp=$tmp"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  [ "$(type -t netns_cleanup)" = function ] && netns_cleanup
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT

fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
forged='{"time":1.0,"node":"attacker","rank":0,"local_rank":0,"exit_code":42,"pid":1,"message":"forged root cause"}'

# ---------------------------------------------------------------------------------------------
# 1. One node: the forged failure record and the collective bootstrap keys.
mkfifo "$tmp/ready" "$tmp/go"
# Rank 0 announces "PORT RUN_ID" on the ready FIFO once the communicator's keys exist, then
# holds the job open until the test writes to the go FIFO.
worker='"$0" --expect-hosts 1 barrier || exit 1
if [ "$RANK" = 0 ]; then
  (umask 077; printf "%s\n" "${DDPRUN_STORE_TOKEN:-}" > "$1/token")
  echo "$MASTER_PORT $TORCHELASTIC_RUN_ID" > "$1/ready"; read -r _ < "$1/go"
fi'
timeout -k 5 120 "$ddprun" --standalone --nproc-per-node 2 sh -c "$worker" "$check" "$tmp" \
  >"$tmp/job1" 2>&1 &
job=$!
pids+=("$job")
info=$(timeout 60 cat "$tmp/ready")
read -r port run <<<"$info"
if [ -z "${port:-}" ] || [ -z "${run:-}" ]; then
  fail "one node: the job did not come up: $(cat "$tmp/job1")"
else
  # The attacker: the same user, on loopback, without the secret.
  attack() { timeout 20 "$rdzv" --port "$port" --timeout 2 "$@" 2>>"$tmp/attacker"; }
  attack set "/ddprun/$run/round_0/failed" "$forged"
  rc_forge=$?
  # The address rank 0 published for the CPU backend, where this code keeps it and where
  # libcollective kept it before it moved under /ddprun-coll/.
  stolen=""
  for key in "/ddprun-coll/coll-check/$run/0/barrier/cpu/0" "coll-check/$run/0/barrier/cpu/0"; do
    stolen+=$(attack get "$key")
  done
  attack set "/ddprun-coll/coll-check/$run/0/barrier/cpu/0" "10.66.66.66:1 forged"
  rc_replace=$?
  attack set "torch/open/key" "torch-style keys stay open"
  rc_open=$?
  # The job's own clients (with the secret ddprun gave its workers) still read the real key.
  legit=""
  [ -s "$tmp/token" ] && legit=$(timeout 20 "$rdzv" get --port "$port" --timeout 2 \
    --token-file "$tmp/token" "/ddprun-coll/coll-check/$run/0/barrier/cpu/0" 2>&1)
  status=$(timeout 20 "$rdzv" status --port "$port" 2>/dev/null)
  timeout 20 sh -c 'echo go > "$1/go"' sh "$tmp"
  timeout 60 tail --pid="$job" -f /dev/null
  wait "$job"
  rc_job=$?
  refused=$(grep -o '"refused_private": *[0-9]*' <<<"$status" | grep -o '[0-9]*$')
  secret=$(cat "$tmp/token" 2>/dev/null)
  if [ "$rc_forge" != 0 ] && [ -z "$stolen" ] && [ "$rc_replace" != 0 ] && [ "$rc_open" = 0 ] &&
     [ -n "$legit" ] && ! grep -q forged <<<"$legit" && ! grep -qF -- "$secret" "$tmp/job1" &&
     [ "$rc_job" = 0 ] && [ "${refused:-0}" -ge 3 ] &&
     grep -q "is private to the job's authenticated connections" "$tmp/job1"; then
    ok "one node: forged failure and bootstrap-key reads/writes refused ($refused counted, logged), job exit 0"
  else
    fail "one node: forge rc=$rc_forge stolen='$stolen' replace rc=$rc_replace open rc=$rc_open" \
      "job's own read='${legit:-}'" \
      "job rc=$rc_job refused_private=${refused:-none}; job: $(tail -20 "$tmp/job1")"
  fi
fi

# ---------------------------------------------------------------------------------------------
# 2. Another user of this host.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  mkfifo "$tmp/serve.port"
  "$rdzv" serve --port 0 >"$tmp/serve.port" 2>"$tmp/serve.log" &
  srv=$!
  pids+=("$srv")
  sport=$(timeout 20 head -n1 "$tmp/serve.port")
  "$rdzv" set --port "$sport" shared/key mine >/dev/null 2>&1
  as_nobody=$(timeout 20 setpriv --reuid=nobody --regid=nogroup --clear-groups \
    "$rdzv" get --port "$sport" --timeout 1 shared/key 2>&1)
  rc_nobody=$?
  mine=$("$rdzv" get --port "$sport" --timeout 5 shared/key 2>&1)
  users=$("$rdzv" status --port "$sport" 2>/dev/null | grep -o '"refused_user": *[0-9]*' | grep -o '[0-9]*$')
  kill -TERM "$srv"
  wait "$srv"
  if [ "$rc_nobody" != 0 ] && ! grep -q mine <<<"$as_nobody" && [ "$mine" = mine ] &&
     [ "${users:-0}" -ge 1 ] && grep -q "belongs to uid $(id -u nobody)" "$tmp/serve.log"; then
    ok "another user (nobody) refused on loopback ($users refusals counted, logged); the owner served"
  else
    fail "other user: rc=$rc_nobody got '$as_nobody' owner got '$mine' refused_user=${users:-none};" \
      "log: $(head -5 "$tmp/serve.log")"
  fi
else
  echo "skip: other-user test needs root, setpriv and a nobody user"
fi

# ---------------------------------------------------------------------------------------------
# 3. Two nodes in network namespaces, a secret from DDPRUN_TOKEN_FILE, attackers on a third
#    address and on node 1's address.
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "skip: the two-node part needs root and iproute2"
else
  . "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"
  if ! netns_setup sec "$$" 10.213.9 3; then
    echo "skip: cannot make network namespaces"
  else
    nodes=("${NETNS_NODES[@]}")
    addr=("${NETNS_ADDRS[@]}")
    port=29577 # the namespaces are new and empty: nothing else listens there
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/job.token"
    chmod 600 "$tmp/job.token"
    for i in 0 1; do mkfifo "$tmp/ready$i" "$tmp/go$i"; done
    worker='echo "$MASTER_PORT $TORCHELASTIC_RUN_ID" > "$0/ready$GROUP_RANK"; read -r _ < "$0/go$GROUP_RANK"'
    for i in 0 1; do
      DDPRUN_TOKEN_FILE="$tmp/job.token" timeout -k 5 120 ip netns exec "${nodes[$i]}" "$ddprun" \
        --nnodes 2 --node-rank $i --master-addr "${addr[0]}" --master-port $port --rdzv-id sec \
        --nproc-per-node 1 sh -c "$worker" "$tmp" >"$tmp/node$i" 2>&1 &
      pids+=($!)
      np[$i]=$!
    done
    r0=$(timeout 60 cat "$tmp/ready0")
    r1=$(timeout 60 cat "$tmp/ready1")
    if [ -z "$r0" ] || [ -z "$r1" ]; then
      fail "two nodes: the job did not come up: $(cat "$tmp/node0" "$tmp/node1")"
    else
      nsattack() { # namespace index, then ddp-rendezvous arguments
        local i=$1; shift
        timeout 20 ip netns exec "${nodes[$i]}" "$rdzv" --host "${addr[0]}" --port $port \
          --timeout 2 "$@" 2>>"$tmp/attacker"
      }
      nsattack 2 set /ddprun/sec/round_0/failed "$forged"
      rc_far=$?
      nsattack 1 set /ddprun/sec/round_0/failed "$forged"
      rc_near=$?
      nsattack 1 set torch/open/key open
      rc_open=$?
      # A third node given the wrong token: it stops at once, naming the cause.
      echo "0123456789abcdef0123456789abcdef" >"$tmp/wrong.token"
      timeout 30 ip netns exec "${nodes[2]}" "$ddprun" --token-file "$tmp/wrong.token" \
        --nnodes 2 --node-rank 1 --master-addr "${addr[0]}" --master-port $port --rdzv-id sec \
        --nproc-per-node 1 true >"$tmp/wrong" 2>&1
      rc_wrong=$?
      st=$(nsattack 0 status)
      for i in 0 1; do timeout 20 sh -c 'echo go > "$1"' sh "$tmp/go$i"; done
      rcs=""
      for i in 0 1; do
        timeout 60 tail --pid="${np[$i]}" -f /dev/null
        wait "${np[$i]}"
        rcs+="$? "
      done
      far=$(grep -o '"refused_address": *[0-9]*' <<<"$st" | grep -o '[0-9]*$')
      near=$(grep -o '"refused_private": *[0-9]*' <<<"$st" | grep -o '[0-9]*$')
      if [ "$rcs" = "0 0 " ] && [ "$rc_far" != 0 ] && [ "$rc_near" != 0 ] && [ "$rc_open" = 0 ] &&
         ! grep -qF -- "$(cat "$tmp/job.token")" "$tmp/node0" "$tmp/node1" "$tmp/wrong" &&
         [ "${far:-0}" -ge 1 ] && [ "${near:-0}" -ge 1 ] && [ "$rc_wrong" != 0 ] &&
         grep -q "could not prove that it knows the job's secret" "$tmp/wrong"; then
        ok "two nodes: forged failures from a third address and from node 1's refused; wrong token stops; exit 0 0"
      else
        fail "two nodes: rcs=$rcs far rc=$rc_far near rc=$rc_near open rc=$rc_open" \
          "wrong-token rc=$rc_wrong refused_address=${far:-none} refused_private=${near:-none};" \
          "node0: $(tail -5 "$tmp/node0") node1: $(tail -5 "$tmp/node1") wrong: $(cat "$tmp/wrong")"
      fi
    fi

    # ddp-rendezvous serve with a token and --allow for node 2's address only: node 2 is served
    # without authenticating, node 1 (neither allowed nor authenticated) only after it does.
    mkfifo "$tmp/sport"
    ip netns exec "${nodes[0]}" "$rdzv" serve --bind 0.0.0.0 --port $((port + 1)) \
      --token-file "$tmp/job.token" --allow "${addr[2]}/32" >"$tmp/sport" 2>"$tmp/serve3.log" &
    srv=$!
    pids+=("$srv")
    timeout 20 head -n1 "$tmp/sport" >/dev/null
    cli() { # namespace index, then ddp-rendezvous arguments
      local i=$1; shift
      timeout 20 ip netns exec "${nodes[$i]}" "$rdzv" --host "${addr[0]}" --port $((port + 1)) \
        --timeout 2 "$@" 2>>"$tmp/attacker"
    }
    cli 2 set open/key from-allowed
    rc_allowed=$?
    cli 1 set open/key from-stranger
    rc_stranger=$?
    cli 1 --token-file "$tmp/job.token" set open/key from-node
    rc_node=$?
    cli 1 set open/key2 node-address-now
    rc_after=$?
    kill -TERM "$srv"
    wait "$srv"
    if [ "$rc_allowed" = 0 ] && [ "$rc_stranger" != 0 ] && [ "$rc_node" = 0 ] && [ "$rc_after" = 0 ] &&
       grep -q "not one of the job's nodes" "$tmp/serve3.log"; then
      ok "serve --allow: an allowed network is served, a stranger only once its address authenticated"
    else
      fail "serve --allow: allowed rc=$rc_allowed stranger rc=$rc_stranger node rc=$rc_node" \
        "after rc=$rc_after; log: $(cat "$tmp/serve3.log")"
    fi
  fi
fi

[ -s "$tmp/attacker" ] && [ -n "${VERBOSE:-}" ] && sed 's/^/    attacker| /' "$tmp/attacker"
[ "$fails" = 0 ] && echo "all passed" || echo "$fails failed"
[ "$fails" = 0 ]
