# Network namespaces for multi-node tests; source it (bash). The "nodes" are namespaces with
# addresses of their own, joined by a bridge that lives in a namespace too, so nothing is
# added to the host's own network namespace. Needs root and iproute2.
#
#   netns_setup NAME TAG SUBNET N   creates namespace ${NAME}br$TAG holding bridge br0 and
#                                   N node namespaces ${NAME}n$i-$TAG, node i at $SUBNET.(i+1)/24
#                                   on a veth pair into the bridge. Sets NETNS_NODES and
#                                   NETNS_ADDRS (arrays) and NETNS_BR. Returns 77 when namespaces
#                                   cannot be created, 1 on any other failure.
#   netns_cleanup                   kills every process left in the node namespaces and deletes
#                                   the namespaces (and with them the veths and the bridge).
#   netns_test_begin                the start every multi-node test shares: exits 77 unless root
#                                   with iproute2; sets tag=$$, tmp (a new directory; KEEP_TMP=1
#                                   keeps it and prints its path) and pids=() (the processes the
#                                   test starts), and traps EXIT to kill $pids, run
#                                   netns_cleanup and remove $tmp; fails=0.
#   netns_run_node I LOG ARGS...    runs "$ddprun" ARGS in node I's namespace in the background,
#                                   its output to LOG; pids[I] is its pid.
#   fail MSG / ok MSG               report a check (fail counts it in $fails).
NETNS_NODES=()
NETNS_ADDRS=()
NETNS_BR=

netns_setup() {
  local name=$1 tag=$2 subnet=$3 n=$4 i ns v b
  NETNS_BR=${name}br$tag
  if ! ip netns add "$NETNS_BR"; then
    echo "skip: cannot create network namespaces"
    NETNS_BR=
    return 77
  fi
  ip -n "$NETNS_BR" link add br0 type bridge && ip -n "$NETNS_BR" link set br0 up || return 1
  for ((i = 0; i < n; i++)); do
    ns=${name}n$i-$tag
    v=${name:0:1}v$i$tag
    b=${name:0:1}b$i$tag
    ip netns add "$ns" || return 1
    NETNS_NODES+=("$ns")
    NETNS_ADDRS+=("$subnet.$((i + 1))")
    ip link add "$v" type veth peer name "$b" || return 1
    ip link set "$v" netns "$ns" && ip link set "$b" netns "$NETNS_BR" || return 1
    ip -n "$NETNS_BR" link set "$b" master br0 up || return 1
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev "$v" || return 1
    ip -n "$ns" link set "$v" up && ip -n "$ns" link set lo up || return 1
  done
  # Reachability (bounded): the last node reaches node 0 through the bridge.
  local last=${NETNS_NODES[$((n - 1))]}
  for _ in $(seq 100); do
    ip netns exec "$last" ping -c1 -W1 "${NETNS_ADDRS[0]}" >/dev/null 2>&1 && break
  done
  return 0
}

netns_cleanup() {
  local ns
  for ns in "${NETNS_NODES[@]}"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  [ -n "$NETNS_BR" ] && ip netns del "$NETNS_BR" 2>/dev/null
  NETNS_NODES=()
  NETNS_ADDRS=()
  NETNS_BR=
  return 0
}

netns_test_begin() {
  [ "$(id -u)" = 0 ] || { echo "skip: needs root for network namespaces"; exit 77; }
  command -v ip >/dev/null || { echo "skip: no iproute2"; exit 77; }
  tag=$$
  tmp=$(mktemp -d)
  [ -n "${KEEP_TMP:-}" ] && echo "tmp=$tmp"
  pids=()
  fails=0
  trap netns_test_end EXIT
}

netns_run_node() {
  local i=$1 log=$2
  shift 2
  ip netns exec "${NETNS_NODES[$i]}" "$ddprun" "$@" >"$log" 2>&1 &
  pids[$i]=$!
}

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

netns_test_end() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  netns_cleanup
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
