#!/usr/bin/env python3
"""Ceph on uraid (docs/scale-out.md): a benchmark report in two parts, written to
docs/bench-sections/ceph.md. Every cluster is a single-node one from scripts/ceph-osd.sh (mon,
mgr, bluestore OSDs; its header says why each setting is there).

A  An OSD on uraid against an OSD on nbdkit's file plugin, reached the same way (NBD export on a
   Unix socket -> nbdfuse -C 4 -> loop device with direct I/O -> bluestore). Targets:
     uraid        RAID6 of six --a-member-size files on /dev/shm (chunk 64K), `uraid serve
                  --busy-poll 0` (what docs/scale-out.md recommends next to OSDs);
     nbdkit       `nbdkit -U SOCK file FILE` (nbdkit's defaults: cache=default, fadvise=normal;
                  on tmpfs the file's pages are the storage, so neither server keeps a second
                  copy; --nbdkit-cache none to change), FILE on /dev/shm of the uraid volume's size;
     uraid-bp50   the same as uraid, its own array, with the default `--busy-poll 50`.
   One cluster per target, reused by every run (each run deletes what it wrote). Each uraid
   target has a phase of its own: its cluster is up only then, and in each of the phase's --runs
   runs it and nbdkit take turns (uraid, nbdkit, uraid, nbdkit, ...); nbdkit's cluster serves
   every phase. (Two uraid arrays and nbdkit's file side by side could outgrow /dev/shm: uraid
   keeps the space of trims smaller than its allocation granule, below.) Each target's cells, back
   to back:
     write  rados bench -p bench SECONDS write --no-cleanup --max-objects N (4 MiB objects,
            16 in flight; N caps the data at --a-fill of the volume: a full OSD aborts)
     seq    rados bench -p bench SECONDS seq   (reads the objects just written, once)
     rand   rados bench -p bench SECONDS rand
            then rados -p bench cleanup
     rbd    on a fresh image of --a-image-size in pool 'rbd' (rbd create, written once with
            4M sequential writes, unmeasured): rbd bench --io-type write --io-pattern rand
            --io-size 4K --io-threads 16 --io-total --a-rbd-total; then rbd rm
   Before each cell the OSD's device is let go quiet (no I/O for 1 s): bluestore discards what a
   cleanup or an overwrite freed in the background (bdev_async_discard), and after `rbd rm` that
   takes seconds (reported). Medians over --runs and each run's values, the ratio uraid/nbdkit per
   cell, and the CPU time (utime+stime) of the target's server, nbdfuse and OSD per cell; for
   uraid the trims it received (bluestore frees 4K extents after 4K overwrites and discards each:
   a trim smaller than uraid's allocation granule is written as zeros, not freed).
   Not preconditioned by default: bluestore's mkfs discards the whole device (bdev_enable_discard,
   on in ceph-osd.sh as docs/scale-out.md recommends) and both servers pass that down as hole
   punches, so a device written end to end first is sparse again once the OSD exists (the report
   gives the allocated bytes after `up`). --bluestore-discard off: the OSDs discard nothing
   (bdev_enable_discard = false) and every device is written end to end (fio, nbd) before `up`.

B  A drive failure. Twelve --b-drive-size files on /dev/shm ("drives") used two ways, with the
   same pool (bench: size 2, min_size 1, --b-pg PGs, CRUSH failure domain osd on one host) and
   the same user data (--b-objects objects of 4 MiB written by rados bench), HEALTH_OK first:
     B1  three uraid RAID6 arrays of four drives (2+2), three `uraid serve --busy-poll 0`, one
         OSD per array (as in A). Drive 0 (array 0's member 0) fails (`uraid fail 0`) and a
         fresh spare file is added (`uraid add`): time from the failure until the rebuild
         finished; Ceph's health and recovery counters meanwhile and for --b-observe s after.
     B2  twelve OSDs, one per drive (a loop device with direct I/O on each file). Drive 0's
         OSD is killed (SIGKILL: a dead drive) and marked out at once (`ceph osd out 0`; by
         default the mon waits mon_osd_down_out_interval, 600 s, first): time until every PG
         is active+clean without it and health is HEALTH_OK; what Ceph recovered.
   Bytes Ceph moved: the OSDs' `recovery_bytes` perf counters (bytes pushed by recovery and
   backfill), the PGs' num_bytes_recovered (`ceph pg dump`), and the bytes written to the
   OSDs' block devices (/sys/block/loopN/stat) over the window; and the bytes the failed
   drive's OSD held.

    scripts/bench_ceph.py [--runs 3] [--parts AB] [--targets uraid,nbdkit,uraid-bp50]
                          [--seconds 10] [--a-rbd-total 256M] [--bluestore-discard on|off]
                          [--b-runs 3] [--b-objects 256]
                          [--uraid target/release/uraid] [--dir /dev/shm/uraid-ceph]
                          [--out docs/bench-sections/ceph.md]

Needs root (FUSE, loop devices), Ceph 16.2 (scripts/ceph-osd.sh install), nbdkit, nbdfuse,
python3-rados (run under /usr/bin/python3 when the python3 first on PATH lacks it). Everything
it makes (processes, loop devices, FUSE mounts, files under --dir) is removed at the end, also
on failure or SIGTERM.
"""
import argparse, json, os, re, shlex, shutil, signal, statistics, subprocess, sys, time

try:
    import rados
except ImportError:
    # Run as a script: again under the system python, which has the module. Imported (a
    # tool reading this file): no re-exec and no exit, `rados` is just absent.
    rados = None
    _system = "/usr/bin/python3"
    if __name__ == "__main__":
        if os.path.exists(_system) and os.path.realpath(sys.executable) != os.path.realpath(_system):
            os.execv(_system, [_system, os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit("bench_ceph: python3-rados not found (installed with ceph-common: scripts/ceph-osd.sh install)")

from benchlib import (cpu_model, MIB, TICK, URAID, Server, cpu_ticks, events, proc_bytes, run, size_bytes, spread, status,
                      write_report)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CEPH_OSD = os.path.join(HERE, "ceph-osd.sh")
OBJ = 4 * MIB
GIB = 1 << 30
CELLS = ["write", "seq", "rand", "rbd"]
CELL_TITLE = {"write": "rados bench write (4 MiB objects)", "seq": "rados bench seq",
              "rand": "rados bench rand", "rbd": "rbd bench 4K random write, 16 threads"}
TARGET_KINDS = {"uraid": "0", "uraid-bp50": "50", "nbdkit": None}  # name -> --busy-poll

COMMANDS = {}  # label -> one command line as run (first occurrence)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def note(label, argv):
    """Records a command line for the report (a string: as it is)."""
    COMMANDS.setdefault(label, argv if isinstance(argv, str) else shlex.join(str(x) for x in argv))


def sh(label, argv, **kw):
    note(label, argv)
    return run([str(x) for x in argv], **kw)


class Cleanup:
    """Undo actions, run last-in first-out; each one's failure is reported, not raised."""

    def __init__(self):
        self.fns = []

    def add(self, what, fn):
        self.fns.append((what, fn))
        return fn

    def pop(self, fn):
        """Runs `fn` now (it was added) and forgets it."""
        self.fns = [(w, f) for w, f in self.fns if f != fn]
        fn()

    def run(self):
        while self.fns:
            what, fn = self.fns.pop()
            try:
                fn()
            except Exception as e:  # keep cleaning
                log(f"cleanup {what}: {e}")


CLEAN = Cleanup()


# ---------------------------------------------------------------------------------------------
# Ceph

class Cluster:
    """A cluster of scripts/ceph-osd.sh under `w`, one OSD per target; a librados handle."""

    def __init__(self, w, targets, env=None):
        self.w, self.targets, self.env = w, targets, env or {}
        self.conf = os.path.join(w, "ceph.conf")
        self.r, self.up_s = None, None

    def up(self):
        CLEAN.add(f"ceph-osd.sh down {self.w}", self.down)
        argv = [CEPH_OSD, "up", self.w, *self.targets]
        note(f"cluster, {len(self.targets)} OSD(s)",
             [f"{k}={v}" for k, v in sorted(self.env.items())] + argv)
        t = time.monotonic()
        p = subprocess.run(argv, env=dict(os.environ, **self.env), capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"ceph-osd.sh up {self.w} failed:\n{p.stderr[-4000:]}")
        self.up_s = time.monotonic() - t
        self.r = rados.Rados(conffile=self.conf)
        self.r.connect(timeout=30)
        return self

    def down(self):
        if self.r is not None:
            self.r.shutdown()
            self.r = None
        if os.path.isdir(self.w):
            subprocess.run([CEPH_OSD, "down", self.w], capture_output=True)

    def _cmd(self, fn, prefix, kw):
        r, out, err = fn(json.dumps({"prefix": prefix, "format": "json", **kw}), b"", timeout=60)
        if r:
            raise RuntimeError(f"ceph {prefix}: {r} {err}")
        return json.loads(out) if out.strip() else None

    def mon(self, prefix, **kw):
        return self._cmd(self.r.mon_command, prefix, kw)

    def mgr(self, prefix, **kw):
        return self._cmd(self.r.mgr_command, prefix, kw)

    def perf(self, osd):
        r, out, err = self.r.osd_command(osd, json.dumps({"prefix": "perf dump", "format": "json"}), b"",
                                         timeout=30)
        if r:
            raise RuntimeError(f"osd.{osd} perf dump: {r} {err}")
        return json.loads(out)["osd"]

    def cli(self, tool, *args):
        return [tool, "-c", self.conf, *args]

    def pid(self, name):
        with open(os.path.join(self.w, "run", name + ".pid")) as f:
            return int(f.read().strip())

    def loop(self, osd):
        """osd.N's loop device (ceph-osd.sh records it in run/loopdev[.N])."""
        with open(os.path.join(self.w, "run", "loopdev" + (f".{osd}" if osd else ""))) as f:
            return f.readline().strip()

    def daemon_pids(self):
        out = []
        for f in os.listdir(os.path.join(self.w, "run")):
            if f.endswith(".pid") and (f.startswith(("osd.", "mon.", "mgr.", "nbdfuse"))):
                try:
                    out.append(self.pid(f[:-4]))
                except (OSError, ValueError):
                    pass
        return out


def health(cl):
    s = cl.mon("status")
    pgs = {x["state_name"]: x["count"] for x in s["pgmap"].get("pgs_by_state", [])}
    return s["health"]["status"], sorted(s["health"].get("checks", {})), s["osdmap"], pgs, s["pgmap"]


def pgs_brief(cl):
    d = cl.mgr("pg dump", dumpcontents=["pgs_brief"])
    return d["pg_stats"] if isinstance(d, dict) else d


def pool_id(cl, name):
    return next(p["pool_id"] for p in cl.mon("osd pool ls", detail="detail") if p["pool_name"] == name)


def wait_clean(cl, nosd, objects=None, timeout=300):
    """Until HEALTH_OK, `nosd` OSDs up and in, every PG active+clean and (given) the pool
    'bench' holding `objects` objects in the PG stats."""
    pid = pool_id(cl, "bench") if objects is not None else None
    t0 = time.monotonic()
    while True:
        st, checks, osdmap, pgs, pgmap = health(cl)
        ok = (st == "HEALTH_OK" and osdmap["num_up_osds"] == nosd and osdmap["num_in_osds"] == nosd
              and list(pgs) == ["active+clean"])
        if ok and objects is not None:
            d = cl.mgr("pg dump", dumpcontents=["pools"])
            pools = d["pool_stats"] if isinstance(d, dict) else d
            ok = any(p["poolid"] == pid and p["stat_sum"]["num_objects"] == objects for p in pools)
        if ok:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"not clean within {timeout} s: {st} {checks} {pgs}")
        time.sleep(0.5)


def rados_bench(cl, label, secs, mode, extra=()):
    out = sh(label, cl.cli("rados", "-p", "bench", "bench", secs, mode, *extra))
    kv = {}
    for line in out.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            kv[k.strip()] = v.strip()
    try:
        ops = int(kv.get("Total writes made") or kv["Total reads made"])
        return {"mbps": float(kv["Bandwidth (MB/sec)"]), "iops": float(kv["Average IOPS"]), "ops": ops,
                "bytes": ops * OBJ, "secs": float(kv["Total time run"]),
                "lat_ms": float(kv["Average Latency(s)"]) * 1000}
    except (KeyError, ValueError):
        raise RuntimeError(f"rados bench {mode}: unexpected output:\n{out[-2000:]}") from None


def rbd_bench(cl, label, args, io_size):
    out = sh(label, cl.cli("rbd", "bench", *args))
    m = re.search(r"elapsed:\s*(\S+)\s+ops:\s*(\d+)\s+ops/sec:\s*([\d.]+)", out)
    if not m:
        raise RuntimeError(f"rbd bench: unexpected output:\n{out[-2000:]}")
    ops, iops = int(m.group(2)), float(m.group(3))
    return {"iops": iops, "mbps": iops * io_size / MIB, "ops": ops, "bytes": ops * io_size,
            "secs": ops / iops if iops else 0.0}


# ---------------------------------------------------------------------------------------------
# devices, processes

def dev_stat(dev):
    """(sectors read, sectors written, discards) of a block device so far, in bytes."""
    with open(f"/sys/block/{os.path.basename(dev)}/stat") as f:
        s = [int(x) for x in f.read().split()]
    return {"read": s[2] * 512, "written": s[6] * 512, "discarded": s[13] * 512 if len(s) > 13 else 0}


def settle(dev, quiet=1.0, limit=60):
    """Waits until `dev` has had no I/O for `quiet` s (at most `limit` s); seconds waited."""
    path = f"/sys/block/{os.path.basename(dev)}/stat"
    t0 = since = time.monotonic()
    last = None
    while time.monotonic() - t0 < limit:
        with open(path) as f:
            s = f.read().split()[:11]
        s = s[:8] + s[10:]  # not in_flight / io_ticks
        if s != last:
            last, since = s, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        time.sleep(0.1)
    return time.monotonic() - t0


def ticks(pids):
    t = 0
    for p in pids:
        try:
            t += cpu_ticks(p)
        except (OSError, IndexError, ValueError):
            pass
    return t


def allocated(paths):
    return sum(os.stat(p).st_blocks * 512 for p in paths if os.path.exists(p))


def dir_allocated(d):
    t = 0
    for dp, _, fs in os.walk(d):
        for f in fs:
            try:
                st = os.lstat(os.path.join(dp, f))
                if not os.path.islink(os.path.join(dp, f)):
                    t += st.st_blocks * 512
            except OSError:
                pass
    return t


class ShmWatch:
    """The most the benchmark's directory held (allocated bytes), sampled; refuses to go on
    past `limit`."""

    def __init__(self, d, limit):
        self.d, self.limit, self.peak = d, limit, 0

    def sample(self):
        a = dir_allocated(self.d)
        self.peak = max(self.peak, a)
        if a > self.limit:
            raise RuntimeError(f"{self.d} holds {a / GIB:.1f} GiB, over the {self.limit / GIB:.0f} GiB limit")
        return a


def uraid_array(a, d, name, members, busy_poll, member_size):
    """Creates the RAID6 array `name` on `members` and starts `uraid serve`."""
    os.makedirs(d, exist_ok=True)
    sh("uraid create", [a.uraid, "create", "--level", "6", "--size", member_size, "--name", name, *members])
    sock, ctl = os.path.join(d, "nbd.sock"), os.path.join(d, "ctl.sock")
    argv = [a.uraid, "serve", f"--listen=unix:{sock}", f"--control=unix:{ctl}", "--busy-poll", busy_poll,
            *members]
    note(f"uraid serve (--busy-poll {busy_poll})", argv)
    s = Server(argv, sock=sock, log=os.path.join(d, "serve.log"), unlink=[ctl])
    s.ctl, s.uri, s.members = ctl, f"nbd+unix:///{name}?socket={sock}", list(members)
    s.cleanup = CLEAN.add(f"uraid serve {name}", lambda: s.stop(timeout=30))
    s.start()
    return s


def multi_conn(uri):
    j = json.loads(run(["nbdinfo", "--json", uri]))
    e = j["exports"][0]
    return e.get("can_multi_conn"), e.get("export-size")


# ---------------------------------------------------------------------------------------------
# part A

class Target:
    """A part-A target: its server (uraid serve or nbdkit), backing files and cluster."""

    def __init__(self, name, d):
        self.name, self.d = name, d
        self.server = self.cluster = self.loop = None
        self.backing = []


DISCARD_OFF = "[osd]\nbdev enable discard = false\nbdev async discard = false"


def start_target(a, d, name, volume, R):
    """Starts target `name`'s server (a uraid target makes its array; nbdkit a file of `volume`
    bytes) and its single-OSD cluster with pool 'rbd'; returns it."""
    t = Target(name, os.path.join(d, name))
    os.makedirs(t.d)
    if TARGET_KINDS[name] is not None:
        t.backing = [os.path.join(t.d, f"m{i}") for i in range(6)]
        t.server = uraid_array(a, t.d, f"ceph-{name}", t.backing, TARGET_KINDS[name], a.a_member_size)
        t.volume = status(t.server.ctl)["volume_size"]
    else:
        f, sock = os.path.join(t.d, "vol"), os.path.join(t.d, "nbd.sock")
        with open(f, "wb") as fh:
            fh.truncate(volume)
        argv = ["nbdkit", "-f", "--exit-with-parent", "-U", sock, "file", f]
        if a.nbdkit_cache != "default":
            argv.append(f"cache={a.nbdkit_cache}")
        note("nbdkit", argv)
        t.server = Server(argv, sock=sock, log=os.path.join(t.d, "nbdkit.log"))
        t.server.cleanup = CLEAN.add("nbdkit", lambda s=t.server: s.stop(timeout=30))
        t.server.start()
        t.server.uri = f"nbd+unix:///?socket={sock}"
        t.backing, t.volume = [f], volume
    mc, size = multi_conn(t.server.uri)
    R["a"]["servers"][name] = {"multi_conn": mc, "size": size}
    log(f"A: {name}: {t.server.uri} ({size} bytes, multi-conn {mc})")
    env = {}
    if a.bluestore_discard == "off":
        # mkfs keeps what is written now: every byte of the device written once first.
        t0 = time.monotonic()
        sh("precondition", ["fio", "--name=precondition", "--ioengine=nbd", f"--uri={t.server.uri}", "--rw=write",
                            "--bs=1m", "--iodepth=8", "--size=100%"])
        log(f"A: {name}: preconditioned in {time.monotonic() - t0:.0f} s")
        env["CEPH_CONF_EXTRA"] = DISCARD_OFF.replace("\n", "\\n")
    t.cluster = cl = Cluster(os.path.join(t.d, "ceph"), [t.server.uri], env).up()
    sh("pool rbd", cl.cli("ceph", "osd", "pool", "create", "rbd", "8", "8", "replicated"))
    sh("rbd pool init", cl.cli("rbd", "pool", "init", "rbd"))
    wait_clean(cl, 1)
    t.loop = cl.loop(0)
    meta = cl.mon("osd metadata", id=0)
    R["a"]["up"][name] = {"seconds": round(cl.up_s, 1), "allocated_after_up": allocated(t.backing),
                          "min_alloc": meta.get("bluestore_min_alloc_size"), "bdev_type": meta.get("bluestore_bdev_type")}
    log(f"A: {name}: cluster up in {cl.up_s:.1f} s; backing files hold "
        f"{R['a']['up'][name]['allocated_after_up'] / MIB:.0f} MiB")
    return t


def stop_target(t):
    CLEAN.pop(t.cluster.down)
    CLEAN.pop(t.server.cleanup)
    shutil.rmtree(t.d, ignore_errors=True)


def uraid_counters(ctl):
    """Client trims and writes, member writes and reads of a uraid server so far (bytes, counts)."""
    s = status(ctl)
    ops = s["requests"]["ops"]
    get = lambda op, k: ops.get(op, {}).get(k, 0)
    return {"trims": get("trim", "count"), "trim_bytes": get("trim", "bytes"), "writes": get("write", "bytes"),
            "member_writes": sum(sl["write"]["bytes"] for sl in s["slots"]),
            "member_reads": sum(sl["read"]["bytes"] for sl in s["slots"])}


def run_cells(a, t, others, objects, R, phase, r, shm):
    """One run of every cell on target `t`; `others`: the processes of the other clusters."""
    cl = t.cluster
    res = R["a"]["runs"].setdefault(phase, {}).setdefault(t.name, {})
    own = {"server": [t.server.pid], "nbdfuse": [cl.pid("nbdfuse")], "osd": [cl.pid("osd.0")]}
    is_uraid = TARGET_KINDS[t.name] is not None

    def cell(key, fn):
        settle(t.loop)
        c0 = {k: ticks(v) for k, v in own.items()}
        o0, w0 = ticks(others), time.monotonic()
        u0 = uraid_counters(t.server.ctl) if is_uraid else None
        v = fn()
        wall = time.monotonic() - w0
        v["cpu"] = {k: (ticks(own[k]) - c0[k]) / TICK for k in own}
        v["others_cpu_pct"] = 100 * (ticks(others) - o0) / TICK / wall
        if is_uraid:
            u1 = uraid_counters(t.server.ctl)
            v["uraid"] = {k: u1[k] - u0[k] for k in u0}
        v["allocated"] = allocated(t.backing)
        R["a"]["others_cpu_pct_max"] = max(R["a"].get("others_cpu_pct_max", 0), v["others_cpu_pct"])
        res.setdefault(key, []).append(v)
        extra = (f"; trims {v['uraid']['trims']}, member writes {v['uraid']['member_writes'] / MIB:.0f} MiB"
                 if is_uraid else "")
        log(f"A {phase} run {r + 1} {t.name:10} {key:5} {v['mbps']:8.1f} MiB/s {v['iops']:8.1f} IOPS "
            f"({v['ops']} ops in {v['secs']:.1f} s); CPU s server {v['cpu']['server']:.2f} "
            f"nbdfuse {v['cpu']['nbdfuse']:.2f} osd {v['cpu']['osd']:.2f}{extra}; backing files hold "
            f"{v['allocated'] / MIB:.0f} MiB, {shm.sample() / GIB:.1f} GiB in --dir")
        return v

    cell("write", lambda: rados_bench(cl, "rados bench write", a.seconds, "write",
                                      ["--no-cleanup", "--max-objects", objects]))
    cell("seq", lambda: rados_bench(cl, "rados bench seq", a.seconds, "seq"))
    cell("rand", lambda: rados_bench(cl, "rados bench rand", a.seconds, "rand"))
    sh("rados cleanup", cl.cli("rados", "-p", "bench", "cleanup"))
    img = "rbd/bench"
    sh("rbd create", cl.cli("rbd", "create", "--size", a.a_image_size, img))
    sh("rbd fill", cl.cli("rbd", "bench", "--io-type", "write", "--io-pattern", "seq", "--io-size", "4M",
                          "--io-threads", "4", "--io-total", a.a_image_size, img))
    v = cell("rbd", lambda: rbd_bench(cl, "rbd bench randwrite",
                                      ["--io-type", "write", "--io-pattern", "rand", "--io-size", "4K",
                                       "--io-threads", "16", "--io-total", a.a_rbd_total, img], 4096))
    u0 = uraid_counters(t.server.ctl) if is_uraid else None
    sh("rbd rm", cl.cli("rbd", "rm", "--no-progress", img))
    # bluestore discards what the image's overwrites and its removal freed, in the background:
    # how long until the device is quiet, and (uraid) the trims meanwhile.
    v["drain_s"] = settle(t.loop, limit=120)
    if is_uraid:
        u1 = uraid_counters(t.server.ctl)
        v["drain_uraid"] = {k: u1[k] - u0[k] for k in u0}
    v["allocated_after_run"] = allocated(t.backing)


def part_a(a, d, shm, R):
    """Each uraid target in a phase of its own, alternating with nbdkit (one nbdkit cluster for
    all phases): two uraid arrays and nbdkit's file side by side could outgrow /dev/shm."""
    uraids = [n for n in a.targets if TARGET_KINDS[n] is not None]
    ref = "nbdkit" in a.targets
    volume = None
    ref_t = None
    phases = uraids or [None]
    for phase in phases:
        t = start_target(a, d, phase, None, R) if phase else None
        if t is not None:
            volume = t.volume
        if ref and ref_t is None:
            if volume is None:
                volume = 4 * (size_bytes(a.a_member_size) - 2 * MIB)  # no uraid target: about a 4+2 volume
            ref_t = start_target(a, d, "nbdkit", volume, R)
        objects = int(volume * a.a_fill) // OBJ
        R["a"].update(volume=volume, objects=objects)
        order = [x for x in (phase, "nbdkit" if ref else None) if x]
        ts = {x: (t if x == phase else ref_t) for x in order}
        label = phase or "nbdkit"
        R["a"]["phases"].append({"label": label, "order": order})
        shm.sample()
        for r in range(a.runs):
            for name in order:
                others = [p for o in order if o != name for p in ts[o].cluster.daemon_pids() + [ts[o].server.pid]]
                run_cells(a, ts[name], others, objects, R, label, r, shm)
        if t is not None:
            stop_target(t)
    if ref_t is not None:
        stop_target(ref_t)
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# part B

def b_snapshot(cl, osds, servers=()):
    """Counters for the failure window: recovery perf counters of `osds`, the PG stats' sum and
    per-PG bytes and acting sets, device bytes of each OSD's block device, uraid member I/O."""
    perf = {i: cl.perf(i) for i in osds}
    d = cl.mgr("pg dump")
    pm = d["pg_map"]
    ss = pm["pg_stats_sum"]["stat_sum"]
    return {
        "recovery_bytes": sum(p["recovery_bytes"] for p in perf.values()),
        "recovery_ops": sum(p["recovery_ops"] for p in perf.values()),
        "num_bytes_recovered": ss["num_bytes_recovered"],
        "num_objects_recovered": ss["num_objects_recovered"],
        "held_by_osd0": sum(p["stat_sum"]["num_bytes"] for p in pm["pg_stats"] if 0 in p["acting"]),
        "dev": {i: dev_stat(cl.loop(i)) for i in osds},
        "uraid": [status(s.ctl) for s in servers],
    }


def b_delta(before, after, osds):
    return {
        "recovery_bytes": after["recovery_bytes"] - before["recovery_bytes"],
        "recovery_ops": after["recovery_ops"] - before["recovery_ops"],
        "num_bytes_recovered": after["num_bytes_recovered"] - before["num_bytes_recovered"],
        "num_objects_recovered": after["num_objects_recovered"] - before["num_objects_recovered"],
        "dev_written": sum(after["dev"][i]["written"] - before["dev"][i]["written"] for i in osds),
        "dev_read": sum(after["dev"][i]["read"] - before["dev"][i]["read"] for i in osds),
    }


class HealthLog:
    """What Ceph's health (the mon) and PG states (the mgr's, from the OSDs' reports every
    second: the mon's copy lags by its digest period) were at each poll of a failure window."""

    def __init__(self, cl):
        self.cl, self.status, self.checks, self.pg_states = cl, set(), set(), set()

    def poll(self):
        """(health status, osdmap summary, every PG's brief stats)."""
        st, checks, osdmap, _, _ = health(self.cl)
        brief = pgs_brief(self.cl)
        self.status.add(st)
        self.checks.update(checks)
        self.pg_states.update(p["state"] for p in brief)
        return st, osdmap, brief


def fill(cl, a, R, key, nosd):
    v = rados_bench(cl, "rados bench write (part B)", 600, "write", ["--no-cleanup", "--max-objects", a.b_objects])
    if v["ops"] != a.b_objects:
        raise RuntimeError(f"rados bench wrote {v['ops']} objects, not {a.b_objects}")
    wait_clean(cl, nosd, objects=a.b_objects + 1)  # + rados bench's metadata object
    R["fill_mbps"] = v["mbps"]
    log(f"B {key}: {a.b_objects} objects written ({v['mbps']:.0f} MiB/s), clean")


def b1(a, d, shm, drives, spare, R):
    arrays = []
    for k in range(len(drives) // 4):
        arrays.append(uraid_array(a, os.path.join(d, f"arr{k}"), f"cephb{k}", drives[4 * k:4 * k + 4], "0",
                                  a.b_drive_size))
    env = {"CEPH_POOL_SIZE": "2", "CEPH_POOL_MIN_SIZE": "1", "CEPH_PG_NUM": str(a.b_pg)}
    cl = Cluster(os.path.join(d, "ceph1"), [s.uri for s in arrays], env).up()
    nosd = len(arrays)
    R["up_seconds"] = round(cl.up_s, 1)
    wait_clean(cl, nosd)
    fill(cl, a, R, "B1", nosd)
    shm.sample()
    osds = list(range(nosd))
    s0 = arrays[0]
    before = b_snapshot(cl, osds, arrays)
    R["held_by_failed"] = before["held_by_osd0"]
    with open(spare, "wb") as f:
        f.truncate(size_bytes(a.b_drive_size))
    hl = HealthLog(cl)
    t0 = time.monotonic()
    sh("uraid fail", [a.uraid, "fail", "0", "--control", f"unix:{s0.ctl}", *s0.members])
    sh("uraid add", [a.uraid, "add", spare, "--control", f"unix:{s0.ctl}", *s0.members[1:]])
    t_added = time.monotonic() - t0
    last_ceph = 0
    while True:
        st = status(s0.ctl)
        if (not st["degraded"] and all(sl["state"] == "active" for sl in st["slots"])
                and not any(b["op"] == "rebuild" for b in st["background"])):
            break
        if time.monotonic() - last_ceph >= 0.2:
            hl.poll()
            last_ceph = time.monotonic()
        if time.monotonic() - t0 > 600:
            raise RuntimeError("B1: rebuild not finished within 600 s")
        time.sleep(0.05)
    t_done = time.monotonic() - t0
    t_end = time.monotonic() + a.b_observe
    while time.monotonic() < t_end:
        hl.poll()
        time.sleep(0.5)
    ev = [e["message"] for e in events(s0.ctl) if "rebuild" in e["message"] and "finished in" in e["message"]]
    after = b_snapshot(cl, osds, arrays)
    shm.sample()
    R.update(delta=b_delta(before, after, osds), seconds_to_redundancy=t_done, seconds_fail_to_added=t_added,
             rebuild_event=ev[-1] if ev else None, health_seen=sorted(hl.status), checks_seen=sorted(hl.checks),
             pg_states_seen=sorted(hl.pg_states),
             # The rebuild's member I/O: units regenerated (one chunk each written to the new
             # member), and what the survivors (slots 1..3, the same devices throughout) read.
             uraid_written=(after["uraid"][0]["rebuild_units"]["rebuilt"]
                            - before["uraid"][0]["rebuild_units"]["rebuilt"]) * after["uraid"][0]["chunk"],
             uraid_read=sum(b["read"]["bytes"] - a_["read"]["bytes"] for a_, b in
                            zip(before["uraid"][0]["slots"][1:], after["uraid"][0]["slots"][1:])),
             rss_osd_mib=sum(proc_bytes(cl.pid(f"osd.{i}"), "VmRSS") for i in osds) / MIB)
    log(f"B1: rebuild done {t_done:.1f} s after the failure ({ev[-1] if ev else 'no event'}); Ceph health "
        f"seen {sorted(hl.status)}, PG states {sorted(hl.pg_states)}; recovery_bytes "
        f"{R['delta']['recovery_bytes']}, num_bytes_recovered {R['delta']['num_bytes_recovered']}")
    CLEAN.pop(cl.down)
    for s in arrays:
        s.stop(timeout=30)


def b2(a, d, shm, drives, R):
    env = {"CEPH_POOL_SIZE": "2", "CEPH_POOL_MIN_SIZE": "1", "CEPH_PG_NUM": str(a.b_pg)}
    cl = Cluster(os.path.join(d, "ceph2"), drives, env).up()
    nosd = len(drives)
    R["up_seconds"] = round(cl.up_s, 1)
    wait_clean(cl, nosd)
    fill(cl, a, R, "B2", nosd)
    shm.sample()
    osds = list(range(1, nosd))  # the survivors
    before = b_snapshot(cl, osds)
    R["held_by_failed"] = before["held_by_osd0"]
    pid0 = cl.pid("osd.0")
    hl = HealthLog(cl)
    t0 = time.monotonic()
    os.kill(pid0, signal.SIGKILL)
    note("kill osd.0 (B2)", f"kill -KILL $(cat {cl.w}/run/osd.0.pid)")
    cl.mon("osd out", ids=["0"])
    note("osd out", ["ceph", "-c", cl.conf, "osd", "out", "0"])
    t_out = time.monotonic() - t0
    t_down = t_clean = t_ok = at_clean = None
    while True:
        st, osdmap, brief = hl.poll()
        now = time.monotonic() - t0
        if t_down is None and osdmap["num_up_osds"] == nosd - 1:
            t_down = now
        if t_clean is None and t_down is not None and all(
                p["state"] == "active+clean" and 0 not in p["up"] and 0 not in p["acting"] for p in brief):
            t_clean = now
            # A check on the criterion: what recovery had pushed by then.
            at_clean = sum(cl.perf(i)["recovery_bytes"] for i in osds) - before["recovery_bytes"]
        if t_clean is not None and st == "HEALTH_OK":
            t_ok = now
            break
        if now > 900:
            raise RuntimeError(f"B2: not clean within 900 s: {st} {sorted(set(p['state'] for p in brief))}")
        time.sleep(0.2)
    time.sleep(2)  # the last PG stats reach the mgr
    after = b_snapshot(cl, osds)
    shm.sample()
    R.update(delta=b_delta(before, after, osds), seconds_to_redundancy=t_clean, seconds_to_health_ok=t_ok,
             recovered_at_clean=at_clean,
             seconds_to_down=t_down, seconds_to_out=t_out, health_seen=sorted(hl.status),
             checks_seen=sorted(hl.checks), pg_states_seen=sorted(hl.pg_states),
             rss_osd_mib=sum(proc_bytes(cl.pid(f"osd.{i}"), "VmRSS") for i in osds) / MIB)
    log(f"B2: osd.0 down after {t_down:.1f} s, all PGs active+clean after {t_clean:.1f} s, HEALTH_OK after "
        f"{t_ok:.1f} s; recovery_bytes {R['delta']['recovery_bytes']}, num_bytes_recovered "
        f"{R['delta']['num_bytes_recovered']}")
    CLEAN.pop(cl.down)


def part_b(a, d, shm, R):
    os.makedirs(d)
    drives = [os.path.join(d, f"d{i}") for i in range(a.b_drives)]
    spare = os.path.join(d, "spare")

    def fresh():
        for p in drives + [spare]:
            if os.path.exists(p):
                os.unlink(p)

    for r in range(a.b_runs):
        for key in ("B1", "B2"):
            fresh()
            res = {}
            if key == "B1":
                b1(a, d, shm, drives, spare, res)  # uraid create makes the drive files
            else:
                make_drives(drives, a.b_drive_size)
                b2(a, d, shm, drives, res)
            R["b"].setdefault(key, []).append(res)
            for sub in os.listdir(d):
                if not sub.startswith(("d", "spare")):
                    shutil.rmtree(os.path.join(d, sub), ignore_errors=True)
        fresh()


def make_drives(drives, size):
    for p in drives:
        with open(p, "wb") as f:
            f.truncate(size_bytes(size))


# ---------------------------------------------------------------------------------------------
# report

def mem_gib():
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / (1 << 20)


def med(xs):
    return statistics.median(xs)


def report(a, R, defaults, wall):
    L = []
    w = L.append
    changed = [f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()
               if k not in ("out", "dir", "uraid") and defaults.get(k) != v]
    w("## Ceph: OSDs on uraid")
    w("")
    if changed:
        w(f"**Short validation run, not a measurement**: settings differ from the script's defaults "
          f"({', '.join(changed)}). Numbers below only show that the script works.")
        w("")
    w(f"Command: `python3 scripts/bench_ceph.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}` "
      f"(the script's docstring says what each part does; total wall time {wall / 60:.1f} min, "
      f"finished {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).")
    w("")
    w(f"- Host: {cpu_model()}, {os.cpu_count()} cores, {mem_gib():.0f} GiB; kernel {os.uname().release}; "
      "everything (servers, nbdfuse, Ceph daemons, benchmark clients) shares the cores.")
    w(f"- {R['versions']['ceph']}; {R['versions']['nbdkit']}; {R['versions']['nbdfuse']}.")
    w(f"- uraid: `{a.uraid}` ({R['versions']['uraid']}), repository at {R['versions']['commit']}.")
    w(f"- Largest allocation of the benchmark's directory on /dev/shm: {R['shm_peak'] / GIB:.1f} GiB.")
    w("")
    if R["a"].get("phases"):
        A = R["a"]
        res = A["runs"]
        phases = A["phases"]
        names = [n for p in phases for n in p["order"]]
        first = next(iter(A["up"].values()))
        w("### A: one OSD on uraid against one OSD on nbdkit's file plugin")
        w("")
        disc = a.bluestore_discard == "on"
        w(f"Each target: NBD on a Unix socket -> `nbdfuse -C 4` -> loop device (direct I/O) -> one "
          f"bluestore OSD (`scripts/ceph-osd.sh up`: pool size 1, 8 PGs; bluestore sees {first['bdev_type']}, "
          f"min_alloc_size {first['min_alloc']}, discard {'on' if disc else 'off (bdev_enable_discard = false)'}). "
          f"uraid: RAID6 of six {a.a_member_size} files on /dev/shm, chunk 64K, volume {A['volume']} bytes, "
          "`--busy-poll 0` (uraid) or the default 50 (uraid-bp50); nbdkit: one sparse /dev/shm file of that "
          f"size, {'nbdkit defaults (cache=default, fadvise=normal)' if a.nbdkit_cache == 'default' else 'cache=' + a.nbdkit_cache}. "
          "Multi-conn offered: " + ", ".join(f"{n} {'yes' if A['servers'][n]['multi_conn'] else 'no'}"
                                             for n in A["servers"]) + ". "
          f"One cluster per target, reused by all {a.runs} runs (each run deletes its objects and image). "
          "Each uraid target has a phase of its own in which it takes turns with nbdkit, run by run "
          f"({'; '.join(', '.join(p['order']) for p in phases)}); nbdkit's cluster serves every phase. Two "
          "uraid arrays and nbdkit's file side by side could take more than 12 GiB of /dev/shm (see the trims "
          f"below). The idle cluster used at most {A.get('others_cpu_pct_max', 0):.1f}% of a core during any cell.")
        w("")
        if disc:
            w("Not preconditioned: bluestore's mkfs discards the whole device (`bdev_enable_discard`), which "
              "both servers turn into hole punches, so a device written end to end first would be sparse again "
              "when the OSD starts (`--bluestore-discard off` preconditions). Backing files' allocation right "
              "after `up`: " + ", ".join(f"{n} {u['allocated_after_up'] / MIB:.0f} MiB" for n, u in A["up"].items()) + ".")
        else:
            w("Preconditioned: every device written end to end (fio, nbd engine, 1M sequential writes) before "
              "`up`; the OSDs discard nothing. Backing files' allocation after `up`: " +
              ", ".join(f"{n} {u['allocated_after_up'] / MIB:.0f} MiB" for n, u in A["up"].items()) + ".")
        w("")
        w(f"Cells: `rados bench` {a.seconds} s (16 ops in flight; write capped at {A['objects']} objects "
          f"= {A['objects'] * OBJ / GIB:.2f} GiB, {a.a_fill:.0%} of the volume, so it can end before {a.seconds} s; "
          f"seq ends when every object was read once), `rbd bench` 4K random writes, 16 threads, "
          f"{a.a_rbd_total} on a {a.a_image_size} image written once before. MiB/s as rados bench reports it "
          f"(its \"MB/sec\" is 2^20 bytes/s). Medians of {a.runs} runs; ratio = uraid target / nbdkit in the "
          "same phase.")
        w("")

        def val(c, x):
            return x["iops"] if c == "rbd" else x["mbps"]

        cols, hdr = [], ["cell"]
        for p in phases:
            for n in p["order"]:
                cols.append((p["label"], n))
                hdr.append(n if n != "nbdkit" or len(phases) == 1 else f"nbdkit (with {p['label']})")
            if "nbdkit" in p["order"] and p["label"] != "nbdkit":
                cols.append((p["label"], "ratio"))
                hdr.append(f"{p['label']} / nbdkit")
        w("| " + " | ".join(hdr) + " |")
        w("|---|" + "---:|" * (len(hdr) - 1))
        for c in CELLS:
            row = [CELL_TITLE[c]]
            for ph, n in cols:
                if n == "ratio":
                    u = med([val(c, x) for x in res[ph][ph][c]])
                    k = med([val(c, x) for x in res[ph]["nbdkit"][c]])
                    row.append(f"{u / k:.2f}×")
                    continue
                xs = res[ph][n][c]
                mb, io = med([x["mbps"] for x in xs]), med([x["iops"] for x in xs])
                row.append(f"{mb:.1f} MiB/s, {io:.0f} IOPS" if c == "rbd" else f"{mb:.0f} MiB/s")
            w("| " + " | ".join(row) + " |")
        w("")
        w("Per run (MiB/s; rbd: IOPS), with the CPU seconds of the target's server / nbdfuse / OSD in that cell:")
        w("")
        w("| cell | target (phase) | " + " | ".join(f"run {i + 1}" for i in range(a.runs)) + " | spread |")
        w("|---|---|" + "---:|" * (a.runs + 1))
        for c in CELLS:
            for ph, n in cols:
                if n == "ratio":
                    continue
                xs = res[ph][n][c]
                vals = [val(c, x) for x in xs]
                cells = [f"{v:.0f} ({x['cpu']['server']:.2f} / {x['cpu']['nbdfuse']:.2f} / {x['cpu']['osd']:.2f} s)"
                         for v, x in zip(vals, xs)]
                sp = f"{spread(vals):.0%}" if len(vals) > 1 else "—"
                w(f"| {c} | {n} ({ph}) | " + " | ".join(cells) + f" | {sp} |")
        ratios = [f"{ph} {c} " + ", ".join(f"{val(c, x) / val(c, y):.2f}"
                                           for x, y in zip(res[ph][ph][c], res[ph]["nbdkit"][c]))
                  for ph, n in cols if n == "ratio" for c in CELLS]
        if ratios:
            w("")
            w("Per-run ratio to nbdkit (same run): " + "; ".join(ratios) + ".")
        w("")
        w("Server CPU per operation (median, µs per 4 MiB object or per 4K write): " + "; ".join(
            f"{n} ({ph}) " + ", ".join(
                f"{c} {med([x['cpu']['server'] / max(x['ops'], 1) * 1e6 for x in res[ph][n][c]]):.0f}" for c in CELLS)
            for ph, n in cols if n != "ratio") + ".")
        w("")
        # What bluestore's discards cost uraid.
        ur = [(ph, n) for ph, n in cols if n not in ("ratio", "nbdkit")]
        if ur:
            lines = []
            for ph, n in ur:
                rb = res[ph][n]["rbd"]
                tr = med([x["uraid"]["trims"] for x in rb])
                dr = med([x["drain_uraid"]["trims"] for x in rb])
                mw = med([x["uraid"]["member_writes"] / max(x["uraid"]["writes"], 1) for x in rb])
                lines.append(f"{n}: {tr:.0f} trims during the rbd cell and {dr:.0f} more while its discards "
                             f"drained after `rbd rm` ({med([x['drain_s'] for x in rb]):.1f} s; nbdkit "
                             f"{med([x['drain_s'] for x in res[ph]['nbdkit']['rbd']]):.1f} s)"
                             if "nbdkit" in res[ph] else
                             f"{n}: {tr:.0f} trims during the rbd cell, {dr:.0f} more after `rbd rm`")
                lines[-1] += f"; member bytes written per client byte in the rbd cell {mw:.1f}"
            w("Trims: " + "; ".join(lines) + ". Backing files' allocation after each run (MiB): " + "; ".join(
                f"{n} ({ph}) " + ", ".join(f"{x['allocated_after_run'] / MIB:.0f}" for x in res[ph][n]["rbd"])
                for ph, n in cols if n != "ratio") + ".")
            w("")
        w("Cluster bring-up (`ceph-osd.sh up` to HEALTH_OK): " +
          ", ".join(f"{n} {u['seconds']} s" for n, u in A["up"].items()) + ".")
        w("")
    if "b" in R and R["b"].get("B1") and R["b"].get("B2"):
        B = R["b"]
        nd = a.b_drives
        w("### B: a drive failure, uraid under Ceph against one OSD per drive")
        w("")
        w(f"{nd} drives: sparse {a.b_drive_size} files on /dev/shm. Pool `bench`: size 2, min_size 1, "
          f"{a.b_pg} PGs, failure domain osd (one host). Both hold the same {a.b_objects} objects of "
          f"4 MiB ({a.b_objects * OBJ / GIB:.2f} GiB of user data, 2 copies), written by `rados bench` "
          f"and HEALTH_OK before the failure; no client I/O during it.")
        w("")
        w(f"- **B1**: {nd // 4} uraid RAID6 arrays of 4 drives (2+2), `uraid serve --busy-poll 0` each, one "
          f"OSD per array through nbdfuse + loop (as in A). Failure: `uraid fail 0` on array 0, then "
          f"`uraid add` of a fresh spare file; redundancy is full again when uraid's rebuild finished "
          f"(its /status polled every 50 ms); Ceph watched for {a.b_observe} s more.")
        w(f"- **B2**: {nd} OSDs, one per drive (a loop device with direct I/O on each file). Failure: "
          "osd.0 (drive 0) killed with SIGKILL and marked out at once with `ceph osd out 0` "
          "(mon_osd_down_out_interval, 600 s by default, would come first otherwise); redundancy is "
          "full again when every PG is active+clean on the survivors (polled every 0.2 s through librados; "
          "the OSDs report PG stats to the mgr every second, `mgr stats period = 1`, so about 1 s of "
          "resolution). Both: Ceph's recovery settings are 16.2's defaults (osd_max_backfills 1, "
          "osd_recovery_max_active_ssd 10, no recovery sleep on SSDs).")
        w("")
        runs1, runs2 = B["B1"], B["B2"]

        def num(runs, get, fmt):
            """The median over the runs, then each run's value (one run: the value)."""
            xs = [get(r) for r in runs]
            return fmt(xs[0]) if len(xs) == 1 else f"{fmt(med(xs))} ({', '.join(fmt(x) for x in xs)})"

        def text(runs, get):
            """Everything seen in any run."""
            seen = []
            for r in runs:
                seen += [x for x in get(r) if x not in seen]
            return ", ".join(seen)

        def mib(x):
            return f"{x / MIB:.0f} MiB"

        def sec(x):
            return f"{x:.1f} s"

        def both(title, get, fmt, note1="", note2=""):
            w(f"| {title} | {num(runs1, get, fmt)}{note1} | {num(runs2, get, fmt)}{note2} |")

        def delta(key):
            return lambda r: r["delta"][key]

        drive = size_bytes(a.b_drive_size)
        w(f"Medians over {a.b_runs} run(s) of each" + (", each run's value in brackets" if a.b_runs > 1 else "") + ":")
        w("")
        w("| | B1: uraid under Ceph | B2: one OSD per drive |")
        w("|---|---:|---:|")
        w(f"| OSDs; usable capacity (OSD space / 2 copies) | {nd // 4}; {nd // 4 * 2 * drive / 2 / GIB:.1f} GiB "
          f"| {nd}; {nd * drive / 2 / GIB:.1f} GiB |")
        both("bytes the failed drive's OSD held (PG stats)", lambda r: r["held_by_failed"], mib,
             " (array 0's OSD; none of it lost)")
        both("**time to full redundancy**", lambda r: r["seconds_to_redundancy"], sec,
             " (failure to rebuild finished)", " (kill to every PG active+clean in the mgr's PG stats)")
        both("**bytes Ceph moved: `recovery_bytes`** (OSD perf counters)", delta("recovery_bytes"), mib)
        both("objects Ceph pushed: `recovery_ops`", delta("recovery_ops"), lambda x: f"{x:.0f}")
        both("PG stats `num_bytes_recovered` (`ceph pg dump`)", delta("num_bytes_recovered"), mib)
        both("written to the OSDs' block devices in the window", delta("dev_written"), mib, "", " (survivors)")
        both("read from the OSDs' block devices in the window", delta("dev_read"), mib, "", " (survivors)")
        w(f"| Ceph health (and checks) seen in the window | {text(runs1, lambda r: r['health_seen'] + r['checks_seen'])} "
          f"| {text(runs2, lambda r: r['health_seen'] + r['checks_seen'])} |")
        w(f"| PG states seen in the window | {text(runs1, lambda r: r['pg_states_seen'])} "
          f"| {text(runs2, lambda r: r['pg_states_seen'])} |")
        w(f"| uraid's rebuild (array 0, local) | {num(runs1, lambda r: r['uraid_read'], mib)} read from the "
          f"survivors, {num(runs1, lambda r: r['uraid_written'], mib)} rebuilt onto the new drive | — |")
        both("cluster bring-up (`ceph-osd.sh up`)", lambda r: r["up_seconds"], sec)
        both("RSS of the OSDs, summed (after)", lambda r: r["rss_osd_mib"], lambda x: f"{x:.0f} MiB")
        w("")
        w("B1 rebuild event: " + "; ".join(f"`{r['rebuild_event']}`" for r in runs1) +
          "; `uraid fail` + `uraid add` took " + ", ".join(f"{r['seconds_fail_to_added']:.1f} s" for r in runs1) + ".")
        w("B2: osd.0 marked down " + ", ".join(f"{r['seconds_to_down']:.1f} s" for r in runs2) +
          " after the kill; HEALTH_OK again after " + ", ".join(f"{r['seconds_to_health_ok']:.1f} s" for r in runs2) +
          "; `recovery_bytes` already pushed when every PG was first seen active+clean: " +
          ", ".join(f"{r['recovered_at_clean'] / MIB:.0f} MiB" for r in runs2) + " (the health the mon "
          "reports lags the PG states: it may not have left HEALTH_OK at all in a short recovery).")
        w("Writes of the fill: B1 " + ", ".join(f"{r['fill_mbps']:.0f}" for r in runs1) + " MiB/s, B2 " +
          ", ".join(f"{r['fill_mbps']:.0f}" for r in runs2) + " MiB/s (rados bench, 16 in flight).")
        w("")
    w("Commands (as run; `-c WORKDIR/ceph.conf` picks the cluster):")
    w("")
    w("```sh")
    for k, v in COMMANDS.items():
        w(f"# {k}")
        w(v)
    w("```")
    w("")
    return "\n".join(L)


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="part A: runs of every cell on every target")
    ap.add_argument("--parts", default="AB", help="A, B or AB")
    ap.add_argument("--targets", default="uraid,nbdkit,uraid-bp50",
                    help="part A, in turn order: uraid (--busy-poll 0), nbdkit, uraid-bp50 (--busy-poll 50)")
    ap.add_argument("--seconds", type=int, default=10, help="part A: rados bench duration")
    ap.add_argument("--a-member-size", default="1G", help="part A: each of the six uraid member files")
    ap.add_argument("--a-fill", type=float, default=0.5, help="part A: rados bench write cap, share of the volume")
    ap.add_argument("--a-image-size", default="1G", help="part A: the RBD image")
    ap.add_argument("--a-rbd-total", default="256M", help="part A: rbd bench --io-total of the 4K random writes")
    ap.add_argument("--nbdkit-cache", choices=["default", "none"], default="default")
    ap.add_argument("--bluestore-discard", choices=["on", "off"], default="on",
                    help="part A: off sets bdev_enable_discard = false on the OSDs and preconditions "
                         "every device (written end to end before mkfs)")
    ap.add_argument("--b-runs", type=int, default=3, help="part B: runs of B1 and B2 (alternating)")
    ap.add_argument("--b-drives", type=int, default=12, help="part B: drives, a multiple of 4")
    ap.add_argument("--b-drive-size", default="1G")
    ap.add_argument("--b-objects", type=int, default=256, help="part B: 4 MiB objects written")
    ap.add_argument("--b-pg", type=int, default=64, help="part B: pg_num of the pool")
    ap.add_argument("--b-observe", type=float, default=10, help="part B1: seconds Ceph is watched after the rebuild")
    ap.add_argument("--shm-limit", default="12G", help="stop if --dir holds more than this")
    ap.add_argument("--dir", default="/dev/shm/uraid-ceph")
    ap.add_argument("--uraid", default=URAID)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "bench-sections", "ceph.md"))
    defaults = {k: ap.get_default(k) for k in vars(ap.parse_args([]))}
    a = ap.parse_args()
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    defaults["targets"] = [t for t in defaults["targets"].split(",")]
    for t in a.targets:
        if t not in TARGET_KINDS:
            sys.exit(f"unknown target {t} (uraid, nbdkit, uraid-bp50)")
    if a.b_drives % 4 or a.b_drives < 8:
        sys.exit("--b-drives: a multiple of 4, at least 8")
    if os.getuid() != 0:
        sys.exit("needs root (FUSE, loop devices)")
    for tool in ("ceph-osd", "rados", "rbd", "nbdkit", "nbdfuse", "nbdinfo", "curl", "losetup"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found (scripts/ceph-osd.sh install; scripts/setup.sh)")
    if not os.access(a.uraid, os.X_OK):
        sys.exit(f"{a.uraid}: not found (cargo build --release, or --uraid)")
    if len(a.dir) > 40:
        sys.exit("--dir: at most 40 characters (admin socket paths under it are limited)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    t_start = time.monotonic()
    R = {"a": {"servers": {}, "up": {}, "runs": {}, "phases": []}, "b": {}}
    R["versions"] = {
        "ceph": run(["ceph", "--version"]).strip(),
        "nbdkit": run(["nbdkit", "--version"]).strip(),
        "nbdfuse": run(["nbdfuse", "--version"]).splitlines()[0].strip(),
        "uraid": run([a.uraid, "--version"]).strip(),
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip() or "?",
    }
    shm = ShmWatch(a.dir, size_bytes(a.shm_limit))
    if os.path.exists(a.dir):
        sys.exit(f"{a.dir} exists: a run in progress, or left over (run `scripts/ceph-osd.sh down` on each "
                 f"ceph dir under it, stop its servers, remove it)")
    os.makedirs(a.dir)
    CLEAN.add(f"rm -r {a.dir}", lambda: shutil.rmtree(a.dir, ignore_errors=True))
    try:
        if "A" in a.parts.upper():
            log(f"part A: targets {', '.join(a.targets)}, {a.runs} runs")
            part_a(a, os.path.join(a.dir, "a"), shm, R)
        if "B" in a.parts.upper():
            log(f"part B: {a.b_drives} drives, {a.b_runs} run(s)")
            part_b(a, os.path.join(a.dir, "b"), shm, R)
        R["shm_peak"] = shm.peak
        wall = time.monotonic() - t_start
        text = report(a, R, defaults, wall)
        write_report(a.out, text)
        log(f"report: {a.out}")
    finally:
        CLEAN.run()
        wall = time.monotonic() - t_start
        print(f"bench_ceph: total wall time {wall:.0f} s ({wall / 60:.1f} min)", file=sys.stderr)


if __name__ == "__main__":
    main()
