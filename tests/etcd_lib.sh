# A real etcd cluster (Debian's etcd-server) for tests and benchmarks; source it (bash). Each
# member runs in a network namespace of its own (tests/netns_lib.sh) or, with an empty
# namespace name, on this host's loopback. Needs curl for the health checks. ETCD names the
# binary (default etcd on PATH) and ETCD_ARGS adds arguments to every member's command line
# (bench/rdzv gives --enable-v2=true for torchrun's etcd-v2 backend).
#
#   etcd_cluster_start DIR NS:ADDR:CPORT:PPORT...
#                        starts one member per argument (namespace, or "" for none; its address;
#                        client and peer port), data and logs in DIR/m<i>, and waits (30 s at
#                        most) until every member answers with a leader elected. Sets
#                        ETCD_ENDPOINTS ("addr:port,..."), ETCD_PIDS and ETCD_MEMBERS. Returns
#                        77 where etcd or curl is missing, 1 when the cluster did not come up
#                        (the members' logs are in DIR).
#   etcd_status I        member I's /v3/maintenance/status answer (JSON), or nothing.
#   etcd_leader          the index of the member that is the leader, or nothing.
#   etcd_kill I          SIGKILLs member I and waits for it.
#   etcd_cluster_stop    SIGKILLs every member.
ETCD_ENDPOINTS=
ETCD_PIDS=()
ETCD_MEMBERS=()

etcd_in() { # NS CMD...: exec CMD in namespace NS (none if empty): run it in a subshell or as a
  # background job, whose pid is then CMD's own
  local ns=$1
  shift
  if [ -n "$ns" ]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi
}

etcd_cluster_start() {
  local dir=$1 i ns addr cport pport cluster="" m
  shift
  command -v "${ETCD:-etcd}" >/dev/null ||
    { echo "skip: no etcd binary (apt-get install etcd-server)"; return 77; }
  command -v curl >/dev/null || { echo "skip: no curl"; return 77; }
  ETCD_MEMBERS=("$@")
  ETCD_PIDS=()
  ETCD_ENDPOINTS=
  i=0
  for m in "$@"; do
    IFS=: read -r ns addr cport pport <<<"$m"
    cluster+="${cluster:+,}m$i=http://$addr:$pport"
    ETCD_ENDPOINTS+="${ETCD_ENDPOINTS:+,}$addr:$cport"
    i=$((i + 1))
  done
  i=0
  for m in "$@"; do
    IFS=: read -r ns addr cport pport <<<"$m"
    mkdir -p "$dir/m$i"
    # shellcheck disable=SC2086 # ETCD_ARGS: words on purpose
    etcd_in "$ns" "${ETCD:-etcd}" --name "m$i" --data-dir "$dir/m$i/data" ${ETCD_ARGS:-} \
      --listen-client-urls "http://$addr:$cport" --advertise-client-urls "http://$addr:$cport" \
      --listen-peer-urls "http://$addr:$pport" --initial-advertise-peer-urls "http://$addr:$pport" \
      --initial-cluster "$cluster" --initial-cluster-state new \
      --initial-cluster-token "ddprun-test-$$" >"$dir/m$i/log" 2>&1 &
    ETCD_PIDS+=($!)
    i=$((i + 1))
  done
  local up t
  for t in $(seq 300); do # bounded: 30 s
    up=0
    for ((i = 0; i < ${#ETCD_MEMBERS[@]}; i++)); do
      etcd_status $i | grep -q '"leader"' && up=$((up + 1))
    done
    [ $up = ${#ETCD_MEMBERS[@]} ] && return 0
    sleep 0.1
  done
  echo "etcd cluster did not come up: $(tail -n 3 "$dir"/m*/log)"
  return 1
}

etcd_status() {
  local ns addr cport pport
  IFS=: read -r ns addr cport pport <<<"${ETCD_MEMBERS[$1]}"
  (etcd_in "$ns" curl -s -m 2 -X POST "http://$addr:$cport/v3/maintenance/status" -d '{}' 2>/dev/null)
}

etcd_leader() {
  local i s me leader
  for ((i = 0; i < ${#ETCD_MEMBERS[@]}; i++)); do
    s=$(etcd_status $i) || continue
    me=$(grep -o '"member_id":"[0-9]*"' <<<"$s" | grep -o '[0-9][0-9]*')
    leader=$(grep -o '"leader":"[0-9]*"' <<<"$s" | grep -o '[0-9][0-9]*')
    [ -n "$me" ] && [ "$me" = "$leader" ] && { echo $i; return 0; }
  done
  return 1
}

etcd_kill() {
  kill -KILL "${ETCD_PIDS[$1]}" 2>/dev/null
  wait "${ETCD_PIDS[$1]}" 2>/dev/null
  return 0
}

etcd_cluster_stop() {
  local i
  for ((i = 0; i < ${#ETCD_PIDS[@]}; i++)); do etcd_kill $i; done
}
