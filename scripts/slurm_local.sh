#!/usr/bin/env bash
# A single-node SLURM on this machine, for the harness's integration tests (issue 5).
#
#   scripts/slurm_local.sh up        # install if missing, start munge, mariadb, slurmdbd,
#                                    # slurmctld, slurmd; wait until the node is idle
#   scripts/slurm_local.sh status    # exit 0 when everything is up
#   scripts/slurm_local.sh down      # stop what `up` started (by pid) and wait for it to exit
#   scripts/slurm_local.sh down --purge   # ... and delete the state folder
#
# Runs as root, without systemd (containers, CI). Debian's packages (slurmctld, slurmd,
# slurm-client, munge, slurmdbd, mariadb-server) are installed when missing. Config, state,
# spool, pid and log files live under $BURST_SLURM_DIR (default /tmp/burst-slurm); client
# commands find the config through /etc/slurm/slurm.conf (a symlink, made only when that path
# is free or already ours) or SLURM_CONF=$BURST_SLURM_DIR/etc/slurm.conf.
#
# Why each setting is here: DESIGN.md 6. In short, accounting (slurmdbd + mariadb) is needed
# because submitit learns job states only from sacct; config_overrides lets the node declare
# more CPUs than the machine has without being drained; KillWait=5 and cred_expire=10 keep
# cancels and requeues fast.
set -euo pipefail

D=${BURST_SLURM_DIR:-/tmp/burst-slurm}
TIMEOUT_S=${BURST_SLURM_TIMEOUT:-60}  # start-up budget (seconds), installing excluded
CLUSTER=burst
PARTITION=debug
HOST=$(hostname -s)
CONF=$D/etc/slurm.conf
DBD_CONF=$D/etc/slurmdbd.conf
MYSQL_SOCK=$D/run/mysqld.sock
ETC_CONF=/etc/slurm/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
export SLURM_CONF=$CONF

say() { printf '[slurm_local] %s\n' "$*"; }
die() { printf '[slurm_local] error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------
# processes: every daemon is tracked by its pid file; a pid counts only if its command matches

pid_of() {  # pid_of NAME PIDFILE -> prints the pid when that process is alive
    local name=$1 file=$2 pid
    [[ -s $file ]] || return 1
    pid=$(tr -dc 0-9 <"$file")
    [[ -n $pid && -r /proc/$pid/comm ]] || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name"* ]] || return 1
    echo "$pid"
}

alive() { pid_of "$1" "$2" >/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2 t0=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS - t0 >= limit)); then
            die "timed out after ${limit} s waiting for $what (logs: $D/log/)"
        fi
        sleep 0.2
    done
}

stop_pid() {  # stop_pid NAME PIDFILE: SIGTERM, wait up to 20 s, then SIGKILL
    local name=$1 file=$2 pid i
    pid=$(pid_of "$name" "$file") || { rm -f "$file"; return 0; }
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        [[ -d /proc/$pid ]] || break
        sleep 0.2
    done
    if [[ -d /proc/$pid ]]; then
        say "$name did not exit after 20 s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 25; i++)); do [[ -d /proc/$pid ]] || break; sleep 0.2; done
    fi
    rm -f "$file"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------------------------------------------------------------------------------------------
# install and configure

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null || die "missing packages ${missing[*]} and no apt-get"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # apt-get update only when the package lists do not know the packages yet (fresh image)
    if ! apt-cache show slurmctld >/dev/null 2>&1 || ! apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >"$D/log/apt.log" 2>&1; then
        apt-get update -qq >>"$D/log/apt.log" 2>&1 || die "apt-get update failed (see $D/log/apt.log)"
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$D/log/apt.log" 2>&1 ||
            die "apt-get install ${missing[*]} failed (see $D/log/apt.log)"
    fi
}

ensure_hostname() {
    # MASTER_ADDR in a job is the node name (submitit), so it must resolve (DESIGN.md 6)
    if ! getent hosts "$HOST" >/dev/null; then
        say "adding '127.0.0.1 $HOST' to /etc/hosts (the node name must resolve)"
        echo "127.0.0.1 $HOST" >>/etc/hosts
    fi
}

write_configs() {
    cat >"$CONF.tmp" <<EOF
# Written by scripts/slurm_local.sh: a single-node test cluster (see DESIGN.md 6).
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job otherwise waits for the default 120 s credential expiry
AuthInfo=cred_expire=10
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# no cgroups in containers
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# the node declares 8 CPUs on a smaller machine: without config_overrides it is drained
SlurmdParameters=config_overrides
# impossible requests are rejected at submission instead of pending forever
EnforcePartLimits=ALL
ReturnToService=2
# submitit ignores SIGTERM, so a cancelled job otherwise lingers for the default 30 s
KillWait=5
MpiDefault=none
MailProg=/bin/true
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=8 RealMemory=16000 State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.tmp" "$CONF"
    [[ -s $D/etc/dbpass ]] || (umask 077 && od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$D/etc/dbpass")
    (
        umask 077  # slurmdbd refuses a config readable by others
        cat >"$DBD_CONF.tmp" <<EOF
# Written by scripts/slurm_local.sh
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=$(cat "$D/etc/dbpass")
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DBD_CONF.tmp"
    mv "$DBD_CONF.tmp" "$DBD_CONF"
    # client commands (sinfo, sbatch, sacct) read /etc/slurm/slurm.conf unless SLURM_CONF is set;
    # never replace a real cluster's config
    if [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]]; then
        :
    elif [[ ! -e $ETC_CONF && ! -L $ETC_CONF ]]; then
        mkdir -p /etc/slurm
        ln -s "$CONF" "$ETC_CONF"
    else
        say "note: $ETC_CONF belongs to another setup; use SLURM_CONF=$CONF with this cluster"
    fi
}

# ---------------------------------------------------------------------------------------------
# daemons

munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_ok; then
        return 0  # ours from an earlier `up`, or the machine's own munged
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating the munge key"
        mkdir -p /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        fi
    fi
    # munged checks ownership and modes of its key and directories, and runs as munge
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/log/munge /var/lib/munge
    chmod 0700 /etc/munge
    chmod 0400 /etc/munge/munge.key
    chmod 0755 /run/munge
    say "starting munged"
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --force
    wait_for 15 "munged" munge_ok
    cp /run/munge/munged.pid "$D/run/munged.pid"  # mark it as started by us, for `down`
}

mysql_root() { mariadb --no-defaults --socket="$MYSQL_SOCK" -u root "$@"; }

start_mariadb() {
    if alive mariadbd "$D/run/mariadb.pid"; then
        return 0
    fi
    port_busy 3306 && die "port 3306 is taken by another database; stop it first"
    if [[ ! -d $D/mysql/mysql ]]; then
        say "initialising mariadb in $D/mysql"
        rm -rf "$D/mysql"
        mariadb-install-db --no-defaults --datadir="$D/mysql" --user=root \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$D/log/mariadb-install.log" 2>&1 ||
            die "mariadb-install-db failed (see $D/log/mariadb-install.log)"
    fi
    say "starting mariadb"
    setsid mariadbd --no-defaults --datadir="$D/mysql" --socket="$MYSQL_SOCK" \
        --pid-file="$D/run/mariadb.pid" --port=3306 --bind-address=127.0.0.1 --user=root \
        --skip-name-resolve --log-error="$D/log/mariadb.log" --innodb-buffer-pool-size=64M \
        </dev/null >/dev/null 2>&1 &
    wait_for 30 "mariadb" mysql_root -e 'SELECT 1'
    local pw
    pw=$(cat "$D/etc/dbpass")
    mysql_root -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
        FLUSH PRIVILEGES;"
}

sacctmgr_ok() { sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; }

start_slurmdbd() {
    if ! alive slurmdbd "$D/run/slurmdbd.pid"; then
        port_busy 6819 && die "port 6819 (slurmdbd) is taken by another process"
        say "starting slurmdbd"
        slurmdbd
        wait_for 30 "slurmdbd" sacctmgr -n show cluster
    fi
    if ! sacctmgr_ok; then
        sacctmgr -i -Q add cluster "$CLUSTER" >/dev/null
    fi
}

start_slurm() {
    if ! alive slurmctld "$D/run/slurmctld.pid"; then
        port_busy 6817 && die "port 6817 (slurmctld) is taken by another process"
        say "starting slurmctld"
        slurmctld -f "$CONF"
    fi
    if ! alive slurmd "$D/run/slurmd.pid"; then
        port_busy 6818 && die "port 6818 (slurmd) is taken by another process"
        say "starting slurmd"
        slurmd -f "$CONF"
    fi
}

node_state() { sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -1; }

node_idle() {
    local s
    s=$(node_state)
    case $s in
        idle | mixed | allocated | completing) return 0 ;;
        down* | drain* | *drained | fail*)
            # a stale DOWN/DRAIN from an earlier run survives in the state files
            scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
            return 1 ;;
        *) return 1 ;;
    esac
}

all_alive() {
    alive mariadbd "$D/run/mariadb.pid" && alive slurmdbd "$D/run/slurmdbd.pid" &&
        alive slurmctld "$D/run/slurmctld.pid" && alive slurmd "$D/run/slurmd.pid"
}

# ---------------------------------------------------------------------------------------------
# commands

cmd_up() {
    [[ $(id -u) == 0 ]] || die "needs root (it installs packages and starts daemons)"
    local t0=$SECONDS
    if all_alive && munge_ok && node_idle && sacctmgr_ok; then
        say "already up ($(node_state), cluster $CLUSTER, SLURM_CONF=$CONF)"
        return 0
    fi
    mkdir -p "$D"/{etc,state,spool,run,log}
    chmod 755 "$D"
    install_packages
    local t1=$SECONDS  # the start-up budget excludes installing (minutes on a slow mirror)
    ensure_hostname
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurm
    local left=$((TIMEOUT_S - (SECONDS - t1)))
    ((left < 5)) && left=5
    say "waiting for node $HOST to be idle (up to ${left} s)"
    wait_for "$left" "node $HOST to become idle in sinfo (state: '$(node_state)')" node_idle
    wait_for 10 "sacctmgr to list cluster $CLUSTER" sacctmgr_ok
    say "up in $((SECONDS - t0)) s: partition $PARTITION, node $HOST ($(node_state))," \
        "SLURM_CONF=$CONF"
}

cmd_down() {
    if alive slurmctld "$D/run/slurmctld.pid"; then
        # running jobs would keep their slurmstepd processes after slurmd stops
        local jobs
        jobs=$(squeue -h -o %A 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            say "cancelling jobs: $(echo "$jobs" | tr '\n' ' ')"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            local i
            for ((i = 0; i < 50; i++)); do
                [[ -z $(squeue -h -o %A 2>/dev/null) ]] && break
                sleep 0.2
            done
        fi
    fi
    stop_pid slurmd "$D/run/slurmd.pid"
    stop_pid slurmctld "$D/run/slurmctld.pid"
    stop_pid slurmdbd "$D/run/slurmdbd.pid"
    stop_pid mariadbd "$D/run/mariadb.pid"
    if [[ -e $D/run/munged.pid ]]; then
        stop_pid munged "$D/run/munged.pid"
        rm -f /run/munge/munged.pid
    fi
    if [[ ${1:-} == --purge ]]; then
        [[ -L $ETC_CONF && $(readlink "$ETC_CONF") == "$CONF" ]] && rm -f "$ETC_CONF"
        rm -rf "$D"
        say "removed $D"
    fi
    say "down"
}

cmd_status() {
    local ok=0 name file
    for name in munged mariadbd slurmdbd slurmctld slurmd; do
        case $name in
            munged) munge_ok && say "munged: ok" || { say "munged: not running"; ok=1; }; continue ;;
            mariadbd) file=$D/run/mariadb.pid ;;
            *) file=$D/run/$name.pid ;;
        esac
        if alive "$name" "$file"; then
            say "$name: running (pid $(pid_of "$name" "$file"))"
        else
            say "$name: not running"
            ok=1
        fi
    done
    if ((ok == 0)); then
        say "node $HOST: $(node_state); SLURM_CONF=$CONF"
        node_idle || ok=1
    fi
    return $ok
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down "${2:-}" ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down [--purge]|status" >&2; exit 2 ;;
esac
