#!/usr/bin/env bash
# ddprun under a real Slurm (Debian's slurm-wlm and munge): slurmctld and one slurmd per
# emulated node, each node a network namespace of its own (tests/netns_lib.sh) entered with
# nsenter, plus a UTS namespace for its host name (Debian's slurmd has no -N: a node is named by
# its host name) and a mount namespace whose /etc/hosts names the nodes. (`ip netns exec` is not
# used: it remounts /sys, hiding /sys/fs/cgroup from slurmd.) Nothing outside the test's
# namespaces and temporary directory is touched; everything it started is killed at the end.
#
#   1. a step on the whole allocation (3 nodes, one ddprun each): one job of 6 ranks;
#   2. a step on part of the allocation: node count, rank and master from the step
#      (`salloc -N2 srun -N1 -w snode2`, and 2 of 3 nodes);
#   3. a step with two tasks per node: each task a node of the job, one warning;
#   4. sbatch -N2: `srun --ntasks-per-node=1 ddprun` in the script is a 2-node job; ddprun run
#      directly in the script is a one-node job with a warning (it does not wait for a second
#      node that never starts);
#   5. scancel of a running job: ddprun and its workers are gone within 10 s;
#   6. an elastic job over etcd (one member in the controller's namespace): srun -N3 ddprun
#      --nnodes 2:3 --rdzv-backend etcd --max-restarts 1 with ddp-train checkpointing and
#      --resume auto; the ddprun of the node serving the workers' store SIGKILLed after step
#      40's checkpoint: the other two resume at world 2 and finish (skipped without etcd,
#      libcurl or Fashion-MNIST).
#
# Usage: test_slurm.sh DDPRUN [DDP_TRAIN]. Exit 0 pass, 1 fail, 77 skip (not root, Slurm, munge or
# namespaces missing, or Slurm did not start).
set -uo pipefail
ddprun=$(readlink -f "$1")
train=${2:+$(readlink -f "$2")}
[ "$(id -u)" = 0 ] || { echo "skip: needs root for namespaces and Slurm's daemons"; exit 77; }
for p in slurmctld slurmd srun salloc sbatch scancel squeue sinfo munged mungekey nsenter unshare ip; do
  command -v "$p" >/dev/null || { echo "skip: $p not found (apt-get install slurmctld slurmd slurm-client munge)"; exit 77; }
done

. "$(dirname "$(readlink -f "$0")")/../netns_lib.sh"
. "$(dirname "$(readlink -f "$0")")/../etcd_lib.sh"
. "$(dirname "$(readlink -f "$0")")/marked.sh"

tag=$$
T=$(mktemp -d /tmp/ddprun-slurm.XXXXXX)
chmod 755 "$T"
[ -n "${KEEP_TMP:-}" ] && echo "tmp=$T"
daemons=()
marker="ddprun-slurm-$tag"

cleanup() {
  local p
  for p in "${daemons[@]}"; do kill -TERM "$p" 2>/dev/null; done
  netns_cleanup # kills slurmd, slurmctld and every step left in the namespaces
  for p in "${daemons[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$T"
}
trap cleanup EXIT

fails=0

n=3
netns_setup slm "$tag" 10.213.13 $((n + 1)) || exit $?
ns=("${NETNS_NODES[@]}")
addr=("${NETNS_ADDRS[@]}")
ctl=sctl$tag
{
  echo "127.0.0.1 localhost"
  echo "${addr[0]} $ctl"
  for ((i = 1; i <= n; i++)); do echo "${addr[$i]} snode$i"; done
} >"$T/hosts"

# munge, with a key of the test's own, on a socket in the temporary directory.
mkdir -p "$T/munge"
mungekey -c -k "$T/munge/key" >/dev/null 2>&1 || { echo "skip: mungekey failed"; exit 77; }
munged -F --force --key-file="$T/munge/key" --socket="$T/munge/sock" \
  --pid-file="$T/munge/pid" --log-file="$T/munge/log" --seed-file="$T/munge/seed" \
  >/dev/null 2>&1 &
daemons+=($!)

mkdir -p "$T/state" "$T/spool"
cat >"$T/slurm.conf" <<EOF
ClusterName=ddpt$tag
SlurmctldHost=$ctl(${addr[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
InactiveLimit=0
KillWait=2
EOF
for ((i = 1; i <= n; i++)); do
  echo "NodeName=snode$i NodeAddr=${addr[$i]} CPUs=4 State=UNKNOWN" >>"$T/slurm.conf"
  mkdir -p "$T/spool/snode$i"
done
echo "PartitionName=p Nodes=snode[1-$n] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$T/slurm.conf"
export SLURM_CONF=$T/slurm.conf

# on INDEX HOST CMD...: CMD in namespace INDEX (0: the controller's, which also runs the
# clients), with host name HOST and the test's /etc/hosts.
on() {
  local i=$1 h=$2
  shift 2
  nsenter --net="/run/netns/${ns[$i]}" unshare --uts --mount --propagation private \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' sh "$T/hosts" "$h" "$@"
}
client() { on 0 "$ctl" "$@"; }

client slurmctld -D -i -f "$T/slurm.conf" >"$T/slurmctld.out" 2>&1 &
daemons+=($!)
for ((i = 1; i <= n; i++)); do
  on $i "snode$i" slurmd -D -f "$T/slurm.conf" >"$T/slurmd$i.out" 2>&1 &
  daemons+=($!)
done
up=""
for _ in $(seq 150); do # 30 s
  up=$(client sinfo -h -o '%T %D' 2>/dev/null)
  [ "$up" = "idle $n" ] && break
  sleep 0.2
done
if [ "$up" != "idle $n" ]; then
  echo "skip: Slurm did not start ($n idle nodes expected; sinfo: '$up')"
  tail -n 5 "$T/slurmctld.log" "$T"/slurmd-*.log "$T"/*.out 2>/dev/null | sed 's/^/    /'
  exit 77
fi
echo "Slurm is up: $n idle nodes"

# The workers print what they were given; sort gives a stable view of several nodes' output.
show='echo "rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK lr=$LOCAL_RANK master=$MASTER_ADDR host=$(hostname)"'

# 1. The whole allocation: 3 nodes, one ddprun each, 2 workers each.
client timeout 60 srun -N3 --ntasks-per-node=1 --chdir="$T" \
  "$ddprun" --nproc-per-node 2 sh -c "$show" >"$T/o1" 2>&1
rc=$?
ranks=$(grep -o 'rank=[0-9]* world=6' "$T/o1" | sort -u | wc -l)
if [ $rc = 0 ] && [ "$ranks" = 6 ] && grep -q 'rank=5 world=6 group=2 lr=1 master=snode1 host=snode3' "$T/o1"; then
  ok "srun on the whole allocation: one job of 6 ranks on 3 nodes, master snode1"
else
  fail "whole allocation: rc=$rc, $ranks ranks; $(cat "$T/o1")"
fi

# 2. Steps on part of the allocation. A two-node allocation, one node's step, with a master port
# (so not torchrun's one-node local store): the master is the step's node.
client timeout 60 salloc -N2 -w 'snode[1-2]' srun -N1 -w snode2 --chdir="$T" \
  "$ddprun" --nproc-per-node 2 --master-port 29511 sh -c "$show" >"$T/o2" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q 'rank=1 world=2 group=0 lr=1 master=snode2 host=snode2' "$T/o2"; then
  ok "salloc -N2 srun -N1 -w snode2: a one-node job on snode2"
else
  fail "subset step (-N1 -w snode2): rc=$rc; $(cat "$T/o2")"
fi
client timeout 60 salloc -N3 srun -N2 -w 'snode[2-3]' --ntasks-per-node=1 --chdir="$T" \
  "$ddprun" --nproc-per-node 1 sh -c "$show" >"$T/o2b" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q 'rank=0 world=2 group=0 lr=0 master=snode2 host=snode2' "$T/o2b" &&
   grep -q 'rank=1 world=2 group=1 lr=0 master=snode2 host=snode3' "$T/o2b"; then
  ok "salloc -N3 srun -N2 -w snode[2-3]: a two-node job, master snode2"
else
  fail "subset step (2 of 3): rc=$rc; $(cat "$T/o2b")"
fi

# 3. Two tasks per node: each task is a node of the job (4 of them), and task 0 warns.
client timeout 60 srun -N2 -n4 --chdir="$T" "$ddprun" --nproc-per-node 1 sh -c "$show" >"$T/o3" 2>&1
rc=$?
ranks=$(grep -o 'rank=[0-9]* world=4' "$T/o3" | sort -u | wc -l)
warns=$(grep -c 'ddprun: warning: the Slurm step runs 4 tasks on 2 nodes' "$T/o3")
if [ $rc = 0 ] && [ "$ranks" = 4 ] && [ "$warns" = 1 ]; then
  ok "srun -N2 -n4: 4 agents of one job, one warning"
else
  fail "two tasks per node: rc=$rc, $ranks ranks, $warns warnings; $(cat "$T/o3")"
fi

# 4. sbatch -N2: srun in the script runs a 2-node job; ddprun run directly is a one-node job.
cat >"$T/batch.sh" <<EOF
#!/bin/sh
srun --ntasks-per-node=1 "$ddprun" --nproc-per-node 2 sh -c '$show | sed s/^/step:/'
echo "step rc=\$?"
"$ddprun" --nproc-per-node 2 sh -c '$show | sed s/^/direct:/'
echo "direct rc=\$?"
EOF
client timeout 90 sbatch --wait -N2 --chdir="$T" -o "$T/o4" "$T/batch.sh" >"$T/o4.sbatch" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q 'step rc=0' "$T/o4" && grep -q 'direct rc=0' "$T/o4" &&
   [ "$(grep -o 'step:rank=[0-9]* world=4' "$T/o4" | sort -u | wc -l)" = 4 ] &&
   [ "$(grep -o 'direct:rank=[0-9]* world=2 group=0' "$T/o4" | sort -u | wc -l)" = 2 ] &&
   grep -q 'ddprun: warning: Slurm job [0-9]* has 2 nodes, but this is not a step of it' "$T/o4"; then
  ok "sbatch -N2: srun ddprun is a 2-node job; ddprun in the script a one-node job, with a warning"
else
  fail "sbatch: rc=$rc; $(cat "$T/o4.sbatch" "$T/o4" 2>&1)"
fi

# 5. scancel: a 2-node job whose workers sleep; every ddprun and worker is gone after scancel.
cat >"$T/sleep.sh" <<EOF
#!/bin/sh
export DDPRUN_SLURM_MARK=$marker
srun --ntasks-per-node=1 "$ddprun" --nproc-per-node 2 sh -c 'echo \$\$ > $T/w.\$RANK; exec sleep 300' $marker
EOF
job=$(client sbatch --parsable -N2 --chdir="$T" -o "$T/o5" "$T/sleep.sh" 2>"$T/o5.sbatch")
started=0
for _ in $(seq 300); do # 60 s
  [ -s "$T/w.0" ] && [ -s "$T/w.1" ] && [ -s "$T/w.2" ] && [ -s "$T/w.3" ] && { started=1; break; }
  sleep 0.2
done
# A ddprun (its argv holds the marker) or a process of the job (its environment holds it: the
# pids in w.RANK are the workers' PID namespace's, see ddprun(1)) still there.
running() {
  pgrep -f -- "$marker" >/dev/null || [ -n "$(marked "DDPRUN_SLURM_MARK=$marker")" ]
}
if [ $started = 1 ] && running; then
  t0=$(date +%s%N)
  client scancel "$job"
  gone=0
  for _ in $(seq 100); do # 10 s
    running || { gone=1; break; }
    sleep 0.1
  done
  ms=$((($(date +%s%N) - t0) / 1000000))
  if [ $gone = 1 ]; then
    ok "scancel: ddprun and its 4 workers gone ${ms} ms after scancel"
  else
    fail "scancel: still running after ${ms} ms: $(pgrep -af -- "$marker"; marked "DDPRUN_SLURM_MARK=$marker")"
  fi
else
  fail "scancel: the job's workers did not start (job '$job'); $(cat "$T/o5.sbatch" "$T/o5" 2>&1)"
fi

# 6. Elastic over etcd: the node serving the workers' store dies; the other two finish.
if [ -z "$train" ] || ! command -v etcd >/dev/null ||
   [ ! -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
   "$ddprun" --rdzv-backend etcd --rdzv-endpoint 127.0.0.1:1 --nnodes 1:2 true 2>&1 | grep -q "no etcd backend"; then
  echo "skip 6: no ddp-train, etcd, libcurl or Fashion-MNIST"
else
  # Started and answering with a leader before any ddprun asks it (it used to be started in
  # the background and raced the agents: "no etcd member answered in 0.0 s").
  etcd_cluster_start "$T/etcd" "${ns[0]}:${addr[0]}:2379:2380" ||
    fail "elastic over etcd: etcd did not come up: $(tail -n 5 "$T/etcd/m0/log")"
  daemons+=("${ETCD_PIDS[@]}")
  client timeout 200 srun -N3 --ntasks-per-node=1 --chdir="$T" "$ddprun" --nnodes 2:3 \
    --rdzv-backend etcd --rdzv-endpoint "${addr[0]}:2379" --rdzv-id "elastic$tag" \
    --rdzv-conf heartbeat_timeout=5,last_call_timeout=2 --max-restarts 1 --nproc-per-node 1 \
    "$train" --device cpu --zero 2 --hidden 128 --global-batch 384 --micro-batch 64 --epochs 4 \
    --timeout-ms 10000 --checkpoint-dir "$T/ck" --checkpoint-every 40 --resume auto \
    >"$T/o6" 2>&1 &
  step=$!
  victim=
  for _ in $(seq 1200); do # 120 s
    [ -e "$T/ck/step-000000000040/manifest.json" ] && break
    sleep 0.1
  done
  at=$(grep -o "round 0: node rank 0 of 3: serving the workers' store at [0-9.]*" "$T/o6" | grep -o '[0-9.]*$')
  for ((i = 1; i <= n; i++)); do [ "${addr[$i]}" = "$at" ] && victim=$i; done
  if [ -n "$victim" ] && [ -e "$T/ck/step-000000000040/manifest.json" ]; then
    # That node's ddprun only (not its slurmd): its workers die with it.
    for p in $(ip netns pids "${ns[$victim]}"); do
      [ "$(cat /proc/$p/comm 2>/dev/null)" = ddprun ] && kill -KILL "$p"
    done
    timeout 200 tail --pid=$step -f /dev/null
    wait $step
    if [ "$(grep -c "ddprun: job succeeded after 1 restart" "$T/o6")" = 2 ] &&
       grep -q "round 1: node rank 0 of 2: serving the workers' store" "$T/o6" &&
       grep -q "resuming from .* at step" "$T/o6" && grep -q "2 ranks, ZeRO-2, adamw: test accuracy" "$T/o6"; then
      ok "srun -N3 elastic over etcd: snode$victim (serving the store) killed after step 40; $(grep -o "2 ranks, ZeRO-2, adamw: test accuracy [0-9.]*%" "$T/o6" | head -1) on the other two"
    else
      fail "elastic over etcd: victim snode$victim; $(grep -v "step [0-9]*/" "$T/o6" | tail -n 25)"
    fi
  else
    fail "elastic over etcd: no checkpoint of step 40 or no node serving the store ('$at'); $(tail -n 20 "$T/o6")"
    kill $step 2>/dev/null
  fi
fi

[ $fails = 0 ]
