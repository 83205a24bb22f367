#!/bin/bash
# Two-"node" test bed for the multi-node tests (pdsh/ssh and SLURM on loopback), started and stopped by
# tests/test_multinode.py; Debian bookworm as root (install.sh installs openssh-server openssh-client pdsh
# slurmctld slurmd slurm-client munge when missing).
# Throwaway SLURM cluster on one host: munged + slurmctld + two slurmd ("node1", "node2").
#   ./slurmbed.sh up      start everything, wait until both nodes are idle
#   ./slurmbed.sh down    stop everything (by pidfile), verify nothing is left
#   ./slurmbed.sh env     print "export SLURM_CONF=..." for clients (sbatch/srun/squeue/...)
# Knobs: SLURMBED_AUTH=munge|none (default munge), SLURMBED_NODES=2|1
set -euo pipefail
B=${SLURMBED_DIR:-${TMPDIR:-/tmp}/dstk-testbed/slurm}
M=$B/munge
AUTH=${SLURMBED_AUTH:-munge}
NODES=${SLURMBED_NODES:-2}
HOST=$(hostname -s)
CONF=$B/slurm.conf
export SLURM_CONF=$CONF

write_conf() {
  mkdir -p "$B/state" "$B/log" "$B/spool/node1" "$B/spool/node2" "$B/spool/$HOST"
  if [ "$AUTH" = munge ]; then
    authlines="AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$M/munge.socket,cred_expire=${SLURMBED_CRED_EXPIRE:-10}"
  else
    authlines="AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=${SLURMBED_CRED_EXPIRE:-10}"
  fi
  if [ "$NODES" = 2 ]; then
    nodelines="NodeName=node1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17001 CPUs=1 RealMemory=1000 State=UNKNOWN
NodeName=node2 NodeHostname=$HOST NodeAddr=127.0.0.2 Port=17002 CPUs=1 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP"
  else
    nodelines="NodeName=$HOST NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP"
  fi
  cat > "$CONF" <<EOF
ClusterName=bed
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
$authlines
StateSaveLocation=$B/state
SlurmdSpoolDir=$B/spool/%n
SlurmctldPidFile=$B/slurmctld.pid
SlurmdPidFile=$B/slurmd-%n.pid
SlurmctldLogFile=$B/log/slurmctld.log
SlurmdLogFile=$B/log/slurmd-%n.log
MailProg=/bin/true
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$B/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=30
KillWait=5
InactiveLimit=0
SlurmdTimeout=30
SlurmctldTimeout=30
$nodelines
EOF
  : > "$B/plugstack.conf"
}

start_munge() {
  mkdir -p "$M"; chmod 755 "$M"      # munged insists the socket dir is o+x
  [ -f "$M/munge.key" ] || { mungekey --create --keyfile="$M/munge.key"; chmod 400 "$M/munge.key"; }
  munged --socket="$M/munge.socket" --key-file="$M/munge.key" --pid-file="$M/munged.pid" \
         --log-file="$M/munged.log" --seed-file="$M/munged.seed"
}

up() {
  write_conf
  [ "$AUTH" = munge ] && start_munge
  slurmctld -f "$CONF"
  if [ "$NODES" = 2 ]; then
    slurmd -f "$CONF" -N node1
    slurmd -f "$CONF" -N node2
  else
    slurmd -f "$CONF"
  fi
  # wait until every node is idle
  for i in $(seq 100); do
    st=$(sinfo -h -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')
    [ "$st" = "idle " ] && break
    sleep 0.2
  done
  sinfo -N -o '%N %T %c %O' || true
}

alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1; [[ $st != Z* ]]; }

killpid() {  # killpid pidfile [signal]
  local f=$1 pid t0=$(date +%s.%N)
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill "${2:--TERM}" "$pid" 2>/dev/null || true
  # alive() ignores zombies: PID 1 in this container reaps orphans only every ~2s
  for i in $(seq 100); do alive "$pid" || break; sleep 0.05; done
  alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$f"
  echo "stopped $(basename "$f" .pid) in $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')s"
}

down() {
  scancel --user=root 2>/dev/null || true   # give running steps a chance to go away cleanly
  for f in "$B"/slurmd-*.pid; do killpid "$f"; done
  killpid "$B/slurmctld.pid"
  killpid "$M/munged.pid"
  # slurmstepd normally exits with its job; report anything still around
  if ps -eo pid,stat,args | awk '$2 !~ /^Z/' | grep -E '[s]lurm(ctld|d|stepd)|[m]unged'; then echo "LEFTOVERS above"; else echo "nothing left"; fi
}

case "${1:-}" in
  up) up;; down) down;; conf) write_conf; cat "$CONF";;
  env) echo "export SLURM_CONF=$CONF";;
  *) echo "usage: $0 up|down|conf|env"; exit 2;;
esac
