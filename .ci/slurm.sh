#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the end-to-end tests (Debian 12, no systemd).
#   .ci/slurm.sh up     install slurm-wlm + munge (apt), write slurm.conf, start munged, slurmctld, slurmd
#   .ci/slurm.sh down   stop the daemons by their pid files
#   .ci/slurm.sh logs   the tail of each daemon's log (what .ci/run prints when the cluster did not come up)
# The partition is called "ci"; there is no accounting database, so jobs are checked with squeue
# (MinJobAge=3600 keeps finished jobs visible to squeue and the tests for an hour).
set -euo pipefail
RUN=${TACL_SLURM_RUN:-/run/tacl-slurm}
CONF=/etc/slurm/slurm.conf

log() { echo "[slurm-ci] $*" >&2; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    for _ in $(seq 1 $((limit * 4))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.25
    done
    log "timed out after ${limit}s waiting for $what"
    return 1
}

up() {
    local start=$SECONDS
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        log "installing slurm-wlm and munge from Debian"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
    mkdir -p "$RUN" /run/munge /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
    chown munge:munge /run/munge
    chmod 0755 /run/munge
    [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; }
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key

    local host cpus mem
    host=$(hostname)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
    cat > "$CONF" <<CONF
ClusterName=tacl-ci
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job may start again after cred_expire + 1 s (default 120 s)
AuthInfo=cred_expire=10
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MinJobAge=3600
KillWait=5
OverTimeLimit=0
ReturnToService=2
MpiDefault=none
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=60 State=UP
# a partition that only takes jobs of one account (for the preflight test)
PartitionName=ci-acct Nodes=ALL Default=NO MaxTime=60 AllowAccounts=tacl State=UP
CONF
    log "starting munged"
    if ! [ -s /run/munge/munged.pid ] || ! kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
        runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    fi
    wait_for 20 "munge" bash -c 'munge -n | unmunge'
    log "starting slurmctld"
    /usr/sbin/slurmctld
    wait_for 60 "scontrol ping" bash -c 'scontrol ping | grep -q UP'
    log "starting slurmd"
    /usr/sbin/slurmd
    wait_for 60 "an idle node" bash -c 'sinfo -h -o %T | grep -q idle'
    log "up in $((SECONDS - start)) s: $(sinfo -h -o '%P %D %T %c cpus %m MB')"
}

stop_pid() {  # stop_pid FILE NAME
    local file=$1 name=$2
    if [ -s "$file" ]; then
        local pid
        pid=$(cat "$file")
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
            kill -9 "$pid" 2>/dev/null || true
            log "stopped $name ($pid)"
        fi
        rm -f "$file"
    fi
}

down() {
    stop_pid "$RUN/slurmd.pid" slurmd
    stop_pid "$RUN/slurmctld.pid" slurmctld
    stop_pid /run/munge/munged.pid munged
}

logs() {  # why the cluster is not up: the tail of each daemon's log
    for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log /var/log/munge/munged.log; do
        [ -f "$f" ] && { echo "--- $f (last 30 lines)"; tail -n 30 "$f"; }
    done
    command -v sinfo >/dev/null && { echo "--- sinfo"; sinfo 2>&1 || true; }
    return 0
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    logs) logs ;;
    *) echo "usage: $0 up|down|logs" >&2; exit 2 ;;
esac
