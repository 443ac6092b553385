# What the CI's SLURM clusters share (sourced by .ci/slurm.sh and .ci/slurm-nodes.sh; needs LOG_TAG set).

log() { echo "[$LOG_TAG] $*" >&2; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...  (the command itself must be bounded: `timeout`)
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    while [ "$SECONDS" -lt "$end" ]; do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.25
    done
    log "timed out after ${limit}s waiting for $what"
    return 1
}

install_slurm() {  # Debian's slurm-wlm and munge, and munge's key
    if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
        log "installing slurm-wlm and munge from Debian"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
    fi
    [ -s /etc/munge/munge.key ] || { mungekey --create 2>/dev/null || create-munge-key -f; }
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
}

shared_conf() {  # the slurm.conf lines both clusters share: root daemons, munge, no cgroups, no accounting
    cat <<'CONF'
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
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
# (MinJobAge: finished jobs stay visible to squeue and the tests for an hour; DefMemPerCPU: else a job
# takes a node's whole memory; KillWait, OverTimeLimit: what the tests of job limits expect)
CONF
}

alive() {  # alive PIDFILE: the process the file names runs
    [ -s "$1" ] && running "$(cat "$1")"
}

running() {  # running PID: the process exists and has not exited (a zombie waits only for its parent)
    local state
    state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state:0:1}" != Z ]
}

stop_pids() {  # stop_pids PIDFILE...: SIGTERM to all at once, SIGKILL after 10 s to what is left
    local file pid pids=()
    for file in "$@"; do
        if alive "$file"; then
            pid=$(cat "$file")
            kill "$pid" 2>/dev/null || true
            pids+=("$pid")
            log "stopping $(basename "$file" .pid) ($pid)"
        fi
        rm -f "$file"
    done
    stop_wait "${pids[@]}"
}

stop_wait() {  # stop_wait PID...: wait up to 10 s for them to exit, then SIGKILL
    local pid
    for _ in $(seq 1 40); do
        local left=0
        for pid in "$@"; do running "$pid" && left=1; done
        [ "$left" = 0 ] && return 0
        sleep 0.25
    done
    for pid in "$@"; do
        running "$pid" && { kill -9 "$pid" 2>/dev/null || true; log "killed $pid (SIGKILL)"; }
    done
    return 0
}
