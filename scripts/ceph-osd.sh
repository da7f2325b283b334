#!/usr/bin/env bash
# A throwaway single-node Ceph cluster (one mon, one mgr, one bluestore OSD per device) on NBD
# exports such as `uraid serve`, or on files and block devices, for tests on a machine without
# the kernel nbd module or device-mapper.
#
#   scripts/ceph-osd.sh install                 # Debian packages, if missing (needs root)
#   scripts/ceph-osd.sh up WORKDIR NBD_URI      # nbdfuse + loop device + mon + mgr + osd.0, pool 'bench'
#   scripts/ceph-osd.sh up WORKDIR TARGET...    # the same with osd.0, osd.1, ... one per TARGET
#   scripts/ceph-osd.sh status WORKDIR          # one-line summary
#   scripts/ceph-osd.sh down WORKDIR            # stop everything `up` started (best effort, idempotent)
#
# A TARGET is an NBD URI (nbd://, nbd+unix://, nbds://, ...), a regular file, or a block device.
# An NBD export becomes a file with nbdfuse (WORKDIR/fuse/nbd for osd.0, WORKDIR/fuse.N/nbd for
# osd.N), the file a block device with losetup --direct-io=on; a regular file gets a loop device
# with direct I/O as well; a block device is used as it is (its first 10 MiB are zeroed). The
# OSD's `block` symlink points at that device; the OSD is made with `ceph-osd --mkfs`. Not
# ceph-volume: `lvm` needs device-mapper; `raw prepare` (16.2)
# needs udevadm (package udev, absent here), puts the OSD dir on a tmpfs it mounts at the
# hard-coded /var/lib/ceph/osd/CLUSTER-ID, takes the key from /var/lib/ceph/bootstrap-osd,
# chowns the device and runs mkfs as user ceph, and `raw activate` wants systemd.
#
# Every file is under WORKDIR (its own fsid, ceph.conf, keyrings, run/ with admin sockets and pid
# files, log/, mon/, mgr/, osd/ data dirs); nothing goes to /etc/ceph or /var/lib/ceph, so several
# clusters can run side by side. Use it with `ceph -c WORKDIR/ceph.conf ...`,
# `rados -c WORKDIR/ceph.conf -p bench ...` (or export CEPH_CONF=WORKDIR/ceph.conf).
# Daemons run as root, daemonized with pid files, on loopback only, msgr2 only, cephx on.
# One host: CRUSH places replicas across OSDs (failure domain osd).
#
# Environment:
#   CEPH_MON_PORT         mon port (msgr2) on 127.0.0.1; default: a free port picked at `up`
#   CEPH_MS_PORT_MIN/MAX  port range the mgr and OSDs bind in (default 6800-7300; they skip
#                         ports in use, so clusters side by side need nothing here)
#   CEPH_PG_NUM           pg_num of the pool 'bench' (default 8)
#   CEPH_POOL_SIZE        replicas of every pool (osd pool default size; default 1, at most
#                         the number of OSDs)
#   CEPH_POOL_MIN_SIZE    osd pool default min size (default 1)
#   CEPH_UP_TIMEOUT       seconds `up` waits for HEALTH_OK (default 180)
#   NBDFUSE_CONNECTIONS   nbdfuse -C (default 4; the server must offer multi-conn)
#   CEPH_CONF_EXTRA       lines appended to ceph.conf (printf %b: \n works), e.g.
#                         CEPH_CONF_EXTRA='[osd]\nosd op num shards = 4'
#
# `up` on failure undoes what it started (as `down`) and prints the tail of the daemon logs;
# WORKDIR is left in place with the logs. `up` wants WORKDIR absent or empty.
set -euo pipefail

CLUSTER=ceph
MON_ID=a
MGR_ID=x
PY=/usr/bin/python3

die() { echo "ceph-osd.sh: $*" >&2; exit 1; }
log() { printf 'ceph-osd.sh: [%5ss] %s\n' "$(elapsed)" "$*" >&2; }
T0=$(date +%s%N)
elapsed() { local ms=$((($(date +%s%N) - T0) / 1000000)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

# ---------------------------------------------------------------------------------------- install

cmd_install() {
    local need=() p
    for p in ceph-mon ceph-mgr ceph-osd ceph-common libnbd-bin fuse3 util-linux; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
    done
    if [ ${#need[@]} -eq 0 ]; then
        echo "ceph-osd.sh: installed: $(ceph --version)"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "install needs root (missing: ${need[*]})"
    echo "ceph-osd.sh: installing ${need[*]}"
    apt-get update -qq
    # No recommends: they pull in ceph-mgr-dashboard etc. and the daemons do not need them.
    # The packages' systemd units are never started here (no systemd; we run daemons by hand).
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
    echo "ceph-osd.sh: installed: $(ceph --version)"
}

# ------------------------------------------------------------------------------------------- up

# ceph CLI against this WORKDIR (W set by the caller).
c() { ceph -c "$W/ceph.conf" --connect-timeout 60 "$@"; }

authtool() { ceph-authtool "$@" >/dev/null; }

# Run a command quietly; its output is shown only when it fails.
quiet() {
    local out
    out=$("$@" 2>&1) || { echo "$out" >&2; echo "ceph-osd.sh: failed: $*" >&2; return 1; }
}

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_file() { # PATH SECONDS WHAT
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        [ -e "$1" ] && return 0
        sleep 0.1
    done
    die "timed out after $2 s waiting for $3 ($1)"
}

# One line: health, daemons, pgs, usage (from `ceph -s -f json`).
summary() {
    c -s -f json | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
h = s["health"]; o = s["osdmap"]; p = s["pgmap"]
checks = ",".join(h.get("checks", {}).keys())
pgs = " ".join("%d %s" % (x["count"], x["state_name"]) for x in p.get("pgs_by_state", []))
gib = lambda b: "%.2fG" % (b / 2**30)
print("%s%s; mon %d, mgr %s, osd %d up/%d in of %d; pools %d, pgs %d (%s); used %s of %s" % (
    h["status"], " (" + checks + ")" if checks else "", s["monmap"]["num_mons"],
    "active" if s["mgrmap"]["available"] else "none",
    o["num_up_osds"], o["num_in_osds"], o["num_osds"], p["num_pools"], p["num_pgs"],
    pgs or "none", gib(p.get("bytes_used", 0)), gib(p.get("bytes_total", 0))))'
}

# 0 once health is HEALTH_OK, all NOSD OSDs are up and in, every pool's PGs are known to the
# mgr and all are active+clean.
healthy() {
    local st pools
    st=$(c -s -f json 2>/dev/null) || return 1
    pools=$(c osd pool ls detail -f json 2>/dev/null) || return 1
    ST=$st POOLS=$pools NOSD=$NOSD "$PY" -c '
import json, os, sys
s = json.loads(os.environ["ST"]); pools = json.loads(os.environ["POOLS"]); n = int(os.environ["NOSD"])
want = sum(p["pg_num"] for p in pools)
p = s["pgmap"]; o = s["osdmap"]
clean = sum(x["count"] for x in p.get("pgs_by_state", []) if x["state_name"] == "active+clean")
ok = (s["health"]["status"] == "HEALTH_OK" and o["num_up_osds"] == n and o["num_in_osds"] == n
      and s["mgrmap"]["available"] and p["num_pgs"] == want and clean == want)
sys.exit(0 if ok else 1)'
}

write_conf() {
    cat >"$W/ceph.conf" <<EOF
# Written by scripts/ceph-osd.sh up: a single-node test cluster ($NOSD OSDs), all state under $W.
[global]
fsid = $FSID
mon initial members = $MON_ID
mon host = [v2:127.0.0.1:$MON_PORT]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind msgr2 = true
ms bind ipv6 = false
ms bind port min = ${CEPH_MS_PORT_MIN:-6800}
ms bind port max = ${CEPH_MS_PORT_MAX:-7300}
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
keyring = $W/$CLUSTER.client.admin.keyring
run dir = $W/run
crash dir = $W/crash
mon cluster log file = $W/log/\$cluster.\$channel.log
# pools of size CEPH_POOL_SIZE (1: no redundancy, and no warning about it), no autoscaler
# moving pg_num under a test; one host, so replicas go to different OSDs (chooseleaf type 0)
osd pool default size = $POOL_SIZE
osd pool default min size = $POOL_MIN_SIZE
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# the host's root fs may be fuller than the 30 % free the mon wants by default
mon data avail warn = 2
mon data avail crit = 1
# restful would listen on TCP 8003 (a second cluster would collide); nothing else needed
mgr initial modules = iostat
# pg stats to the mgr every second, not every 5: HEALTH_OK and pg states are seen sooner
mgr stats period = 1

[mon]
mon data = $W/mon/\$cluster-\$id
keyring = $W/mon/\$cluster-\$id/keyring
log file = $W/log/\$cluster-\$name.log
pid file = $W/run/\$name.pid

[mgr]
mgr data = $W/mgr/\$cluster-\$id
keyring = $W/mgr/\$cluster-\$id/keyring
log file = $W/log/\$cluster-\$name.log
pid file = $W/run/\$name.pid

[osd]
osd data = $W/osd/\$cluster-\$id
keyring = $W/osd/\$cluster-\$id/keyring
log file = $W/log/\$cluster-\$name.log
pid file = $W/run/\$name.pid
osd objectstore = bluestore
# 2 op shards instead of 8 (ssd default): 2 cores here, and each shard costs ~0.3 s at start
osd op num shards = 2
# small memory for a test OSD: a fixed 128 MiB bluestore cache (autotune off, so the
# 1 GiB memory target is only a ceiling the OSD reports, not used to size caches)
osd memory target = 1073741824
bluestore cache autotune = false
bluestore cache size = 134217728
# mkfs: skip the fsck after it (seconds on a slow device)
bluestore fsck on mkfs = false
# Discards on (bluestore 16.2 has them off): mkfs discards the whole device and freed extents
# are discarded in the background as objects are deleted. uraid passes them down to its
# members (member files get their space back, SSDs learn what is free).
bdev enable discard = true
bdev async discard = true
EOF
    if [ -n "${CEPH_CONF_EXTRA:-}" ]; then
        printf '\n# CEPH_CONF_EXTRA\n%b\n' "$CEPH_CONF_EXTRA" >>"$W/ceph.conf"
    fi
}

# Suffix of osd.N's files: none for osd.0 (the names a single-OSD cluster has always had:
# fuse/nbd, run/nbdfuse.pid, run/loopdev, log/osd-mkfs.log), ".N" for the others.
sfx() { [ "$1" -eq 0 ] || printf '.%s' "$1"; }

start_nbdfuse() { # N URI
    local s fuse i
    s=$(sfx "$1")
    fuse=$W/fuse$s
    mkdir -p "$fuse"
    # nbdfuse stays in the foreground until unmounted; -P writes its pid once it serves.
    setsid nbdfuse -C "${NBDFUSE_CONNECTIONS:-4}" -P "$W/run/nbdfuse$s.pid" "$fuse" "$2" \
        >"$W/log/nbdfuse$s.log" 2>&1 </dev/null &
    echo $! >"$W/run/nbdfuse$s.pid.launch"
    for ((i = 0; i < 300; i++)); do
        [ -s "$W/run/nbdfuse$s.pid" ] && [ -e "$fuse/nbd" ] && return 0
        kill -0 "$(cat "$W/run/nbdfuse$s.pid.launch")" 2>/dev/null ||
            die "nbdfuse exited: $(tail -3 "$W/log/nbdfuse$s.log")"
        sleep 0.1
    done
    die "nbdfuse did not come up in 30 s"
}

# The block device of osd.N for TARGET; sets DEV. run/loopdevSFX records a loop device made
# here and its backing file (for `down`).
attach() { # N TARGET
    local s back size dio what
    s=$(sfx "$1")
    case $2 in
    nbd://* | nbds://* | nbd+*://* | nbds+*://*)
        start_nbdfuse "$1" "$2"
        back=$W/fuse$s/nbd
        what="nbdfuse on $back"
        ;;
    *)
        if [ -b "$2" ]; then
            DEV=$(realpath "$2")
            log "osd.$1: block device $DEV ($(($(blockdev --getsize64 "$DEV") / 1048576)) MiB)"
            return 0
        fi
        [ -f "$2" ] || die "$2: not an NBD URI, a regular file or a block device"
        back=$(realpath "$2")
        what="file $back"
        ;;
    esac
    DEV=$(losetup --find --show --direct-io=on "$back")
    printf '%s\n%s\n' "$DEV" "$back" >"$W/run/loopdev$s"
    size=$(blockdev --getsize64 "$DEV")
    dio=$(cat "/sys/block/${DEV#/dev/}/loop/dio" 2>/dev/null || echo '?')
    log "osd.$1: $what, $DEV ($((size / 1048576)) MiB, direct-io $dio)"
}

cmd_up() {
    [ $# -ge 2 ] || usage
    W=$(realpath -m "$1")
    shift
    local targets=("$@") n
    NOSD=${#targets[@]}
    POOL_SIZE=${CEPH_POOL_SIZE:-1}
    POOL_MIN_SIZE=${CEPH_POOL_MIN_SIZE:-1}
    [ "$POOL_SIZE" -ge 1 ] && [ "$POOL_SIZE" -le "$NOSD" ] ||
        die "CEPH_POOL_SIZE=$POOL_SIZE: needs 1 to $NOSD (the number of OSDs)"
    [ "$(id -u)" = 0 ] || die "up needs root (FUSE, loop devices)"
    command -v ceph-osd >/dev/null || die "ceph-osd not installed: run '$0 install'"
    if [ -e "$W" ] && [ -n "$(ls -A "$W")" ]; then
        die "$W is not empty (a cluster there already? run '$0 down $W' and remove it)"
    fi
    # Unix socket paths (admin sockets) are limited to 107 bytes.
    [ ${#W} -le 80 ] || die "WORKDIR path too long for admin sockets (max 80 chars): $W"
    mkdir -p "$W"/{run,log,crash,mon/$CLUSTER-$MON_ID,mgr/$CLUSTER-$MGR_ID}
    trap 'up_failed' EXIT
    trap 'exit 1' INT TERM

    FSID=$(cat /proc/sys/kernel/random/uuid)
    MON_PORT=${CEPH_MON_PORT:-$(free_port)}
    write_conf
    log "WORKDIR $W, fsid $FSID, mon at v2:127.0.0.1:$MON_PORT, $NOSD OSD(s)"

    # --- keys: every daemon's key is made here and imported into the mon at its mkfs, so no
    # `ceph auth` round trips are needed later.
    local K=$W/keyrings
    mkdir -p "$K"
    authtool --create-keyring "$K/mon" --gen-key -n mon. --cap mon 'allow *'
    authtool --create-keyring "$W/$CLUSTER.client.admin.keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
    authtool --create-keyring "$W/mgr/$CLUSTER-$MGR_ID/keyring" --gen-key -n mgr.$MGR_ID \
        --cap mon 'allow profile mgr' --cap osd 'allow *' --cap mds 'allow *'
    authtool "$K/mon" --import-keyring "$W/$CLUSTER.client.admin.keyring"
    authtool "$K/mon" --import-keyring "$W/mgr/$CLUSTER-$MGR_ID/keyring"

    # --- per OSD: block device (NBD export -> nbdfuse file -> loop device; file -> loop
    # device; block device as is), key, and mkfs (bluestore) in the background while the mon
    # starts: --no-mon-config, it needs no mon (fsid from ceph.conf, key already in the data dir).
    # A volume that held an OSD before still carries its bluestore label, and mkfs would then
    # try to mount the old store and fail: zero the first 10 MiB (ceph-volume zap does the same).
    local uuids=() mkfs_pids=() d
    for ((n = 0; n < NOSD; n++)); do
        d=$W/osd/$CLUSTER-$n
        mkdir -p "$d"
        attach $n "${targets[$n]}"
        uuids+=("$(cat /proc/sys/kernel/random/uuid)")
        authtool --create-keyring "$d/keyring" --gen-key -n osd.$n \
            --cap mon 'allow profile osd' --cap mgr 'allow profile osd' --cap osd 'allow *'
        authtool "$K/mon" --import-keyring "$d/keyring"
        dd if=/dev/zero of="$DEV" bs=1M count=10 oflag=direct conv=fsync status=none
        ln -s "$DEV" "$d/block"
        ceph-osd -c "$W/ceph.conf" -i $n --mkfs --osd-uuid "${uuids[$n]}" --no-mon-config \
            --setuser root --setgroup root >"$W/log/osd-mkfs$(sfx $n).log" 2>&1 &
        mkfs_pids+=($!)
    done

    # --- mon
    monmaptool --create --fsid "$FSID" --addv $MON_ID "[v2:127.0.0.1:$MON_PORT]" "$K/monmap" >/dev/null
    ceph-mon -c "$W/ceph.conf" --mkfs -i $MON_ID --monmap "$K/monmap" --keyring "$K/mon" \
        --setuser root --setgroup root >>"$W/log/start.log" 2>&1
    ceph-mon -c "$W/ceph.conf" -i $MON_ID --setuser root --setgroup root >>"$W/log/start.log" 2>&1
    wait_file "$W/run/mon.$MON_ID.pid" 30 "mon pid file"
    log "mon.$MON_ID started (pid $(cat "$W/run/mon.$MON_ID.pid"))"

    # --- mgr
    ceph-mgr -c "$W/ceph.conf" -i $MGR_ID --setuser root --setgroup root >>"$W/log/start.log" 2>&1
    wait_file "$W/run/mgr.$MGR_ID.pid" 30 "mgr pid file"
    log "mgr.$MGR_ID started (pid $(cat "$W/run/mgr.$MGR_ID.pid"))"

    # --- OSDs: register each id and uuid, wait for its mkfs, start it
    for ((n = 0; n < NOSD; n++)); do
        quiet c osd new "${uuids[$n]}" $n
    done
    # The pool can be made before the OSDs are up (its PGs wait in 'creating').
    quiet c osd pool create bench "${CEPH_PG_NUM:-8}" "${CEPH_PG_NUM:-8}" replicated
    quiet c osd pool application enable bench rados
    log "pool bench created (pg_num ${CEPH_PG_NUM:-8}, size $POOL_SIZE, min_size $POOL_MIN_SIZE)"
    for ((n = 0; n < NOSD; n++)); do
        wait "${mkfs_pids[$n]}" || die "ceph-osd --mkfs of osd.$n failed: $(tail -5 "$W/log/osd-mkfs$(sfx $n).log")"
    done
    log "mkfs done ($NOSD OSD(s))"
    # Started side by side (each takes seconds to mount its store before it daemonizes).
    local start_pids=()
    for ((n = 0; n < NOSD; n++)); do
        rm -f "$W/run/osd.$n.pid"
        ceph-osd -c "$W/ceph.conf" -i $n --setuser root --setgroup root >>"$W/log/start.log" 2>&1 &
        start_pids+=($!)
    done
    for ((n = 0; n < NOSD; n++)); do
        wait "${start_pids[$n]}" || die "ceph-osd -i $n failed to start: $(tail -5 "$W/log/start.log")"
        wait_file "$W/run/osd.$n.pid" 60 "osd.$n pid file"
        log "osd.$n started (pid $(cat "$W/run/osd.$n.pid"))"
    done

    local deadline=$(($(date +%s) + ${CEPH_UP_TIMEOUT:-180}))
    until healthy; do
        [ "$(date +%s)" -lt $deadline ] || die "no HEALTH_OK within ${CEPH_UP_TIMEOUT:-180} s: $(summary 2>&1)"
        sleep 1
    done
    trap - EXIT INT TERM
    log "up: $(summary || echo '(ceph -s failed)')"
    echo "ceph -c $W/ceph.conf -s   # rados -c $W/ceph.conf -p bench ..."
}

up_failed() {
    trap - EXIT INT TERM
    echo "ceph-osd.sh: up failed; logs in $W/log; tails:" >&2
    local f
    for f in "$W"/log/*.log; do
        [ -s "$f" ] || continue
        echo "==> $f" >&2
        tail -n 8 "$f" >&2
    done
    cmd_down "$W" >&2 || true
}

# ----------------------------------------------------------------------------------------- down

# PID from FILE if that process is still running and its command line mentions PATTERN
# (a stale pid file never makes us signal an unrelated process).
live_pid() { # FILE PATTERN
    local pid
    [ -s "$1" ] || return 1
    pid=$(tr -dc 0-9 <"$1")
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2" || return 1
    echo "$pid"
}

# Running: exists and is not a zombie (daemons are children of init, which may reap late).
running() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ -n "$st" ] && [ "$st" != Z ]; }

stop_pid() { # PID WHAT SECONDS
    local i
    kill -TERM "$1" 2>/dev/null || return 0
    for ((i = 0; i < $3 * 20; i++)); do
        running "$1" || return 0
        sleep 0.05
    done
    echo "ceph-osd.sh: $2 (pid $1) still running after $3 s: SIGKILL" >&2
    kill -KILL "$1" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        running "$1" || return 0
        sleep 0.05
    done
}

cmd_down() {
    [ $# -eq 1 ] || usage
    local W pid d f loop back rec
    W=$(realpath -m "$1")
    [ -d "$W" ] || { echo "ceph-osd.sh: $W: nothing there"; return 0; }
    # Daemons: OSDs first (they hold the loop devices), then mgr, then mon.
    for f in "$W"/run/osd.*.pid "$W/run/mgr.$MGR_ID.pid" "$W/run/mon.$MON_ID.pid"; do
        [ -e "$f" ] || continue
        d=$(basename "$f" .pid)
        if pid=$(live_pid "$f" "$W/ceph.conf"); then
            stop_pid "$pid" "$d" 30
            echo "ceph-osd.sh: stopped $d (pid $pid)"
        fi
    done
    # A mkfs still running (up interrupted)
    for pid in $(pgrep -f -- "ceph-osd -c $W/ceph.conf" || true); do
        stop_pid "$pid" "ceph-osd (mkfs)" 10
    done
    # Loop devices: each one recorded (device, backing file), detached if it is still on that
    # file; and any other found on an nbdfuse file of this WORKDIR.
    {
        for rec in "$W"/run/loopdev "$W"/run/loopdev.*; do
            [ -s "$rec" ] || continue
            loop=$(sed -n 1p "$rec")
            back=$(sed -n 2p "$rec")
            # A record of one line (older versions): the nbdfuse file of osd.0
            echo "$loop ${back:-$W/fuse/nbd}"
        done
        losetup -nO NAME,BACK-FILE 2>/dev/null |
            awk -v w="$W/fuse" 'index($2, w) == 1 && $2 ~ /\/nbd$/ { print $1, $2 }'
    } | sort -u | while read -r loop back; do
        [ -b "$loop" ] || continue
        if [ "$(losetup -nO BACK-FILE "$loop" 2>/dev/null)" = "$back" ]; then
            losetup -d "$loop" && echo "ceph-osd.sh: detached $loop"
        fi
    done
    rm -f "$W"/run/loopdev "$W"/run/loopdev.*
    # FUSE mounts, then nbdfuse itself
    for d in "$W"/fuse "$W"/fuse.*; do
        if grep -qF " $d " /proc/mounts; then
            fusermount3 -u "$d" 2>/dev/null || fusermount3 -uz "$d" || umount -l "$d" || true
            echo "ceph-osd.sh: unmounted $d"
        fi
    done
    for f in "$W"/run/nbdfuse*.pid "$W"/run/nbdfuse*.pid.launch; do
        [ -e "$f" ] || continue
        if pid=$(live_pid "$f" nbdfuse); then
            stop_pid "$pid" nbdfuse 10
        fi
        rm -f "$f"
    done
    echo "ceph-osd.sh: $W down"
}

cmd_status() {
    [ $# -eq 1 ] || usage
    W=$(realpath -m "$1")
    [ -s "$W/ceph.conf" ] || die "$W: no ceph.conf"
    summary
}

[ $# -ge 1 ] || usage
sub=$1
shift
case $sub in
install) cmd_install "$@" ;;
up) cmd_up "$@" ;;
down) cmd_down "$@" ;;
status) cmd_status "$@" ;;
*) usage ;;
esac
