#!/usr/bin/env bash
# tests/slurm/cluster.sh -- a real SLURM 22.05 test cluster on this one machine.
#
# Usage: tests/slurm/cluster.sh SUBCOMMAND
#   install         apt-get install slurm-wlm munge slurmdbd mariadb-server
#                   (only what is missing; no system service is left running)
#   up              fresh cluster: tears down any previous one, then starts it
#   ensure          like up, but a no-op when `status` already passes
#   down            stop everything we started, remove netns/veths/bridge
#   status          exit 0 iff all daemons run and both nodes are idle
#   healthy         exit 0 iff all daemons run and both nodes respond (busy or not)
#   env             print the exports a client needs (eval "$(cluster.sh env)")
#   exec NODE CMD.. run CMD "on" NODE (its network, UTS and mount namespaces)
#   cut NODE        take NODE's link down (network cut of that node)
#   heal NODE       bring NODE's link back up
#   logs [NAME]     tail the daemon logs
#
# Environment: FSLURM_PROCTRACK=linuxproc (default cgroup) switches the
# nodes to proctrack/cgroup (see below); FSLURM_PREEMPT=qos (default
# partition) makes preemption QOS-based (below); FSLURM_KEEP_ON_FAIL=1 leaves
# a failed `up` running for inspection; FSLURM_STATE moves the state dir.
#
# Design
#   Everything lives in $STATE (/run/forgelm-tui-slurm): slurm.conf and
#   slurmdbd.conf (mode 600), our own munge key + socket, the MariaDB datadir,
#   spool and state dirs, logs, pid files and the hosts file the nodes see.
#   Clients find the cluster through SLURM_CONF (see `env`); nothing under
#   /etc is written, and the host's /etc/hosts is not touched (the controller
#   reaches the nodes by NodeAddr, and srun/sbatch on the host only need
#   SLURM_CONF; only code that wants to resolve "fnode1" *on the host* would
#   need an /etc/hosts entry -- inside the nodes it resolves).
#
#   Host network namespace: munged (own key, own socket, AuthInfo=socket=...
#   in slurm.conf and slurmdbd.conf), mariadbd (skip-networking, unix socket
#   in $STATE/mysql; slurmdbd reaches it through MYSQL_UNIX_PORT, which
#   libmariadb honours when StorageHost=localhost), slurmdbd and slurmctld.
#   slurmctld and slurmdbd run in a UTS namespace of their own with hostname
#   "fctl", so SlurmctldHost/DbdHost do not depend on this machine's name.
#   They listen on the bridge address 10.77.0.1 (ports 6917/6919, so a
#   system slurm on the default ports could not clash).
#
#   Compute nodes fnode1 (10.77.0.11) and fnode2 (10.77.0.12): one slurmd
#   each, in its own network namespace (/run/netns/fslurm-fnodeN, veth
#   "eth0" inside, "fsl-fnodeN" on the bridge "fslurm-br0") plus its own UTS
#   namespace (hostname fnodeN) and mount namespace (with $STATE/hosts
#   bind-mounted on /etc/hosts).  Everything a job runs (slurmstepd and the
#   tasks) inherits those namespaces, so `hostname` says fnodeN and the
#   nodes reach each other over TCP on any port via the bridge.
#
# Measured facts this relies on (Debian 12, slurm-wlm 22.05.8)
#   * slurmd must be started with nsenter --net=/run/netns/X + unshare
#     --uts --mount, NOT `ip netns exec` (that remounts /sys and slurmd
#     22.05 then fails on cgroups even with proctrack/linuxproc).
#   * TaskPlugin=task/none; ProctrackType=proctrack/cgroup with the v1
#     freezer, each slurmd in a cgroup namespace of its own (the default:
#     what most clusters run), or proctrack/linuxproc with no cgroup plugin at
#     all (FSLURM_PROCTRACK=linuxproc).  Under linuxproc slurmstepd signals
#     every descendant of the batch script, srun included, and srun answers
#     SIGTERM with "forcing job termination": SIGKILL to its step's tasks, so
#     nothing in an sbatch+srun job gets a grace at a time limit or scancel
#     (measured; docs/schedulers.md).  SlurmdParameters=config_overrides so
#     CPUs=28 (jobs side by side, mostly idle) and the small RealMemory are
#     taken as configured whatever the machine has.
#   * Per-node SlurmdSpoolDir/SlurmdPidFile/SlurmdLogFile use %n: both
#     slurmds share this filesystem.
#   * KillWait=10, OverTimeLimit=0, InactiveLimit=0, MinJobAge=15.
#     Preemption: preempt/partition_prio, PreemptMode=CANCEL; a job of
#     "urgent" (PriorityTier 10) preempts jobs of "low" (tier 1, GraceTime=5)
#     only (FSLURM_PREEMPT=qos: preempt/qos instead, QOS "low" GraceTime=5
#     and "urgent" Preempt=low, made in slurmdbd before slurmctld starts;
#     partition low then has no GraceTime: a grace of 5 s can only come from
#     the QOS). "debug" (the default) is tier 1 too, with PreemptMode=OFF: a
#     pending job of a higher tier than low's preempts low's jobs to get a
#     single CPU (measured: a debug job at tier 10 waiting for one CPU
#     cancelled the test's preemptible demo 16 s into it), and urgent must
#     not preempt debug's.
#     slurmctld enforces time limits on a ~30 s cycle: --time=1 jobs were
#     ended after 87 s, --time=2 after 143 s; sacct then says TIMEOUT.
#     A scancel'ed job is "CANCELLED by 0" in sacct.  End records reach
#     sacct a moment after the job ends: poll, do not read once.
#   * What slurmstepd sends (proctrack/linuxproc; sender = the step's own
#     slurmstepd, which is the getppid() of every task srun started and of
#     the batch script):
#       time limit, srun step tasks:  SIGTERM, SIGCONT, SIGTERM (within
#         ~25 ms), SIGKILL ~9.6 s later (KillWait);
#       time limit, batch script:     SIGCONT, SIGTERM, SIGKILL ~9.6 s later;
#       scancel (tasks and batch):    SIGCONT, SIGTERM, SIGKILL ~9.6 s later;
#       --signal=USR1@60:   USR1 then CONT to step tasks only, not the batch
#                           script (52 s into a 2 min job: up to 60 s early);
#       --signal=B:USR1@60: CONT then USR1 to the batch script only.
#     Descendants of a task (e.g. python under `bash -c '...; x'`, or the
#     children of a supervisor task) differ between the proctrack plugins:
#       linuxproc (default): they get the same CONT/TERM (si_pid = slurmstepd,
#         NOT their getppid()); but once their parent has exited they are
#         orphans that linuxproc no longer finds: no SIGKILL, they outlive
#         the job, the step stays COMPLETING until slurmstepd gives up on
#         their stdout ("Abandoning IO 60 secs after job shutdown"), and
#         srun says "Timed out waiting for job step to complete".
#       cgroup (FSLURM_PROCTRACK=cgroup): only the tasks themselves (the
#         children of slurmstepd) get CONT/TERM/USR1; descendants get
#         nothing until the task exits, and then SIGKILL at once.
#     In both, `down` kills whatever is left inside the node namespaces.
#   * Debian's /usr/sbin/policy-rc.d (exit 101) stops the packages'
#     postinst from starting munge/mariadb/slurm*; where it is missing we
#     put one in place for the duration of our apt-get.
#   * Every daemon is ours: started by this script, tracked by a pid file
#     in $STATE/run, and `down` also kills whatever still runs inside the
#     node network namespaces (slurmstepd, job tasks) before deleting them.
#     Daemons are orphans reaped by this machine's PID 1, which does so only
#     every 1-2 s; `down` waits for that so `ps` is clean when it returns.
#   * `up` takes 3-6 s here once the packages are installed (12 s seen on a
#     cold first run); `down` about 3 s.
set -euo pipefail

STATE=${FSLURM_STATE:-/run/forgelm-tui-slurm}
[[ $STATE == /?*/?* && $STATE != *..* ]] || { echo "bad FSLURM_STATE '$STATE'" >&2; exit 2; }
CLUSTER=fslurm
CTL_NAME=fctl
BRIDGE=fslurm-br0
NET_PREFIX=10.77.0
CTL_ADDR=$NET_PREFIX.1
NODES=(fnode1 fnode2)
CTLD_PORT=6917
SLURMD_PORT=6918
DBD_PORT=6919
PROCTRACK=${FSLURM_PROCTRACK:-cgroup}  # or linuxproc (see start_slurmd and the header)
PREEMPT=${FSLURM_PREEMPT:-partition}  # or qos (the header)
[[ $PREEMPT == partition || $PREEMPT == qos ]] || { echo "bad FSLURM_PREEMPT '$PREEMPT'" >&2; exit 2; }
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server iproute2 procps)

CONF=$STATE/etc/slurm.conf
DBD_CONF=$STATE/etc/slurmdbd.conf
MUNGE_SOCK=$STATE/munge/munge.socket
MYSQL_DIR=$STATE/mysql
MYSQL_SOCK=$MYSQL_DIR/mysqld.sock
RUN=$STATE/run
LOG=$STATE/log
LOCKFILE=$STATE.lock

export SLURM_CONF=$CONF
KILLED=()  # pids `down` signalled, to wait until they are reaped

T0=${EPOCHREALTIME/./}
say() {  # message with the seconds since the script started
    local us=$((${EPOCHREALTIME/./} - T0))
    printf '[slurm-cluster %d.%01ds] %s\n' $((us / 1000000)) $((us / 100000 % 10)) "$*" >&2
}
die() { say "ERROR: $*"; exit 1; }

need_root() { [[ $(id -u) == 0 ]] || die "must run as root"; }

# --- node naming -----------------------------------------------------------

node_index() {  # fnode2 -> 2
    local i
    for i in "${!NODES[@]}"; do
        [[ ${NODES[$i]} == "$1" ]] && { echo $((i + 1)); return 0; }
    done
    die "unknown node '$1' (nodes: ${NODES[*]})"
}
node_addr() { echo "$NET_PREFIX.$((10 + $(node_index "$1")))"; }
node_netns() { echo "fslurm-$1"; }
node_veth() { echo "fsl-$1"; }

# --- packages --------------------------------------------------------------

missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] ||
            echo "$p"
    done
}

kill_system_daemons() {
    # Only after an install we did: if a postinst started a system daemon
    # anyway (no policy-rc.d honoured), stop it.  Ours never use these files.
    local f pid
    for f in /run/munge/munged.pid /run/mysqld/mysqld.pid /run/slurmctld.pid \
             /run/slurmd.pid /run/slurmdbd.pid; do
        [[ -s $f ]] || continue
        pid=$(<"$f")
        if pid_alive "$pid"; then
            say "stopping system daemon started by the package ($f, pid $pid)"
            kill "$pid" 2>/dev/null || true
            wait_gone "$pid" 15 || kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    if [[ -d /run/systemd/system ]]; then
        systemctl disable --now munge mariadb slurmctld slurmd slurmdbd >/dev/null 2>&1 || true
    fi
}

cmd_install() {
    need_root
    local missing
    missing=$(missing_packages | tr '\n' ' ')
    if [[ -z ${missing// /} ]]; then
        return 0
    fi
    say "installing: $missing"
    local made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        # Keep the postinst scripts from starting system daemons.
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0 out=/tmp/fslurm-apt.log
    # shellcheck disable=SC2086  # word splitting of the package list is wanted
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >"$out" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
        say "apt-get install failed; running apt-get update and retrying"
        apt-get update -qq >>"$out" 2>&1 || true
        rc=0
        # shellcheck disable=SC2086
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >>"$out" 2>&1 || rc=$?
    fi
    if [[ $made_policy == 1 ]]; then rm -f /usr/sbin/policy-rc.d; fi
    [[ $rc == 0 ]] || { tail -n 20 "$out" >&2; die "apt-get install $missing failed (log: $out)"; }
    kill_system_daemons
}

# --- process helpers -------------------------------------------------------

pid_alive() {  # running and not a zombie
    local st
    [[ $1 =~ ^[0-9]+$ ]] || return 1
    st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [[ $st != Z* ]]
}

wait_gone() {  # PID SECONDS
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        pid_alive "$1" || return 0
        sleep 0.1
    done
    return 1
}

pidfile_pid() {  # pidfile -> pid if alive and its comm matches
    local f=$1 comm=$2 pid
    [[ -s $f ]] || return 1
    pid=$(tr -dc '0-9' <"$f")
    pid_alive "$pid" || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm"* ]] || return 1
    echo "$pid"
}

stop_pidfiles() {  # SECS COMM:PIDFILE...: SIGTERM all, wait SECS, SIGKILL the rest
    local secs=$1 spec pid pids=() left i
    shift
    for spec in "$@"; do
        pid=$(pidfile_pid "${spec#*:}" "${spec%%:*}") || continue
        pids+=("$pid")
    done
    [[ ${#pids[@]} -gt 0 ]] || return 0
    KILLED+=("${pids[@]}")
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i <= secs * 10; i++)); do
        left=()
        for pid in "${pids[@]}"; do pid_alive "$pid" && left+=("$pid"); done
        [[ ${#left[@]} -gt 0 ]] || return 0
        sleep 0.1
    done
    say "no exit ${secs}s after SIGTERM: $(ps -o comm= -p "$(IFS=,; echo "${left[*]}")" | tr '\n' ' ')- SIGKILL"
    kill -KILL "${left[@]}" 2>/dev/null || true
    for pid in "${left[@]}"; do wait_gone "$pid" 5 || say "WARNING: pid $pid still there"; done
}

netns_pids() {  # live (non-zombie) processes inside network namespace file $1
    local p
    [[ -e $1 ]] || return 0
    for p in /proc/[0-9]*; do
        # -ef: same device and inode, i.e. the same namespace (no fork)
        if [[ $p/ns/net -ef $1 ]] && pid_alive "${p#/proc/}"; then
            echo "${p#/proc/}"
        fi
    done
    return 0
}

kill_netns_procs() {  # NETNS: SIGKILL whatever is left inside (stepds, tasks)
    local f=/run/netns/$1 pids i
    pids=$(netns_pids "$f")
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2206  # one pid per word
    KILLED+=($pids)
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        pids=$(netns_pids "$f")
        [[ -n $pids ]] || return 0
        sleep 0.1
    done
    say "WARNING: processes left in $1: ${pids//$'\n'/ }"
}

sweep_leftovers() {
    # Safety net for a state dir that lost its pid files (crashed script,
    # rm -rf): our daemons carry $STATE in their command line or SLURM_CONF
    # in their environment.  Only these daemon names are ever considered.
    local p comm args envs pids=()
    for p in /proc/[0-9]*; do
        read -r comm 2>/dev/null <"$p/comm" || continue
        case $comm in
            slurmd | slurmstepd | slurmctld | slurmdbd | munged | mariadbd) ;;
            *) continue ;;
        esac
        pid_alive "${p#/proc/}" || continue
        args=$(tr '\0' '\n' 2>/dev/null <"$p/cmdline") || true
        envs=$'\n'$(tr '\0' '\n' 2>/dev/null <"$p/environ")$'\n' || true
        if [[ $args == *"$STATE/"* || $envs == *$'\n'"SLURM_CONF=$CONF"$'\n'* ]]; then
            pids+=("${p#/proc/}")
        fi
    done
    [[ ${#pids[@]} -gt 0 ]] || return 0
    say "killing leftover daemons: ${pids[*]}"
    KILLED+=("${pids[@]}")
    kill -KILL "${pids[@]}" 2>/dev/null || true
    for p in "${pids[@]}"; do wait_gone "$p" 5 || say "WARNING: pid $p still there"; done
}

wait_reaped() {
    # Our daemons are orphans; this machine's PID 1 reaps them only every
    # second or two.  Wait (up to 10 s) until no zombie of ours is left, so
    # that `ps -ef` right after `down` is clean.
    local p i
    for ((i = 0; i < 100; i++)); do
        for p in "${KILLED[@]}"; do
            [[ -e /proc/$p ]] && break
            p=
        done
        [[ -z ${p:-} ]] && return 0
        sleep 0.1
    done
    say "WARNING: pid $p not reaped yet (zombie)"
}

show_log() {  # NAME FILE
    say "---- last lines of $2 ----"
    tail -n 25 "$2" >&2 2>/dev/null || say "(no log $2)"
}

fail() {  # MESSAGE LOGFILE...
    local f
    say "ERROR: $1"
    shift
    for f in "$@"; do show_log "$f" "$f"; done
    if [[ -n ${IN_UP:-} && -z ${FSLURM_KEEP_ON_FAIL:-} ]]; then
        say "tearing the half-started cluster down (logs kept in $LOG)"
        cmd_down quiet || true
    fi
    exit 1
}

wait_for() {  # SECONDS COMM PIDFILE LOG CMD...: poll CMD until it succeeds
    # Gives up early when the daemon COMM (pid in PIDFILE) has died.
    local secs=$1 comm=$2 pidfile=$3 log=$4 t0=$SECONDS
    shift 4
    while ((SECONDS - t0 < secs)); do
        if ((SECONDS - t0 >= 1)) && ! pidfile_pid "$pidfile" "$comm" >/dev/null; then
            fail "$comm died while starting" "$log"
        fi
        timeout 5 "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    fail "timed out after ${secs}s waiting for $comm" "$log"
}

# --- config ----------------------------------------------------------------

write_files() {
    rm -rf "$STATE"
    mkdir -p "$STATE"/{etc,munge,run,log,ctld,spool}
    chmod 755 "$STATE"

    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        # the controller, also under this machine's own name (the submit
        # host of every job: SLURM_SUBMIT_HOST)
        echo "$CTL_ADDR $CTL_NAME $(hostname -s)"
        local n
        for n in "${NODES[@]}"; do echo "$(node_addr "$n") $n"; done
    } >"$STATE/hosts"
    # No name server is reachable from the node namespaces: a resolver that tries one blocks
    # for its timeouts (torch's TCPStore looks up its own socket's name: 10 s, then it gives
    # up). With none listed, glibc asks 127.0.0.1:53, refused at once.
    echo "options timeout:1 attempts:1" >"$STATE/resolv.conf"

    local nodelines="" n
    for n in "${NODES[@]}"; do
        nodelines+="NodeName=$n NodeAddr=$(node_addr "$n") NodeHostname=$n CPUs=28 RealMemory=1000 State=UNKNOWN"$'\n'
    done
    cat >"$CONF" <<EOF
# Generated by tests/slurm/cluster.sh -- test cluster, do not edit.
ClusterName=$CLUSTER
SlurmctldHost=$CTL_NAME($CTL_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/$PROCTRACK
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=10
OverTimeLimit=0
InactiveLimit=0
MinJobAge=15
PreemptType=$([[ $PREEMPT == qos ]] && echo preempt/qos || echo preempt/partition_prio)
PreemptMode=CANCEL
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_ADDR
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK
JobCompType=jobcomp/none
MailProg=/bin/true
${nodelines}PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=low Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=$([[ $PREEMPT == qos ]] && echo 0 || echo 5)
PartitionName=urgent Nodes=$(IFS=,; echo "${NODES[*]}") MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF

    cat >"$STATE/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF

    (umask 077; cat >"$DBD_CONF" <<EOF
# Generated by tests/slurm/cluster.sh -- test cluster, do not edit.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=$CTL_NAME
DbdAddr=$CTL_ADDR
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DBD_CONF"
}

# --- daemons ---------------------------------------------------------------

start_munge() {
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 600 "$STATE/munge/munge.key"
    munged --key-file="$STATE/munge/munge.key" --socket="$MUNGE_SOCK" \
        --pid-file="$RUN/munged.pid" --log-file="$LOG/munged.log" \
        --seed-file="$STATE/munge/munged.seed" </dev/null >>"$LOG/munged.log" 2>&1 ||
        fail "munged did not start" "$LOG/munged.log"
    wait_for 10 munged "$RUN/munged.pid" "$LOG/munged.log" \
        sh -c "munge -n -S '$MUNGE_SOCK' | unmunge -S '$MUNGE_SOCK'"
}

start_mariadb() {
    mkdir -p "$MYSQL_DIR"
    chown mysql:mysql "$MYSQL_DIR"
    mariadb-install-db --no-defaults --datadir="$MYSQL_DIR/data" --user=mysql \
        --auth-root-authentication-method=socket --skip-test-db \
        >"$LOG/mariadb-install.log" 2>&1 ||
        fail "mariadb-install-db failed" "$LOG/mariadb-install.log"
    touch "$LOG/mysqld.log"
    chown mysql:mysql "$LOG/mysqld.log"
    # No daemon mode in mariadbd: run it in its own session, detached from
    # our stdio, and let it write its own pid file.
    setsid mariadbd --no-defaults --user=mysql --datadir="$MYSQL_DIR/data" \
        --socket="$MYSQL_SOCK" --pid-file="$MYSQL_DIR/mysqld.pid" \
        --skip-networking --log-error="$LOG/mysqld.log" --skip-log-bin \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=16M \
        --innodb-flush-log-at-trx-commit=0 --skip-name-resolve \
        </dev/null >>"$LOG/mysqld.log" 2>&1 &
}

wait_mariadb() {
    wait_for 30 mariadbd "$MYSQL_DIR/mysqld.pid" "$LOG/mysqld.log" \
        mariadb --no-defaults -S "$MYSQL_SOCK" -u root -e 'SELECT 1'
    ln -sf "$MYSQL_DIR/mysqld.pid" "$RUN/mysqld.pid"
}

start_slurmdbd() {
    MYSQL_UNIX_PORT=$MYSQL_SOCK unshare --uts sh -c \
        "hostname $CTL_NAME && exec slurmdbd" \
        </dev/null >>"$LOG/slurmdbd.log" 2>&1 ||
        fail "slurmdbd did not start" "$LOG/slurmdbd.log"
    wait_for 60 slurmdbd "$RUN/slurmdbd.pid" "$LOG/slurmdbd.log" sacctmgr -n list cluster
    sacctmgr -i -Q add cluster "$CLUSTER" >/dev/null ||
        fail "sacctmgr add cluster failed" "$LOG/slurmdbd.log"
    if [[ $PREEMPT == qos ]]; then
        sacctmgr -i -Q add qos low GraceTime=5 PreemptMode=cancel >/dev/null &&
            sacctmgr -i -Q add qos urgent Preempt=low >/dev/null ||
            fail "sacctmgr add qos failed" "$LOG/slurmdbd.log"
    fi
}

start_slurmctld() {
    unshare --uts sh -c "hostname $CTL_NAME && exec slurmctld" \
        </dev/null >>"$LOG/slurmctld.log" 2>&1 ||
        fail "slurmctld did not start" "$LOG/slurmctld.log"
    wait_for 30 slurmctld "$RUN/slurmctld.pid" "$LOG/slurmctld.log" \
        sh -c "scontrol ping | grep -q UP"
}

setup_network() {
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    local n ns veth
    for n in "${NODES[@]}"; do
        ns=$(node_netns "$n")
        veth=$(node_veth "$n")
        ip netns add "$ns"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(node_addr "$n")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via "$CTL_ADDR"
    done
}

node_cgroup() { echo "/sys/fs/cgroup/freezer/fslurm-$1"; }

start_slurmd() {  # NODE
    local n=$1 cg_enter="" cg_mount=""
    mkdir -p "$STATE/spool/$n"
    chmod 755 "$STATE/spool/$n"
    if [[ $PROCTRACK == cgroup ]]; then
        # Each slurmd gets a freezer cgroup of its own (fslurm-fnodeN) as
        # the root of its cgroup namespace, with the freezer hierarchy
        # remounted inside its mount namespace: the two slurmds (and their
        # slurm_fnodeN/uid_0/job_N/step_M trees) cannot see each other, and
        # `down` removes one directory tree per node.
        mkdir -p "$(node_cgroup "$n")"
        cg_enter="echo \$\$ > '$(node_cgroup "$n")/cgroup.procs' && exec"
        cg_mount="umount /sys/fs/cgroup/freezer && mount -t cgroup -o freezer fslurm-freezer /sys/fs/cgroup/freezer &&"
    fi
    sh -c "$cg_enter nsenter --net='/run/netns/$(node_netns "$n")' \
        unshare --uts --mount --cgroup --propagation private sh -c \
        \"hostname $n && mount --bind '$STATE/hosts' /etc/hosts && mount --bind '$STATE/resolv.conf' /etc/resolv.conf && $cg_mount exec slurmd -N $n\"" \
        </dev/null >>"$LOG/slurmd-$n.log" 2>&1 ||
        fail "slurmd on $n did not start" "$LOG/slurmd-$n.log"
}

nodes_idle() {
    local out
    out=$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null) || return 1
    local n
    for n in "${NODES[@]}"; do
        grep -qx "$n idle" <<<"$out" || return 1
    done
}

# --- subcommands -----------------------------------------------------------

cmd_up() {
    need_root
    local t0=$SECONDS
    IN_UP=1
    cmd_install
    cmd_down quiet
    say "state dir $STATE"
    write_files
    start_mariadb
    start_munge
    say "munged up ($MUNGE_SOCK)"
    setup_network
    say "network: $BRIDGE $CTL_ADDR/24, $(for n in "${NODES[@]}"; do printf '%s=%s ' "$n" "$(node_addr "$n")"; done)"
    wait_mariadb
    say "mariadbd up ($MYSQL_SOCK)"
    start_slurmdbd
    say "slurmdbd up, cluster '$CLUSTER' registered"
    start_slurmctld
    say "slurmctld up ($CTL_NAME $CTL_ADDR:$CTLD_PORT)"
    local n
    for n in "${NODES[@]}"; do start_slurmd "$n"; done
    local logs=()
    for n in "${NODES[@]}"; do logs+=("$LOG/slurmd-$n.log"); done
    local i
    for ((i = 0; i < 150; i++)); do
        nodes_idle && break
        sleep 0.2
    done
    nodes_idle || fail "nodes not idle after 30s: $(sinfo -h -N -o '%N %t %E' 2>&1 | tr '\n' ';')" \
        "$LOG/slurmctld.log" "${logs[@]}"
    IN_UP=
    say "nodes idle: ${NODES[*]} (up in $((SECONDS - t0))s)"
    say "clients: eval \"\$($0 env)\""
}

cluster_healthy() {  # daemons alive, config as asked, nodes responding
    local p n out
    for p in "munged:$RUN/munged.pid" "mariadbd:$MYSQL_DIR/mysqld.pid" \
             "slurmdbd:$RUN/slurmdbd.pid" "slurmctld:$RUN/slurmctld.pid"; do
        pidfile_pid "${p#*:}" "${p%%:*}" >/dev/null || return 1
    done
    for n in "${NODES[@]}"; do
        pidfile_pid "$RUN/slurmd-$n.pid" slurmd >/dev/null || return 1
    done
    grep -qx "ProctrackType=proctrack/$PROCTRACK" "$CONF" 2>/dev/null || return 1
    out=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    for n in "${NODES[@]}"; do
        # busy is fine (other tests' jobs); down/drained/unknown is not
        grep -Eqx "$n (idle|mix|alloc|comp)" <<<"$out" || return 1
    done
}

cmd_ensure() {
    # Never restarts a healthy cluster, even a busy one: parallel test
    # workers may be running jobs on it.
    if cluster_healthy; then
        say "already up"
    else
        cmd_up
    fi
}

cmd_down() {
    need_root
    local quiet=${1:-}
    local n
    # The slurm daemons first, then whatever is left in the node netns
    # (slurmstepd, job tasks), then the database and munged they used.
    # (slurmd with a job still completing can sit on SIGTERM: 3 s is enough.)
    stop_pidfiles 3 "slurmd:$RUN/slurmd-${NODES[0]}.pid" "slurmd:$RUN/slurmd-${NODES[1]}.pid" \
        "slurmctld:$RUN/slurmctld.pid" "slurmdbd:$RUN/slurmdbd.pid"
    for n in "${NODES[@]}"; do kill_netns_procs "$(node_netns "$n")"; done
    stop_pidfiles 15 "mariadbd:$MYSQL_DIR/mysqld.pid" "munged:$RUN/munged.pid"
    sweep_leftovers
    wait_reaped
    for n in "${NODES[@]}"; do
        ip netns del "$(node_netns "$n")" 2>/dev/null || true
        ip link del "$(node_veth "$n")" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    for n in "${NODES[@]}"; do
        if [[ -d $(node_cgroup "$n") ]]; then
            find "$(node_cgroup "$n")" -depth -type d -exec rmdir {} + 2>/dev/null || true
        fi
    done
    # Keep the logs for a post-mortem; `up` starts from an empty $STATE.
    if [[ -d $STATE ]]; then
        find "$STATE" -mindepth 1 -maxdepth 1 ! -name log -exec rm -rf {} +
    fi
    [[ -n $quiet ]] || say "down (logs kept in $LOG)"
}

cmd_healthy() {  # up and usable, busy or not (what the tests ask before submitting)
    if [[ -f $CONF ]]; then
        PROCTRACK=$(sed -n 's/^ProctrackType=proctrack\///p' "$CONF")
    fi
    cluster_healthy
}

cmd_status() {
    local ok=0 p
    for p in "munged:$RUN/munged.pid" "mariadbd:$MYSQL_DIR/mysqld.pid" \
             "slurmdbd:$RUN/slurmdbd.pid" "slurmctld:$RUN/slurmctld.pid"; do
        pidfile_pid "${p#*:}" "${p%%:*}" >/dev/null || { echo "${p%%:*}: not running"; ok=1; }
    done
    local n
    for n in "${NODES[@]}"; do
        pidfile_pid "$RUN/slurmd-$n.pid" slurmd >/dev/null || { echo "slurmd@$n: not running"; ok=1; }
    done
    [[ $ok == 0 ]] || return 1
    sinfo -h -N -o '%N %t' 2>&1 || return 1
    nodes_idle
}

cmd_env() {
    echo "export SLURM_CONF=$CONF"
}

node_pid() {
    pidfile_pid "$RUN/slurmd-$1.pid" slurmd || die "slurmd on $1 is not running"
}

cmd_exec() {
    [[ $# -ge 2 ]] || die "usage: $0 exec NODE CMD [ARG...]"
    local n=$1 pid
    shift
    node_index "$n" >/dev/null
    pid=$(node_pid "$n")
    exec nsenter -t "$pid" --net --uts --mount --wd="$PWD" -- "$@"
}

cmd_cut() {
    [[ $# == 1 ]] || die "usage: $0 cut NODE"
    node_index "$1" >/dev/null
    ip link set "$(node_veth "$1")" down
    say "$1 cut off (link $(node_veth "$1") down)"
}

cmd_heal() {
    [[ $# == 1 ]] || die "usage: $0 heal NODE"
    node_index "$1" >/dev/null
    ip link set "$(node_veth "$1")" up
    say "$1 reconnected (link $(node_veth "$1") up)"
}

cmd_logs() {
    local f
    for f in "$LOG"/*"${1:-}"*.log; do
        if [[ -e $f ]]; then show_log "$f" "$f"; fi
    done
}

main() {
    local sub=${1:-}
    [[ $# -gt 0 ]] && shift
    case $sub in
        install | up | ensure | down)
            # One at a time (parallel test workers may all call `ensure`).
            # flock -o: the lock fd is not inherited by the daemons we start.
            if [[ -z ${FSLURM_LOCKED:-} ]]; then
                need_root
                FSLURM_LOCKED=1 exec flock -o "$LOCKFILE" bash "$0" "$sub" "$@"
            fi
            ;;
    esac
    case $sub in
        install) cmd_install ;;
        up) cmd_up ;;
        ensure) cmd_ensure ;;
        down) cmd_down ;;
        status) cmd_status ;;
        healthy) cmd_healthy ;;
        env) cmd_env ;;
        exec) cmd_exec "$@" ;;
        cut) cmd_cut "$@" ;;
        heal) cmd_heal "$@" ;;
        logs) cmd_logs "$@" ;;
        *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
}

main "$@"
