#!/usr/bin/env bash
# local-cluster.sh -- a real, two-node Slurm cluster on this single machine.
#
#   bash slurm/local-cluster.sh up       # install (if needed) and start it
#   bash slurm/local-cluster.sh up --fabric FILE|PRESET [--nodes N]
#                                        # the same, each node in its own network
#   bash slurm/local-cluster.sh status   # sinfo + daemon pids
#   bash slurm/local-cluster.sh down     # stop every daemon it started, remove
#                                        # every namespace, link and qdisc it made
#
# What "up" does, in order:
#   1. installs Debian's slurm-wlm and munge packages if they are missing
#      (needs root; Debian 12 ships Slurm 22.05);
#   2. starts munged (Slurm's authentication daemon) as the munge user;
#   3. renders slurm/local/slurm.conf.in into $MPICOLL_SLURM_DIR/slurm.conf;
#   4. starts one slurmctld and two slurmd daemons, "n1" and "n2", which
#      both run on this host but listen on different ports;
#   5. waits until sinfo reports both nodes idle.
#
# Nothing is installed as a service and nothing under /etc/slurm is changed:
# the daemons get the config with `-f`, the clients with SLURM_CONF. After
# "up", either run the printed `export` line or source $MPICOLL_SLURM_DIR/env,
# then use sbatch/srun/squeue as on any cluster, e.g.
#
#   source /tmp/mpicoll-slurm/env
#   srun -N 2 --ntasks-per-node=2 python -c 'from mpi4py import MPI; ...'
#
# Settings (environment variables, all optional):
#   MPICOLL_SLURM_DIR        state directory        (default /tmp/mpicoll-slurm)
#   MPICOLL_SLURM_PORT       first of 3 TCP ports   (default 16817: slurmctld,
#                            then one per slurmd)
#   MPICOLL_SLURM_CPUS       CPUs per emulated node (default 2)
#   MPICOLL_SLURM_TIMEOUT    seconds to wait for the nodes (default 60)
#   MPICOLL_SLURM_MIN_JOB_AGE  slurm.conf MinJobAge (default 300). With 5,
#                            `sbatch --wait` checks every 2 s instead of after
#                            2, 10, 42, 74 ... s, but misses the exit codes of
#                            array tasks that end early (see local/slurm.conf.in)
# They take effect on a fresh "up"; a cluster that is already up is left as
# it is, so run "down" first to change them.
#
# MPI: slurm.conf sets MpiDefault=pmi2, so a plain `srun python ...` inside
# or outside sbatch gives mpi4py (with the MPICH wheel from PyPI) a single
# MPI_COMM_WORLD over both nodes, and MPI.COMM_TYPE_SHARED groups the ranks
# by emulated node. Jobs need no environment beyond SLURM_CONF.
#
# A shaped fabric (up --fabric FILE|PRESET; docs/fabric.md): each emulated
# node's slurmd runs in its own network namespace ("mpicoll-n1" ...) and its
# own UTS namespace (hostname n1 ...), with a mount namespace whose /etc/hosts
# names the nodes. Each node has one link, a veth pair "eth0" <-> "n<i>" to a
# bridge, and both directions of that link are capped with a tbf qdisc at the
# NIC bandwidth of the fabric (FILE: a fabric JSON as `mpicoll simulate
# --fabric` reads, field nic.bandwidth in bytes/s; or a preset name). The
# bridge, slurmctld and the client commands live in one more namespace,
# "mpicoll-sw", so every address the script makes is inside its own
# namespaces (10.250.0.254 for slurmctld, .1 ... for the nodes) and
# the host's network is untouched: sbatch/srun/sinfo/... on the host reach the
# cluster through wrappers in $MPICOLL_SLURM_DIR/bin (the printed export line
# puts them on PATH). A task prolog points MPICH's inter-node transport (UCX)
# at the node's link: UCX_TLS=tcp,self, UCX_NET_DEVICES=eth0 (and 64/256 KiB
# TCP segments; a job's own setting of any of these wins). Without netns
# capability (not root, no veth/tbf, no unshare) "up --fabric" says so in one
# line and starts the plain cluster instead.
#   --nodes N   emulated nodes (default 2; 4 with --fabric)
# The fabric's private /24 is 10.250.0.0/24 (FABRIC_NET below); the links' MTU
# is 9000 (jumbo frames, as in a datacenter; 1500 would add ~5 % of header
# bytes). The export line also sets MPICOLL_FABRIC, the fabric's name.
#
# "status" exits 0 only when every daemon runs; "down" is safe to repeat.
#
# This script assumes a machine without systemd (it never calls systemctl)
# and that it is the only Slurm on the box. It is meant for dev boxes and CI.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATE=$HERE/local/slurm.conf.in

DIR=${MPICOLL_SLURM_DIR:-/tmp/mpicoll-slurm}
PORT=${MPICOLL_SLURM_PORT:-16817}
CPUS=${MPICOLL_SLURM_CPUS:-2}
TIMEOUT=${MPICOLL_SLURM_TIMEOUT:-60}
MIN_JOB_AGE=${MPICOLL_SLURM_MIN_JOB_AGE:-300}

CONF=$DIR/slurm.conf
ENV_FILE=$DIR/env
FABRIC_DIR=$DIR/fabric                  # present while a shaped fabric is up
FABRIC_NET=10.250.0
FABRIC_MTU=9000
SW=mpicoll-sw                           # the switch namespace: bridge, slurmctld, clients
CLIENTS=(sbatch srun salloc sinfo squeue scancel scontrol sattach sstat sacct sprio)
# The nodes of the cluster that is up (its slurm.conf), else 2 (up --nodes N changes it).
nodes_of_conf() {
    [[ -r $CONF ]] && sed -n 's/^NodeName=\(n[0-9]*\) .*/\1/p' "$CONF"
}
NODES=()
if [[ -r $CONF ]]; then mapfile -t NODES < <(nodes_of_conf); fi
if ((${#NODES[@]} == 0)); then
    for ((i = 1; i <= 2; i++)); do NODES+=("n$i"); done
fi

# munged uses the distribution's default paths, so the stock `munge` and
# `unmunge` commands (and Slurm's auth_munge plugin) find it without options.
MUNGE_RUN=/run/munge
MUNGE_PIDFILE=$MUNGE_RUN/munged.pid
MUNGE_KEY=/etc/munge/munge.key
# Present while the munged that is running is one this script started, so
# "down" stops it but leaves alone a munged that somebody else runs.
MUNGE_OURS=$DIR/run/munged.started-by-local-cluster

# Every client command below talks to *our* cluster. The daemons live in
# /usr/sbin, which a non-login shell (e.g. a CI runner) may not have on PATH.
export SLURM_CONF=$CONF
export PATH=$PATH:/usr/sbin:/sbin

# Progress messages go to stderr, so that stdout of "up" is only the export
# line: `eval "$(bash slurm/local-cluster.sh up)"` works.
log() { echo "[local-cluster] $*" >&2; }
die() { echo "[local-cluster] ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------
# Process helpers. A pid file alone is not proof: the pid may have been reused
# by an unrelated process, so we also check the command name in /proc.
# ---------------------------------------------------------------------------

# alive PID -> true if PID runs. A zombie (exited, not yet reaped by its
# parent -- here often PID 1, which reaps lazily) counts as gone.
alive() {
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && $state != Z ]]
}

# live_pid PIDFILE COMM -> prints the pid if PIDFILE names a running COMM.
live_pid() {
    local pidfile=$1 comm=$2 pid
    [[ -r $pidfile ]] || return 1
    pid=$(tr -dc '0-9' <"$pidfile")
    [[ -n $pid && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm" ]] || return 1
    alive "$pid" || return 1
    echo "$pid"
}

# stop_pid PID [SECONDS] -> SIGTERM, wait, then SIGKILL if still alive.
stop_pid() {
    local pid=$1 wait=${2:-10} i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < wait * 10; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    log "pid $pid ignored SIGTERM, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

# Job step daemons (slurmstepd) of this cluster. They are children of nobody
# we track, but each keeps its node's slurmd log under $DIR/log open, which
# tells them apart from any other Slurm on the machine.
our_stepd_pids() {
    local p fd
    for p in /proc/[0-9]*; do
        [[ "$(cat "$p/comm" 2>/dev/null)" == slurmstepd ]] || continue
        for fd in "$p"/fd/*; do
            if [[ "$(readlink "$fd" 2>/dev/null)" == "$DIR/log/"* ]]; then
                echo "${p#/proc/}"
                break
            fi
        done
    done
}

ctld_pid() { live_pid "$DIR/run/slurmctld.pid" slurmctld; }
slurmd_pid() { live_pid "$DIR/run/slurmd-$1.pid" slurmd; }
munged_pid() { live_pid "$MUNGE_PIDFILE" munged; }

# ---------------------------------------------------------------------------
# Shaped fabric: network + UTS + mount namespaces, veth links, tbf qdiscs
# ---------------------------------------------------------------------------

fabric_on() { [[ -r $FABRIC_DIR/state ]]; }

# sl CMD... -> a Slurm client command, run where slurmctld can be reached:
# in the switch namespace when a fabric is up.
sl() {
    if fabric_on; then ip netns exec "$SW" "$@"; else "$@"; fi
}

node_ns() { echo "mpicoll-$1"; }
node_addr() { echo "$FABRIC_NET.${1#n}"; }

# fabric_capable -> true if this machine can make namespaces, veth links, a
# bridge and tbf qdiscs; else prints why on stdout.
fabric_capable() {
    local probe=mpicoll-probe$$ ok=1
    [[ $(id -u) -eq 0 ]] || { echo "not root"; return 1; }
    if ! command -v ip >/dev/null || ! command -v tc >/dev/null ||
        ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null; then
        echo "ip, tc, unshare or nsenter is missing"
        return 1
    fi
    ip netns add "$probe" 2>/dev/null || { echo "'ip netns add' fails"; return 1; }
    if ! ip -n "$probe" link add pa type veth peer name pb 2>/dev/null; then
        echo "veth links cannot be made"; ok=0
    elif ! ip -n "$probe" link add pbr type bridge 2>/dev/null; then
        echo "bridges cannot be made"; ok=0
    elif ! tc -n "$probe" qdisc add dev pa root tbf rate 1gbit burst 128k latency 50ms \
        2>/dev/null; then
        echo "the tbf qdisc is not available"; ok=0
    elif ! nsenter --net="/run/netns/$probe" unshare --uts --mount true 2>/dev/null; then
        echo "UTS/mount namespaces cannot be made"; ok=0
    fi
    ip netns del "$probe" 2>/dev/null || true
    ((ok))
}

# fabric_params SPEC NODES -> "NAME NIC_BYTES_PER_S" of a fabric JSON or preset, read with
# mpicoll itself (any preset), else (no mpicoll/numpy here) with plain json (files only).
fabric_params() {
    local py
    py=$(command -v "${MPICOLL_PYTHON:-python}" || command -v python3) || die "no python"
    PYTHONPATH=$HERE/..${PYTHONPATH:+:$PYTHONPATH} "$py" - "$1" "$2" <<'EOF'
import json, sys
spec, nodes = sys.argv[1], int(sys.argv[2])
try:
    from mpicoll.simulators.fabric import preset
    f = preset(spec, nodes, 1)
    name, bw = f.name, f.nic.bandwidth
except ImportError:
    try:
        d = json.load(open(spec))
        name, bw = d.get("name", spec), float(d["nic"]["bandwidth"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"[local-cluster] ERROR: --fabric {spec}: not a fabric file: {e}")
except ValueError as e:
    sys.exit(f"[local-cluster] ERROR: --fabric {spec}: {e}")
print(str(name).replace(" ", "_"), repr(float(bw)))
EOF
}

# The wrappers that run the Slurm clients in the switch namespace (the host
# has no route to the fabric). A process already inside one of the cluster's
# namespaces (a job, on a node) runs the real command.
write_wrappers() {
    local cmd real
    mkdir -p "$DIR/bin"
    for cmd in "${CLIENTS[@]}"; do
        real=$(command -v "$cmd") || continue
        cat >"$DIR/bin/$cmd" <<EOF
#!/bin/sh
# mpicoll local cluster (slurm/local-cluster.sh up --fabric): $cmd in the switch namespace.
case "\$(ip netns identify 2>/dev/null)" in
mpicoll-*) exec $real "\$@" ;;
*) exec ip netns exec $SW $real "\$@" ;;
esac
EOF
        chmod +x "$DIR/bin/$cmd"
    done
}

# fabric_up NAME BYTES_PER_S: namespaces, bridge, one capped link per node.
fabric_up() {
    local name=$1 bw=$2 node ns rate burst
    fabric_down_links
    mkdir -p "$FABRIC_DIR"
    # tc wants bits/s; a burst of 1 ms at the rate, at least 128 KiB (a GSO packet's worth).
    rate=$(awk -v b="$bw" 'BEGIN {printf "%.0f", b * 8}')
    burst=$(awk -v b="$bw" 'BEGIN {x = b / 1000; if (x < 131072) x = 131072; printf "%.0f", x}')
    ip netns add "$SW"
    echo "$SW" >>"$FABRIC_DIR/namespaces"
    ip -n "$SW" link set lo up
    ip -n "$SW" link add br0 type bridge
    ip -n "$SW" addr add "$FABRIC_NET.254/24" dev br0
    ip -n "$SW" link set br0 mtu "$FABRIC_MTU" up
    {
        echo "127.0.0.1 localhost"
        echo "$FABRIC_NET.254 $(hostname -s) mpicoll-sw"
    } >"$FABRIC_DIR/hosts"
    for node in "${NODES[@]}"; do
        ns=$(node_ns "$node")
        ip netns add "$ns"
        echo "$ns" >>"$FABRIC_DIR/namespaces"
        ip -n "$ns" link set lo up
        # The node's end is "eth0" inside the node; the switch's end is named after the node.
        ip -n "$SW" link add "$node" mtu "$FABRIC_MTU" type veth peer name eth0 \
            mtu "$FABRIC_MTU" netns "$ns"
        ip -n "$SW" link set "$node" master br0 up
        ip -n "$ns" addr add "$(node_addr "$node")/24" dev eth0
        ip -n "$ns" link set eth0 up
        # Both directions capped: the node's upload (eth0) and its download (its switch port).
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
        tc -n "$SW" qdisc add dev "$node" root tbf rate "$rate" burst "$burst" latency 100ms
        echo "$(node_addr "$node") $node" >>"$FABRIC_DIR/hosts"
    done
    # The task prolog: MPICH's UCX netmod over TCP on the node's link -- never shared memory
    # or loopback between nodes (MPICH's own shared memory still joins a node's ranks).
    # Measured on this 2-core box (docs/fabric.md): UCX's default 8 KiB TCP segments halve a
    # 4 MiB exchange's bandwidth when both directions are busy (66 MB/s each way at 1 Gbit/s;
    # 109 MB/s with 64/256 KiB segments). MPICH busy-polls: with more ranks than cores an 8 B
    # message takes ~3 ms; MPIR_CVAR_ENABLE_HEAVY_YIELD=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1 made
    # it 73 us but hung 3 of 4 hierarchical runs with these segments, so it is not set here.
    # A job's own environment wins over these defaults (the prolog sees it).
    cat >"$FABRIC_DIR/task-prolog.sh" <<EOF
#!/bin/sh
# Written by slurm/local-cluster.sh up --fabric: environment of every task of every job.
echo "export MPIR_CVAR_CH4_NETMOD=\${MPIR_CVAR_CH4_NETMOD:-ucx}"
echo "export UCX_TLS=\${UCX_TLS:-tcp,self}"
echo "export UCX_NET_DEVICES=\${UCX_NET_DEVICES:-eth0}"
echo "export UCX_TCP_TX_SEG_SIZE=\${UCX_TCP_TX_SEG_SIZE:-64k}"
echo "export UCX_TCP_RX_SEG_SIZE=\${UCX_TCP_RX_SEG_SIZE:-256k}"
echo "export MPICOLL_FABRIC=$name"
EOF
    chmod +x "$FABRIC_DIR/task-prolog.sh"
    write_wrappers
    {
        echo "name=$name"
        echo "nic_bytes_per_s=$bw"
        echo "rate_bit=$rate"
        echo "burst=$burst"
        echo "mtu=$FABRIC_MTU"
        echo "net=$FABRIC_NET.0/24"
        echo "nodes=${NODES[*]}"
    } >"$FABRIC_DIR/state"
    log "fabric '$name': ${#NODES[@]} nodes, each in its own namespace, on bridge br0 in $SW;" \
        "links capped at $(awk -v r="$rate" 'BEGIN {printf "%g", r / 1e9}') Gbit/s each way," \
        "MTU $FABRIC_MTU"
}

# Removes every namespace the script made (with them go their veth links, the bridge and
# the qdiscs), the wrappers and the state. Processes still inside would keep a namespace
# alive: stop_slurm runs first.
fabric_down_links() {
    local ns
    if [[ -r $FABRIC_DIR/namespaces ]]; then
        while read -r ns; do
            [[ $ns == mpicoll-* ]] || continue
            if [[ -e /run/netns/$ns ]]; then
                ip netns del "$ns" 2>/dev/null && log "removed namespace $ns (its links and qdiscs)"
            fi
        done <"$FABRIC_DIR/namespaces"
    fi
    rm -rf "${FABRIC_DIR:?}" "${DIR:?}/bin"
}

# fabric_exec NODE CMD... -> CMD as node NODE: its network namespace, a UTS namespace with
# hostname NODE, and a private mount namespace in which /etc/hosts names every node and /sys
# is the node's (its network devices), with the host's /sys/fs/cgroup kept (slurmd needs it;
# `ip netns exec` would hide it).
fabric_exec() {
    local node=$1
    shift
    mkdir -p "$FABRIC_DIR/cgroup"
    # shellcheck disable=SC2016  # $1, $2 are the inner shell's
    nsenter --net="/run/netns/$(node_ns "$node")" unshare --uts --mount --propagation private \
        sh -c 'set -e; hostname "$1"; mount --bind "$2/hosts" /etc/hosts
               mount --rbind /sys/fs/cgroup "$2/cgroup"; mount -t sysfs sysfs /sys
               mount --move "$2/cgroup" /sys/fs/cgroup; shift 2; exec "$@"' \
        sh "$node" "$FABRIC_DIR" "$@"
}

# ---------------------------------------------------------------------------
# 1. Packages
# ---------------------------------------------------------------------------
install_packages() {
    local missing=0 cmd
    for cmd in slurmctld slurmd sinfo sbatch munged munge unmunge; do
        command -v "$cmd" >/dev/null 2>&1 || missing=1
    done
    ((missing)) || return 0
    [[ $(id -u) -eq 0 ]] || die "Slurm/munge are not installed and we are not root"
    log "installing slurm-wlm and munge from apt (log: $DIR/apt.log)"
    # No recommends: we want the daemons and clients, not a mail server.
    # The packages try to start their services; without systemd/init that
    # fails harmlessly ("policy-rc.d denied execution") and we start them.
    if ! {
        apt-get update &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
                slurm-wlm munge
    } >"$DIR/apt.log" 2>&1; then
        tail -n 30 "$DIR/apt.log" >&2
        die "apt-get failed"
    fi
}

# ---------------------------------------------------------------------------
# 2. munged
# ---------------------------------------------------------------------------
start_munge() {
    if munged_pid >/dev/null; then
        log "munged already running (pid $(munged_pid))"
        return 0
    fi
    # munged refuses to start unless its directories belong to the munge user
    # and are not writable by others; the key must be private to munge.
    install -d -o munge -g munge -m 0755 "$MUNGE_RUN"
    install -d -o munge -g munge -m 0700 /var/log/munge /etc/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    if [[ ! -s $MUNGE_KEY ]]; then
        log "creating $MUNGE_KEY"
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$MUNGE_KEY"
        else
            dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
        fi
    fi
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"

    # munged daemonizes itself and writes $MUNGE_PIDFILE.
    runuser -u munge -- /usr/sbin/munged
    mkdir -p "$DIR/run"
    touch "$MUNGE_OURS"
    # Round trip: encode a credential and decode it again (retry briefly in
    # case the daemon is still setting up its socket).
    local i
    for ((i = 0; ; i++)); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        ((i < 50)) || die "munged started but 'munge -n | unmunge' fails (see /var/log/munge)"
        sleep 0.1
    done
    log "munged started (pid $(munged_pid))"
}

stop_munge() {
    local pid
    if pid=$(munged_pid); then
        if [[ -e $MUNGE_OURS ]]; then
            log "stopping munged (pid $pid)"
            stop_pid "$pid"
        else
            log "leaving munged (pid $pid) alone: this script did not start it"
        fi
    fi
    rm -f "$MUNGE_OURS"
}

# ---------------------------------------------------------------------------
# 3. slurm.conf
# ---------------------------------------------------------------------------
# A first job id that differs between "up"s: the seconds since 2026 modulo
# 50 million (Slurm's ids stop at 67,043,328), so ids of an earlier cluster
# are not reused unless it submitted more jobs than seconds have passed since.
first_job_id() {
    echo $(((($(date +%s) - 1767225600) % 50000000 + 50000000) % 50000000 + 1))
}

render_conf() {
    local host addr comm
    # The name Slurm itself finds for this machine; slurmctld only starts if
    # SlurmctldHost matches it, so never hard-code it.
    host=$(hostname -s)
    [[ -r $TEMPLATE ]] || die "missing template $TEMPLATE"

    # Keep the daemons off the network when we safely can: with NoInAddrAny /
    # NoCtldInAddrAny Slurm binds to whatever the host name resolves to, which
    # only works for us (clients use 127.0.0.1) if that is a loopback address.
    addr=$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 {print $1}') || true
    local ctld_addr=127.0.0.1 lines="" node i=0 prolog
    prolog="# TaskProlog: none (the plain cluster; up --fabric sets one)"
    if fabric_on; then
        # Every daemon is alone in its namespace, which holds only the fabric's addresses.
        ctld_addr=$FABRIC_NET.254
        comm="# shaped fabric: every daemon listens on its own namespace's addresses"
        prolog="TaskProlog=$FABRIC_DIR/task-prolog.sh"
    elif [[ $addr == 127.* ]]; then
        comm="CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"
    else
        comm="# $host resolves to '${addr:-nothing}': listen on all interfaces"
    fi
    for node in "${NODES[@]}"; do
        i=$((i + 1))
        if fabric_on; then
            lines+="NodeName=$node NodeHostname=$node NodeAddr=$(node_addr "$node")"
        else
            lines+="NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1"
        fi
        lines+=" Port=$((PORT + i)) CPUs=$CPUS Sockets=1 CoresPerSocket=$CPUS ThreadsPerCore=1"
        lines+=" State=UNKNOWN\n"
    done
    sed -e "s|@DIR@|$DIR|g" \
        -e "s|@HOST@|$host|g" \
        -e "s|@CTLD_PORT@|$PORT|g" \
        -e "s|@CTLD_ADDR@|$ctld_addr|g" \
        -e "s|@NODE_LINES@|${lines%\\n}|" \
        -e "s|@NODE_RANGE@|n[1-${#NODES[@]}]|g" \
        -e "s|@TASK_PROLOG@|$prolog|" \
        -e "s|@CPUS@|$CPUS|g" \
        -e "s|@MIN_JOB_AGE@|$MIN_JOB_AGE|g" \
        -e "s|@COMM_PARAMS@|$comm|g" \
        -e "s|@FIRST_JOB_ID@|$(first_job_id)|g" \
        -e "s|@EPILOG@|$HERE/local/epilog.sh|g" \
        "$TEMPLATE" >"$CONF"

    # What a shell (or a CI step, or a test) needs to use the cluster.
    {
        echo "# Source this file to use the mpicoll local Slurm cluster."
        echo "export SLURM_CONF=$CONF"
        if fabric_on; then export_path_line; fi
    } >"$ENV_FILE"
}

# With a fabric, the client wrappers go first on PATH ($PATH is expanded by whoever evals it).
export_path_line() {
    # shellcheck disable=SC2016
    printf 'export PATH="%s:$PATH" MPICOLL_FABRIC=%s\n' "$DIR/bin" \
        "$(sed -n 's/^name=//p' "$FABRIC_DIR/state")"
}

# ---------------------------------------------------------------------------
# 4./5. Slurm daemons
# ---------------------------------------------------------------------------

# Node states as "n1:idle n2:idle" (empty if slurmctld does not answer).
node_states() {
    sl timeout 10 sinfo -h -N -o '%N:%T' 2>/dev/null | sort -u | tr '\n' ' ' || true
}

# nodes_in STATE... -> true if every node is in one of the given states.
nodes_in() {
    local states node state ok
    states=" $(node_states)"
    for node in "${NODES[@]}"; do
        ok=0
        for state in "$@"; do
            [[ $states == *" $node:$state "* ]] && ok=1
        done
        ((ok)) || return 1
    done
}

dump_logs() {
    local f
    for f in "$DIR"/log/*.log; do
        [[ -e $f ]] || continue
        echo "----- $f (last 40 lines) -----" >&2
        tail -n 40 "$f" >&2
    done
}

# Are all three Slurm daemons alive?
daemons_running() {
    local node
    ctld_pid >/dev/null || return 1
    for node in "${NODES[@]}"; do
        slurmd_pid "$node" >/dev/null || return 1
    done
}

start_slurm() {
    local node deadline
    # Fresh state every time: no jobs or node states left over from a
    # previous run. Only our own sub-directories are removed.
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/log"
    mkdir -p "$DIR/state" "$DIR/log" "$DIR/run"
    for node in "${NODES[@]}"; do
        mkdir -p "$DIR/spool/$node"
    done

    # Both daemons fork into the background and write their pid files.
    # slurmctld -c: start with a clean job/node state.
    if fabric_on; then
        ip netns exec "$SW" slurmctld -f "$CONF" -c
        for node in "${NODES[@]}"; do
            fabric_exec "$node" slurmd -f "$CONF" -N "$node"
        done
    else
        slurmctld -f "$CONF" -c
        for node in "${NODES[@]}"; do
            slurmd -f "$CONF" -N "$node"
        done
    fi

    log "waiting up to ${TIMEOUT}s for ${NODES[*]} to become idle"
    deadline=$((SECONDS + TIMEOUT))
    until nodes_in idle; do
        if ((SECONDS >= deadline)) || ! daemons_running; then
            echo "[local-cluster] ERROR: cluster did not come up; node states: $(node_states)" >&2
            dump_logs
            return 1
        fi
        sleep 0.5
    done
}

# wait_gone SECONDS PID... -> wait until none of the pids is alive.
wait_gone() {
    local wait=$1 i pid running
    shift
    for ((i = 0; i < wait * 10; i++)); do
        running=0
        for pid in "$@"; do
            alive "$pid" && running=1
        done
        ((running)) || return 0
        sleep 0.1
    done
    return 1
}

# tree PID -> PID and all its descendants (children first is not needed:
# everything gets SIGKILL at once).
tree() {
    local child
    echo "$1"
    for child in $(pgrep -P "$1" 2>/dev/null || true); do
        tree "$child"
    done
}

stop_slurm() {
    local pid node jobs=() pids=() stepds=() i asked=0
    # Note the daemons' pids first: a slurmd deletes its pid file as soon as
    # it is told to shut down, which may be well before it has exited.
    if pid=$(ctld_pid); then pids+=("$pid"); fi
    for node in "${NODES[@]}"; do
        if pid=$(slurmd_pid "$node"); then pids+=("$pid"); fi
    done

    if ctld_pid >/dev/null; then
        # 1. Cancel every job so that no job processes outlive the daemons,
        #    and wait (bounded) until slurmctld has forgotten them and the
        #    job step daemons have exited.
        mapfile -t jobs < <(sl timeout 10 squeue -h -o %A 2>/dev/null || true)
        if ((${#jobs[@]} > 0)); then
            log "cancelling ${#jobs[@]} job(s)"
            sl timeout 10 scancel "${jobs[@]}" 2>/dev/null || true
            for ((i = 0; i < 60; i++)); do
                [[ -z "$(sl timeout 10 squeue -h 2>/dev/null)" ]] && break
                sleep 0.5
            done
        fi
        mapfile -t stepds < <(our_stepd_pids)
        wait_gone 10 "${stepds[@]+"${stepds[@]}"}" || true
        # 2. Ask slurmctld to shut the cluster down: it tells every slurmd
        #    to exit, then exits itself.
        sl timeout 15 scontrol shutdown >/dev/null 2>&1 && asked=1
    fi

    # 3. Give that orderly shutdown a few seconds; whatever daemon is still
    #    alive then (or at once, if nobody could ask slurmctld) gets SIGTERM,
    #    then SIGKILL.
    if ((asked)); then
        wait_gone 10 "${pids[@]+"${pids[@]}"}" || true
    fi
    for pid in "${pids[@]+"${pids[@]}"}"; do
        alive "$pid" || continue
        log "stopping leftover pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null))"
        stop_pid "$pid" 5
    done
    # slurmstepd ignores SIGTERM; a step daemon that is still around (e.g.
    # slurmctld had already died, so nobody cancelled its job) is killed
    # together with the job processes under it.
    for pid in $(our_stepd_pids); do
        log "killing leftover job step daemon $pid and its processes"
        # shellcheck disable=SC2046
        kill -KILL $(tree "$pid") 2>/dev/null || true
    done
    rm -f "$DIR"/run/slurmctld.pid "$DIR"/run/slurmd-*.pid
}

# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------
cmd_up() {
    local fabric="" nnodes="" why params
    while (($#)); do
        case $1 in
        --fabric) fabric=${2:?--fabric needs a fabric JSON file or a preset name}; shift 2 ;;
        --fabric=*) fabric=${1#--fabric=}; shift ;;
        --nodes) nnodes=${2:?--nodes needs a number}; shift 2 ;;
        --nodes=*) nnodes=${1#--nodes=}; shift ;;
        *) die "up: unknown option '$1' (expected --fabric FILE|PRESET, --nodes N)" ;;
        esac
    done
    [[ -z $nnodes || $nnodes =~ ^[1-9][0-9]?$ ]] || die "--nodes must be 1 ... 99, got '$nnodes'"
    mkdir -p "$DIR"
    # Already up: all daemons alive and every node healthy -- maybe busy with
    # jobs, which must not be killed by a second "up".
    if [[ -r $CONF ]] && daemons_running && nodes_in idle mixed allocated completing; then
        log "already up: $(node_states)"
        if [[ -n $fabric ]] && ! fabric_on; then
            log "(without a fabric: run 'down' first to start it with --fabric $fabric)"
        fi
    else
        install_packages
        [[ $(id -u) -eq 0 ]] || die "starting the daemons needs root"
        # A half-started or crashed cluster is torn down before a fresh start.
        stop_slurm
        fabric_down_links
        NODES=()
        for ((i = 1; i <= ${nnodes:-$([[ -n $fabric ]] && echo 4 || echo 2)}; i++)); do
            NODES+=("n$i")
        done
        if [[ -n $fabric ]]; then
            params=$(fabric_params "$fabric" "${#NODES[@]}") || exit 1
            if why=$(fabric_capable); then
                # shellcheck disable=SC2086  # "NAME BYTES_PER_S"
                fabric_up $params
            else
                log "no shaped fabric on this machine ($why): starting the plain cluster,"                     "whose nodes share the host's network"
            fi
        fi
        start_munge
        render_conf
        if ! start_slurm; then
            # Leave nothing half-running behind.
            stop_slurm
            fabric_down_links
            stop_munge
            exit 1
        fi
        log "up: $(node_states)"
    fi
    log "to use the cluster run the line(s) below, or: source $ENV_FILE"
    echo "export SLURM_CONF=$CONF"
    if fabric_on; then export_path_line; fi
}

cmd_down() {
    stop_slurm
    fabric_down_links
    stop_munge
    log "down"
}

cmd_status() {
    local node pid rc=0
    if pid=$(munged_pid); then echo "munged     pid $pid"; else echo "munged     not running"; rc=1; fi
    if pid=$(ctld_pid); then echo "slurmctld  pid $pid"; else echo "slurmctld  not running"; rc=1; fi
    for node in "${NODES[@]}"; do
        if pid=$(slurmd_pid "$node"); then
            echo "slurmd $node  pid $pid"
        else
            echo "slurmd $node  not running"
            rc=1
        fi
    done
    if fabric_on; then
        echo "fabric     $(tr '\n' ' ' <"$FABRIC_DIR/state")"
    fi
    if ctld_pid >/dev/null; then
        echo "SLURM_CONF=$CONF"
        sl timeout 10 sinfo -N -l || rc=1
    fi
    return $rc
}

case "${1:-}" in
up) shift; cmd_up "$@" ;;
down) cmd_down ;;
status) cmd_status ;;
*)
    echo "usage: $0 up [--fabric FILE|PRESET] [--nodes N] | down | status" >&2
    exit 2
    ;;
esac
