#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for trying `execution_params.mode: slurm`
# on a laptop and for the test suite. Needs root (it installs Debian's packages when missing).
#
#   scripts/slurm-dev-cluster.sh up       # install if needed, start munged, slurmctld, slurmd
#   eval "$(scripts/slurm-dev-cluster.sh env)"   # export SLURM_CONF for sbatch, squeue, ...
#   scripts/slurm-dev-cluster.sh status   # the daemons and the node, exit 0 when usable
#   scripts/slurm-dev-cluster.sh down     # stop the daemons (the folder stays, for logs)
#
# Everything lives in $SLURM_DEV_DIR (default /tmp/mmirage-slurm): slurm.conf, state, spool,
# logs and munge's socket. The node advertises SLURM_DEV_CPUS CPUs (default 8, more than the
# machine may have: tasks are not pinned, so small test jobs can run side by side).
set -euo pipefail

DIR=${SLURM_DEV_DIR:-/tmp/mmirage-slurm}
CPUS=${SLURM_DEV_CPUS:-8}
CTLD_PORT=${SLURM_DEV_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_DEV_SLURMD_PORT:-6818}
CONF=$DIR/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket.2
PACKAGES=(slurmctld slurmd slurm-client munge)

say() { echo "slurm-dev-cluster: $*" >&2; }
die() { say "$*"; exit 1; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "SLURM is not installed and installing it needs root: apt-get install ${PACKAGES[*]}"
  say "installing ${PACKAGES[*]} (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

write_config() {
  local host
  host=$(hostname -s)
  mkdir -p "$DIR"/{state,spool,log,munge}
  chmod 700 "$DIR/munge"
  cat >"$CONF" <<EOF
# Written by scripts/slurm-dev-cluster.sh: one node, everything as root, no accounting daemon.
ClusterName=mmirage-dev
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# Containers have no usable cgroups: track processes by their parent, pin nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node may claim more CPUs and memory than the machine has (small test jobs side by side).
SlurmdParameters=config_overrides
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol for an hour (there is no sacct here).
MinJobAge=3600
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
  running "$DIR/munge/munged.pid" && return 0
  local key=$DIR/munge/munge.key
  [ -f "$key" ] || { dd if=/dev/urandom of="$key" bs=1024 count=1 status=none; chmod 400 "$key"; }
  # --force: munged refuses to run as root otherwise; this cluster is a developer's sandbox.
  munged --force --key-file="$key" --socket="$MUNGE_SOCKET" --pid-file="$DIR/munge/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed"
}

wait_for_node() {
  local i state
  for i in $(seq 1 60); do
    state=$(SLURM_CONF=$CONF sinfo -h -N -o '%t' 2>/dev/null | head -n 1 || true)
    case "$state" in
      idle|mix|alloc) return 0 ;;
      down*|drain*|fail*) SLURM_CONF=$CONF scontrol update nodename="$(hostname -s)" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  die "the node did not come up (state '${state:-none}'); see $DIR/log/slurmctld.log and slurmd.log"
}

up() {
  install_packages
  write_config
  start_munge
  running "$DIR/slurmctld.pid" || slurmctld -f "$CONF"
  running "$DIR/slurmd.pid" || slurmd -f "$CONF"
  wait_for_node
  say "up: one node, $CPUS CPUs, partition debug (logs in $DIR/log)"
  echo "export SLURM_CONF=$CONF"
}

down() {
  local pidfile
  for pidfile in "$DIR/slurmd.pid" "$DIR/slurmctld.pid" "$DIR/munge/munged.pid"; do
    if running "$pidfile"; then
      kill "$(cat "$pidfile")"
      for _ in $(seq 1 50); do running "$pidfile" || break; sleep 0.1; done
    fi
  done
  say "down (logs kept in $DIR/log)"
}

status() {
  local ok=0 name
  for name in munge/munged slurmctld slurmd; do
    if running "$DIR/$name.pid"; then say "${name##*/}: running"; else say "${name##*/}: stopped"; ok=1; fi
  done
  [ "$ok" = 0 ] && SLURM_CONF=$CONF sinfo -N -l >&2
  return "$ok"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) die "usage: $0 up|down|status|env" ;;
esac
