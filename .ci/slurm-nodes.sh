#!/usr/bin/env bash
# A real two-node SLURM cluster on this one machine, for tests/test_slurm_nodes.py (root; Linux network, UTS
# and mount namespaces; Debian's slurm-wlm 22.05 + munge, installed when missing). It lives beside the
# single-node cluster of .ci/slurm.sh and touches nothing of it: its own namespaces, munged, state and config.
#   .ci/slurm-nodes.sh up                 start it (a leftover of an earlier run is taken down first)
#   .ci/slurm-nodes.sh down               stop every process in its namespaces, daemons and jobs, by pid;
#                                         delete the namespaces (and with them the link between the nodes)
#   .ci/slurm-nodes.sh logs               the tail of each daemon's log, and sinfo
#   .ci/slurm-nodes.sh stop-slurmd NODE   stop NODE's slurmd (a node that no longer answers)
#   .ci/slurm-nodes.sh start-slurmd NODE  start it again and wait until the node is idle
#   .ci/slurm-nodes.sh login CMD...       run CMD where jobs are submitted from (node01's network namespace,
#                                         SLURM_CONF set): `.ci/slurm-nodes.sh login sinfo`
# The nodes, node01 (10.250.0.1) and node02 (10.250.0.2), are one network namespace each, joined by a veth
# pair whose two ends are both called hsn0 (one GLOO_SOCKET_IFNAME serves every node). Each node's daemons,
# and the job steps they start, see the node's own host name (UTS namespace) and an /etc/hosts that names
# both nodes (a mount namespace binds it over /etc/hosts), as a cluster's DNS would. slurmctld runs on
# node01, munged in node01's network namespace with its socket in $RUN/munge. Partition "ci", as on the
# single-node cluster, so profiles/slurm-ci serves both; no accounting (squeue; MinJobAge keeps finished jobs).
# $RUN/cluster.json tells the tests where the cluster is; it exists only while the cluster is up.
set -euo pipefail
RUN=${TACL_SLURM_NODES_RUN:-/run/tacl-slurm-nodes}
CONF=$RUN/slurm.conf
NODES=(node01 node02)
SUBNET=10.250.0  # a private /24 that only these namespaces use
IFNAME=hsn0
CPUS=2
MEM_MB=6000
LOG_TAG=slurm-nodes
# shellcheck source=.ci/slurm-common.sh
. "$(dirname "$0")/slurm-common.sh"

netns() { echo "tacl-ci-$1"; }  # the network namespace of node $1
address() { echo "$SUBNET.$(( $(index "$1") + 1 ))"; }
index() { local i; for i in "${!NODES[@]}"; do [ "${NODES[$i]}" = "$1" ] && { echo "$i"; return; }; done; return 1; }
login() { nsenter --net="/run/netns/$(netns "${NODES[0]}")" env SLURM_CONF="$CONF" "$@"; }

write_config() {
    local node
    mkdir -p "$RUN/state" "$RUN/log" "$RUN/munge"
    for node in "${NODES[@]}"; do mkdir -p "$RUN/spool/$node"; done
    chown munge:munge "$RUN/munge"
    chmod 0755 "$RUN/munge"  # (0700: the other namespaces' clients get "Socket is inaccessible")
    {
        echo "127.0.0.1 localhost"
        for node in "${NODES[@]}"; do echo "$(address "$node") $node"; done
    } > "$RUN/hosts"
    cat > "$CONF" <<CONF
ClusterName=tacl-nodes
SlurmctldHost=${NODES[0]}($(address "${NODES[0]}"))
# munged's socket of this cluster; a requeued job may start again after cred_expire + 1 s
AuthInfo=socket=$RUN/munge/munge.socket,cred_expire=10
StateSaveLocation=$RUN/state
SlurmdSpoolDir=$RUN/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$RUN/log/slurmctld.log
SlurmdLogFile=$RUN/log/slurmd-%n.log
SlurmdParameters=config_overrides
# a node whose slurmd stops answering: "not responding" within about 15 s, DOWN after 10 s more (default 300 s)
SlurmdTimeout=10
$(shared_conf)
CONF
    for node in "${NODES[@]}"; do
        echo "NodeName=$node NodeAddr=$(address "$node") NodeHostname=$node CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
    done >> "$CONF"
    echo "PartitionName=ci Nodes=ALL Default=YES MaxTime=60 State=UP" >> "$CONF"
}

make_network() {
    local first second node
    first=$(netns "${NODES[0]}") second=$(netns "${NODES[1]}")
    for node in "${NODES[@]}"; do ip netns add "$(netns "$node")"; done
    ip -n "$first" link add "$IFNAME" type veth peer name "$IFNAME" netns "$second"
    for node in "${NODES[@]}"; do
        ip -n "$(netns "$node")" link set lo up
        ip -n "$(netns "$node")" addr add "$(address "$node")/24" dev "$IFNAME"
        ip -n "$(netns "$node")" link set "$IFNAME" up
    done
}

in_node() {  # in_node NODE COMMAND: a shell command in NODE's namespaces (its host name, its /etc/hosts)
    # (nsenter --net, not `ip netns exec`: that mounts a fresh /sys, where slurmd finds no cgroup mounts)
    nsenter --net="/run/netns/$(netns "$1")" unshare --uts --mount --propagation private \
        sh -c "mount --bind $RUN/hosts /etc/hosts && hostname $1 && $2"
}

start_slurmd() {  # (the daemon forks; its pid is in $RUN/slurmd-NODE.pid)
    in_node "$1" "exec /usr/sbin/slurmd -N $1 -f $CONF"
}

node_state() {  # node_state NODE: its state as sinfo shows it (idle, idle*, down*, ...)
    login timeout 5 sinfo -h -n "$1" -N -o %t
}

idle() { [ "$(node_state "$1")" = idle ]; }
munge_answers() { timeout 5 munge -S "$RUN/munge/munge.socket" -n | timeout 5 unmunge -S "$RUN/munge/munge.socket"; }
controller_answers() { login timeout 5 scontrol ping | grep -q UP; }

up() {
    local start=$SECONDS node
    install_slurm
    down  # (what an earlier run left)
    write_config
    make_network
    log "starting munged (node01's network namespace)"
    nsenter --net="/run/netns/$(netns "${NODES[0]}")" runuser -u munge -- /usr/sbin/munged \
        --socket="$RUN/munge/munge.socket" --pid-file="$RUN/munge/munged.pid" \
        --seed-file="$RUN/munge/munged.seed" --log-file="$RUN/munge/munged.log"
    wait_for 20 "munge" munge_answers
    log "starting slurmctld on ${NODES[0]}, slurmd on ${NODES[*]}"
    in_node "${NODES[0]}" "exec /usr/sbin/slurmctld -f $CONF"
    for node in "${NODES[@]}"; do start_slurmd "$node"; done
    wait_for 30 "slurmctld on ${NODES[0]}" controller_answers
    for node in "${NODES[@]}"; do wait_for 60 "$node to be idle" idle "$node"; done
    local nodes=()
    for node in "${NODES[@]}"; do
        nodes+=("\"$node\": {\"netns\": \"$(netns "$node")\", \"address\": \"$(address "$node")\"}")
    done
    printf '{"conf": "%s", "login_netns": "%s", "ifname": "%s", "script": "%s", "nodes": {%s}}\n' "$CONF" \
        "$(netns "${NODES[0]}")" "$IFNAME" "$(realpath "$0")" "$(IFS=,; echo "${nodes[*]}")" > "$RUN/cluster.json"
    log "up in $((SECONDS - start)) s: $(login timeout 10 sinfo -h -N -o '%N %t %c cpus %m MB' | paste -sd ' ')"
}

down() {
    local node pids=()
    rm -f "$RUN/cluster.json"
    stop_pids "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid" "$RUN/munge/munged.pid"
    for node in "${NODES[@]}"; do  # whatever else runs in the nodes' namespaces: job steps, a test's srun
        [ -e "/run/netns/$(netns "$node")" ] && mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$(netns "$node")")
    done
    if [ "${#pids[@]}" -gt 0 ]; then
        log "stopping what still runs on the nodes: ${pids[*]}"
        kill "${pids[@]}" 2>/dev/null || true
        stop_wait "${pids[@]}"
    fi
    for node in "${NODES[@]}"; do
        [ -e "/run/netns/$(netns "$node")" ] && ip netns delete "$(netns "$node")"
    done
    rm -rf "$RUN/state" "$RUN/spool"
}

node_down() {
    index "$1" >/dev/null || { log "no node $1 (nodes: ${NODES[*]})"; return 2; }
    stop_pids "$RUN/slurmd-$1.pid"
}

node_up() {
    index "$1" >/dev/null || { log "no node $1 (nodes: ${NODES[*]})"; return 2; }
    alive "$RUN/slurmd-$1.pid" || start_slurmd "$1"
    wait_for 60 "$1 to be idle" idle "$1"
}

logs() {
    local f
    for f in "$RUN"/log/*.log "$RUN/munge/munged.log"; do
        [ -f "$f" ] && { echo "--- $f (last 30 lines)"; tail -n 30 "$f"; }
    done
    [ -e "/run/netns/$(netns "${NODES[0]}")" ] && { echo "--- sinfo"; login timeout 10 sinfo 2>&1 || true; }
    return 0
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    logs) logs ;;
    stop-slurmd) node_down "${2:?node}" ;;
    start-slurmd) node_up "${2:?node}" ;;
    login) shift; login "$@" ;;
    *) echo "usage: $0 up|down|logs|stop-slurmd NODE|start-slurmd NODE|login CMD..." >&2; exit 2 ;;
esac
