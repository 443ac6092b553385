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
LOG_TAG=slurm-ci
# shellcheck source=.ci/slurm-common.sh
. "$(dirname "$0")/slurm-common.sh"

up() {
    local start=$SECONDS
    install_slurm
    mkdir -p "$RUN" /run/munge /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
    chown munge:munge /run/munge
    chmod 0755 /run/munge

    local host cpus mem
    host=$(hostname)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048 ))
    cat > "$CONF" <<CONF
ClusterName=tacl-ci
SlurmctldHost=${host}(127.0.0.1)
# a requeued job may start again after cred_expire + 1 s (default 120 s)
AuthInfo=cred_expire=10
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$(shared_conf)
NodeName=${host} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=60 State=UP
# a partition that only takes jobs of one account (for the preflight test)
PartitionName=ci-acct Nodes=ALL Default=NO MaxTime=60 AllowAccounts=tacl State=UP
CONF
    log "starting munged"
    if ! alive /run/munge/munged.pid; then
        runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    fi
    wait_for 20 "munge" bash -c 'timeout 5 munge -n | timeout 5 unmunge'
    log "starting slurmctld"
    /usr/sbin/slurmctld
    wait_for 60 "scontrol ping" bash -c 'timeout 5 scontrol ping | grep -q UP'
    log "starting slurmd"
    /usr/sbin/slurmd
    wait_for 60 "an idle node" bash -c 'timeout 5 sinfo -h -o %T | grep -q idle'
    log "up in $((SECONDS - start)) s: $(timeout 10 sinfo -h -o '%P %D %T %c cpus %m MB')"
}

down() {
    stop_pids "$RUN/slurmd.pid" "$RUN/slurmctld.pid" /run/munge/munged.pid
}

logs() {  # why the cluster is not up: the tail of each daemon's log
    for f in /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log /var/log/munge/munged.log; do
        [ -f "$f" ] && { echo "--- $f (last 30 lines)"; tail -n 30 "$f"; }
    done
    command -v sinfo >/dev/null && { echo "--- sinfo"; timeout 10 sinfo 2>&1 || true; }
    return 0
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    logs) logs ;;
    *) echo "usage: $0 up|down|logs" >&2; exit 2 ;;
esac
