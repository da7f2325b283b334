#!/usr/bin/env python3
"""uraid PTS: a SNIA PTS-E style benchmark suite, run side by side on one machine.

Targets (all of the same size, on the same filesystem, measured in one run):
  raw             the member files themselves, through fio (psync on tmpfs, io_uring elsewhere)
  uraid           the array in-process (`uraid bench`), RAID6 8+2 by default
  uraid-deg1/2    the same array with one / two members missing (`uraid bench` on a copy)
  uraid-nbd-*     `uraid serve` over a Unix socket / TCP loopback, driven by fio's nbd engine
  nbdkit-*        nbdkit's file plugin serving one file of the volume's size, same fio job
  qemu-nbd-*      qemu-nbd (cache=none, aio=native) serving that file, same fio job
  zfs-raidz2      a file on a zfs-fuse RAIDZ2 pool over member files, the raw target's fio jobs
                  (only when Debian's zfs-fuse is installed and runs; otherwise the report says why)

Tests (SNIA PTS-E 1.1): IOPS (block sizes x read/write mixes, random, threads x QD), latency
(4k/8k/16k x 0/100 65/35 100/0 at QD1, one thread) and throughput (128k and 1M sequential read
and write). Every device is preconditioned first (the whole volume written twice with 128 KiB
sequential writes); then rounds run until the test's tracking cell is in steady state (or a
fixed count in quick mode) and the median of the measurement window is reported.

    scripts/pts.py                          full run: docs/benchmarks.md, docs/bench/*.png + results.json
    scripts/pts.py --quick --out DIR        CI smoke: small matrix, short rounds; exits 1 unless
                                            every cell of every target produced a number
"""
import argparse, glob, datetime, json, math, os, platform, shutil, signal, statistics
import subprocess, sys, tempfile, time

from benchlib import KIB, MIB, ROOT, TICK, URAID, Server, cpu_model, cpu_ticks, fio_json, free_port, is_tmpfs, run

FULL = dict(
    iops_bs=["4k", "8k", "16k", "32k", "64k", "128k", "1m"],
    iops_mix=[0, 5, 35, 50, 65, 95, 100],
    lat_bs=["4k", "8k", "16k"], lat_mix=[0, 65, 100],
    tp_bs=["128k", "1m"],
    runtime=1.0, min_rounds=3, max_rounds=5, window=3, member_mib=256,
)
QUICK = dict(
    iops_bs=["4k", "1m"], iops_mix=[0, 65, 100],
    lat_bs=["4k"], lat_mix=[0, 65, 100],
    tp_bs=["1m"],
    runtime=0.1, min_rounds=1, max_rounds=1, window=1, member_mib=16,
)
TESTS = ("iops", "lat", "tp")
TEST_TITLE = {"iops": "IOPS", "lat": "latency (QD1)", "tp": "throughput"}
# SNIA's tracking variable per test: the cell whose rounds decide steady state.
TRACK = {"iops": ("4k", 0, "iops"), "lat": ("4k", 0, "lat_avg_us"), "tp": ("1m", "write", "mbps")}

TARGETS = {
    "raw": "raw member files (fio)",
    "uraid": "uraid in-process",
    "uraid-nbd-unix": "uraid serve, Unix socket",
    "uraid-nbd-tcp": "uraid serve, TCP",
    "nbdkit-unix": "nbdkit file, Unix socket",
    "nbdkit-tcp": "nbdkit file, TCP",
    "qemu-nbd-unix": "qemu-nbd, Unix socket",
    "qemu-nbd-tcp": "qemu-nbd, TCP",
    "uraid-deg1": "uraid in-process, 1 member missing",
    "uraid-deg2": "uraid in-process, 2 members missing",
    "zfs-raidz2": "ZFS RAIDZ2 8+2 (zfs-fuse)",
}

# zfs-fuse (Debian's package; ZFS pool version 23 in user space behind FUSE, the kernel has no ZFS).
ZFS_MIN_MIB = 64  # ZFS refuses vdevs smaller than this (SPA_MINDEVSIZE): quick mode's members are raised to it
ZFS_FILL = 0.8    # the benchmark file takes at most this share of the pool's free space (copy-on-write needs room)
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def zfs_label(members):
    return f"ZFS RAIDZ2 {members - 2}+2 (zfs-fuse)"


def zfs_tool(name):
    return shutil.which(name, path=SBIN_PATH)


def zfs_missing():
    """Why the zfs-raidz2 target cannot run on this machine, or None."""
    missing = [t for t in ("zfs-fuse", "zpool", "zfs") if not zfs_tool(t)]
    if missing:
        return (f"zfs-fuse is not installed ({', '.join(missing)} not found; scripts/setup.sh installs "
                "Debian's zfs-fuse)")
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (zfs-fuse is a FUSE file system)"
    if os.geteuid() != 0:
        return "zfs-fuse needs root (its daemon's control socket is root's and it mounts with allow_other)"
    return None


def md_note():
    """Whether Linux md, the seeds' other comparison, exists in this kernel (it is not a target either way)."""
    if os.path.exists("/proc/mdstat"):
        return ("Linux md is in this kernel (/proc/mdstat exists) but is not a target: it needs block "
                "devices (loop devices over the member files) and root.")
    mods = sorted(m for m in os.listdir("/sys/module") if "raid" in m.lower() or m == "md_mod") \
        if os.path.isdir("/sys/module") else []
    seen = ["no /proc/mdstat",
            "no raid or md_mod entry in /sys/module" if not mods else f"/sys/module has {', '.join(mods)}"]
    if not os.path.exists("/proc/modules"):
        seen.append("no /proc/modules: the kernel cannot load modules")
    return (f"The seeds also compare against Linux md; md is not available in this kernel ({'; '.join(seen)}), "
            "so there is no md target.")


def mix_label(r):
    return f"R{r}/W{100 - r}"


def cells(cfg, test):
    if test == "iops":
        return [(bs, m) for bs in cfg["iops_bs"] for m in cfg["iops_mix"]]
    if test == "lat":
        return [(bs, m) for bs in cfg["lat_bs"] for m in cfg["lat_mix"]]
    return [(bs, d) for bs in cfg["tp_bs"] for d in ("read", "write")]


def key(cell):
    return f"{cell[0]}/{cell[1]}"


# ---------------------------------------------------------------------------------------------
# fio job files: one fio run per (target, test, round), one stonewalled job per cell.

def fio_result(job):
    m = job["mixed"]
    lat = m["lat_ns"]
    pct = lat.get("percentile", {})
    return {
        "iops": m["iops"], "mbps": m["bw_bytes"] / 1e6,
        "lat_avg_us": lat["mean"] / 1e3, "lat_p99_us": pct.get("99.000000", 0) / 1e3,
        "lat_p999_us": pct.get("99.900000", 0) / 1e3, "lat_max_us": lat["max"] / 1e3,
        "ios": m["total_ios"], "errors": job.get("error", 0),
    }


CPU_CELL = ("4k", 100)


def fio_jobfile(glob, jobs):
    lines = ["[global]"] + [f"{k}={v}" for k, v in glob.items()]
    for name, opts in jobs:
        lines.append(f"[{name}]")
        lines.append("stonewall")
        lines += [f"{k}={v}" for k, v in opts.items()]
    return "\n".join(lines) + "\n"


def fio_run(glob, jobs, tmp):
    path = os.path.join(tmp, "job.fio")
    with open(path, "w") as f:
        f.write(fio_jobfile(glob, jobs))
    data = fio_json(["fio", "--output-format=json", path])
    return {j["jobname"]: fio_result(j) for j in data["jobs"]}


class Target:
    def __init__(self, name, suite):
        self.name, self.s = name, suite

    def start(self):
        pass

    def stop(self):
        pass


class FioTarget(Target):
    """A device fio drives: member files directly, or an NBD export."""

    def __init__(self, name, suite, glob, span, qd_engine=True):
        super().__init__(name, suite)
        self.glob, self.span, self.qd_engine = glob, span, qd_engine

    def cell_job(self, test, cell):
        s = self.s
        bs, m = cell
        if test == "lat":
            threads, qd = 1, 1
        else:
            threads, qd = s.threads, (s.qd if test == "iops" else s.tp_qd)
        job = {"bs": bs, "numjobs": threads}
        if self.qd_engine:
            job["iodepth"] = qd
        if test == "tp":
            job["rw"] = m
            # Each thread streams its own slice of the device.
            job["size"] = self.span["total"] // threads
            job["offset_increment"] = self.span["per_file"] // threads
        elif m == 100:
            job["rw"] = "randread"
        elif m == 0:
            job["rw"] = "randwrite"
        else:
            job.update(rw="randrw", rwmixread=m)
        return job

    def run(self, test, cs):
        glob = dict(self.glob, thread=1, group_reporting=1, time_based=1,
                    runtime=f"{int(self.s.runtime * 1000)}ms", norandommap=1, randrepeat=0,
                    unified_rw_reporting="mixed", lat_percentiles=1, percentile_list="99:99.9")
        jobs = [(f"{test}_{key(c).replace('/', '_')}", self.cell_job(test, c)) for c in cs]
        # An NBD server's CPU per request (issue 13) is measured on the 4k random read cell of
        # the IOPS test: that cell runs as its own fio run, the server's utime+stime read
        # around it.
        server = getattr(self, "server", None)
        split = test == "iops" and server is not None and CPU_CELL in cs
        groups = [jobs]
        if split:
            i = cs.index(CPU_CELL)
            groups = [g for g in (jobs[:i], jobs[i:i + 1], jobs[i + 1:]) if g]
        res = {}
        self.start()
        try:
            for g in groups:
                timed = split and g[0][0] == jobs[cs.index(CPU_CELL)][0]
                t0 = cpu_ticks(server.proc.pid) if timed else None
                res.update(fio_run(glob, g, self.s.tmp))
                if timed:
                    r = res[g[0][0]]
                    r["cpu_us"] = (cpu_ticks(server.proc.pid) - t0) / TICK * 1e6 / max(r["ios"], 1)
        finally:
            self.stop()
        return {key(c): res[n] for c, (n, _) in zip(cs, jobs)}

    def precondition(self):
        """SNIA workload-independent preconditioning: the whole device twice, 128 KiB sequential."""
        glob = dict(self.glob, thread=1, bs="128k", rw="write", loops=2, numjobs=1,
                    unified_rw_reporting="mixed")
        if self.qd_engine:
            glob["iodepth"] = 8
        self.start()
        try:
            fio_run(glob, [("precondition", {})], self.s.tmp)
        finally:
            self.stop()


def nbd_server(argv, logdir, **kw):
    """An NBD server (benchlib.Server) started for each fio run and stopped (SIGTERM) after it;
    its output is appended to LOGDIR/server-PROGRAM.log."""
    return Server(argv, log=os.path.join(logdir, f"server-{os.path.basename(argv[0])}.log"), **kw)


class NbdTarget(FioTarget):
    def __init__(self, name, suite, server, uri, size):
        span = {"total": size, "per_file": size}
        super().__init__(name, suite, {"ioengine": "nbd", "uri": uri}, span)
        self.server = server

    def start(self):
        self.server.start()

    def stop(self):
        self.server.stop()


class BenchTarget(Target):
    """uraid in-process: one `uraid bench` per cell."""

    def __init__(self, name, suite, members):
        super().__init__(name, suite)
        self.members = members

    def run(self, test, cs):
        s, out = self.s, {}
        for bs, m in cs:
            if test == "lat":
                threads, qd = 1, 1
            else:
                threads = s.threads
                qd = threads * (s.qd if test == "iops" else s.tp_qd)
            pct = (100 if m == "read" else 0) if test == "tp" else m
            # The arrays are the suite's own scratch copies: writes to them are allowed.
            argv = [s.uraid, "bench", "--json", "--allow-writes", "--runtime", str(s.runtime),
                    "--threads", str(threads), "--qd", str(qd), "--bs", bs.upper(), "--read-pct", str(pct),
                    "--pattern", "seq" if test == "tp" else "rand"] + self.members
            j = json.loads(run(argv).strip().splitlines()[-1])
            out[key((bs, m))] = {
                "iops": j["iops"], "mbps": j["mb_per_s"], "lat_avg_us": j["lat_avg_us"],
                "lat_p99_us": j["lat_p99_us"], "lat_p999_us": j["lat_p999_us"],
                "lat_max_us": j["lat_max_us"], "ios": j["ops"], "errors": j["errors"],
            }
        return out


class ZfsPool:
    """A zfs-fuse RAIDZ2 pool over member files, alive from setup to cleanup. The daemon is started
    here (in its own session, so a Ctrl-C to the suite cannot stop it before the pool is destroyed)
    unless one already answers, which is then used and left running; the pool is created with
    cachefile=none, so nothing of it outlives the run even if the daemon dies first."""

    def __init__(self, logdir, name):
        self.name, self.pool, self.proc, self.log, self.mnt = name, None, None, None, None
        self.logpath = os.path.join(logdir, "zfs-fuse.log")
        self.zpool, self.zfs = zfs_tool("zpool"), zfs_tool("zfs")

    def daemon_up(self):
        try:
            return subprocess.run([self.zpool, "list"], capture_output=True, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self, members, mnt):
        self.daemon = "already running, used and left running"
        if not self.daemon_up():
            self.daemon = "started by the suite, stopped after it"
            self.log = open(self.logpath, "a")
            self.proc = subprocess.Popen([zfs_tool("zfs-fuse"), "--no-daemon", "--no-kstat-mount"],
                                         stdout=self.log, stderr=self.log, start_new_session=True)
            end = time.time() + 30
            while not self.daemon_up():
                if self.proc.poll() is not None or time.time() > end:
                    self.log.flush()
                    with open(self.logpath) as f:
                        tail = f.read()[-2000:]
                    why = (f"exited with {self.proc.returncode}" if self.proc.poll() is not None
                           else "did not answer `zpool list` within 30 s")
                    raise RuntimeError(f"zfs-fuse daemon {why}\n{tail}")
                time.sleep(0.1)
        self.mnt = mnt
        run([self.zpool, "create", "-f", "-o", "cachefile=none", "-m", mnt, self.name, "raidz2"] + members)
        self.pool = self.name

    def get(self, prop):
        return run([self.zfs, "get", "-Hp", "-o", "value", prop, self.pool]).strip()

    def stop(self):
        """Destroys the pool and stops a daemon started here; never raises (it runs in `finally`)."""
        warn = lambda msg: print(f"pts: zfs teardown: {msg}", file=sys.stderr, flush=True)
        if self.pool:
            # FUSE sends a file's release after close() returns, so right after fio exits the pool
            # can still be "busy" for a moment: retry.
            end, err = time.time() + 30, ""
            while True:
                try:
                    p = subprocess.run([self.zpool, "destroy", "-f", self.pool], capture_output=True,
                                       text=True, timeout=120)
                    if p.returncode == 0:
                        break
                    err = p.stderr.strip()
                except subprocess.TimeoutExpired:
                    err = "timed out"
                if time.time() > end:
                    warn(f"zpool destroy {self.pool} failed: {err}")
                    break
                time.sleep(0.5)
            self.pool = None
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                warn("zfs-fuse did not exit on SIGTERM; killed")
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log:
            self.log.close()
            self.log = None
        # A FUSE mount its daemon left behind would stop the member files' removal.
        if self.mnt:
            with open("/proc/mounts") as f:
                mounted = any(line.split()[1] == self.mnt for line in f)
            if mounted:
                subprocess.run(["umount", "-l", self.mnt], capture_output=True)
            self.mnt = None


# ---------------------------------------------------------------------------------------------

class Suite:
    def __init__(self, a):
        self.cfg = dict(QUICK if a.quick else FULL)
        if a.runtime:
            self.cfg["runtime"] = a.runtime
        if a.rounds:
            self.cfg["min_rounds"] = self.cfg["max_rounds"] = a.rounds
            self.cfg["window"] = min(self.cfg["window"], a.rounds)
        if a.member_mib:
            self.cfg["member_mib"] = a.member_mib
        self.quick = a.quick
        self.runtime = self.cfg["runtime"]
        self.threads, self.qd, self.tp_qd = a.threads, a.qd, a.tp_qd
        self.uraid = os.path.abspath(a.uraid)
        self.dir = os.path.abspath(a.dir or (f"/dev/shm/uraid-pts-{os.getpid()}" if a.quick else "/dev/shm/uraid-pts"))
        self.tmp = tempfile.mkdtemp(prefix="uraid-pts-")
        self.members = a.members
        self.names = a.targets.split(",") if a.targets else list(TARGETS)
        for n in self.names:
            if n not in TARGETS:
                sys.exit(f"unknown target {n!r}; known: {', '.join(TARGETS)}")
        self.log = lambda msg: print(msg, file=sys.stderr, flush=True)
        # zfs-raidz2 runs when zfs-fuse is installed and works: asked for by name, it must; in the
        # default set it is dropped otherwise, and the report says why (zfs_info).
        TARGETS["zfs-raidz2"] = zfs_label(self.members)
        self.zfs, self.zfs_info = None, None
        self.zfs_explicit = bool(a.targets) and "zfs-raidz2" in self.names
        if "zfs-raidz2" in self.names:
            why = zfs_missing()
            if why and self.zfs_explicit:
                sys.exit(f"pts: zfs-raidz2: {why}")
            if why:
                self.log(f"pts: skipping zfs-raidz2: {why}")
                self.names.remove("zfs-raidz2")
                self.zfs_info = {"status": "skipped", "why": why}

    # -- devices -----------------------------------------------------------------------------
    def setup(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        mib, n = self.cfg["member_mib"], self.members
        self.tmpfs = is_tmpfs(self.dir)
        t0 = time.time()
        self.log(f"pts: devices in {self.dir} ({'tmpfs' if self.tmpfs else 'not tmpfs'}): "
                 f"{n} members of {mib} MiB, RAID6 {n - 2}+2")
        arr = [os.path.join(self.dir, f"m{i}") for i in range(n)]
        run([self.uraid, "create", "--level", "6", "-N", "pts", "--size", f"{mib}M"] + arr)
        targets = {}
        sock = lambda name: os.path.join(self.tmp, name + ".sock")
        uraid_srv = {
            "unix": nbd_server([self.uraid, "serve", "--export", "v", "--listen", f"unix:{sock('uraid')}"] + arr,
                           self.tmp, sock=sock("uraid")),
        }
        port = free_port()
        uraid_srv["tcp"] = nbd_server([self.uraid, "serve", "--export", "v", "--listen", f"tcp:127.0.0.1:{port}"] + arr,
                                  self.tmp, port=port)
        uri = {"unix": f"nbd+unix:///v?socket={sock('uraid')}", "tcp": f"nbd://127.0.0.1:{port}/v"}
        uraid_srv["unix"].start()
        try:
            self.volume = int(run(["nbdinfo", "--size", uri["unix"]]).strip())
        finally:
            uraid_srv["unix"].stop()
        self.log(f"pts: volume {self.volume // MIB} MiB")
        for t in ("unix", "tcp"):
            targets[f"uraid-nbd-{t}"] = NbdTarget(f"uraid-nbd-{t}", self, uraid_srv[t], uri[t], self.volume)
        self.log("pts: preconditioning uraid (2 x volume, 128 KiB sequential writes over NBD)")
        targets["uraid-nbd-unix"].precondition()
        targets["uraid"] = BenchTarget("uraid", self, arr)
        # Degraded arrays: copies of the preconditioned members without the last one or two.
        for missing in (1, 2):
            name = f"uraid-deg{missing}"
            if name in self.names:
                d = os.path.join(self.dir, name)
                os.makedirs(d)
                copy = [os.path.join(d, os.path.basename(p)) for p in arr[: n - missing]]
                for src, dst in zip(arr, copy):
                    shutil.copyfile(src, dst)
                targets[name] = BenchTarget(name, self, copy)
        if "raw" in self.names:
            raw = [os.path.join(self.dir, f"raw{i}") for i in range(n)]
            for p in raw:
                with open(p, "wb") as f:
                    f.truncate(mib * MIB)
            per_file = (mib - 1) * MIB
            engine = {"ioengine": "psync"} if self.tmpfs else {"ioengine": "io_uring"}
            self.raw_engine = engine["ioengine"]
            targets["raw"] = FioTarget("raw", self, dict(engine, direct=1, filename=":".join(raw), offset="1m",
                                                         size=per_file * n),
                                       {"total": per_file * n, "per_file": per_file},
                                       qd_engine=not self.tmpfs)
            self.log(f"pts: preconditioning raw members (fio {self.raw_engine})")
            targets["raw"].precondition()
        if any(n.startswith(("nbdkit", "qemu")) for n in self.names):
            peer = os.path.join(self.dir, "peer.img")
            with open(peer, "wb") as f:
                f.truncate(self.volume)
            for t in ("unix", "tcp"):
                if t == "unix":
                    nk = nbd_server(["nbdkit", "-f", "-U", sock("nbdkit"), "file", peer], self.tmp, sock=sock("nbdkit"))
                    qn = nbd_server(["qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "-t", "-e", "16",
                                 "-k", sock("qemu"), peer], self.tmp, sock=sock("qemu"))
                    nu, qu = f"nbd+unix:///?socket={sock('nbdkit')}", f"nbd+unix:///?socket={sock('qemu')}"
                else:
                    port, p2 = free_port(), free_port()
                    nk = nbd_server(["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(port), "file", peer], self.tmp, port=port)
                    qn = nbd_server(["qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "-t", "-e", "16",
                                 "-b", "127.0.0.1", "-p", str(p2), peer], self.tmp, port=p2)
                    nu, qu = f"nbd://127.0.0.1:{port}/", f"nbd://127.0.0.1:{p2}/"
                targets[f"nbdkit-{t}"] = NbdTarget(f"nbdkit-{t}", self, nk, nu, self.volume)
                targets[f"qemu-nbd-{t}"] = NbdTarget(f"qemu-nbd-{t}", self, qn, qu, self.volume)
            self.log("pts: preconditioning the peers' file (through nbdkit)")
            targets["nbdkit-unix"].precondition()
        if "zfs-raidz2" in self.names:
            try:
                self.setup_zfs(targets)
            except Exception as e:
                if self.zfs_explicit:
                    raise
                why = " ".join(str(e).split())  # one line: it goes into the report
                why = why.replace(" ".join(getattr(self, "zfs_members", [])), f"<{self.members} member files>")
                why = why[:600].rstrip(".")
                self.log(f"pts: skipping zfs-raidz2, zfs-fuse did not work: {why}")
                if self.zfs:
                    self.zfs.stop()
                self.names.remove("zfs-raidz2")
                self.zfs_info = {"status": "skipped", "why": f"zfs-fuse did not work here: {why}"}
        self.targets = {n: targets[n] for n in self.names}
        self.log(f"pts: devices ready in {time.time() - t0:.0f}s")

    def setup_zfs(self, targets):
        """RAIDZ2 over member files beside uraid's (same size, or ZFS's 64 MiB minimum), one file of
        the volume's size on it (less if the pool cannot spare that), preconditioned like the rest."""
        n = self.members
        mib = max(self.cfg["member_mib"], ZFS_MIN_MIB)
        d, mnt = os.path.join(self.dir, "zfs"), os.path.join(self.dir, "zfs-mnt")
        os.makedirs(d)
        members = self.zfs_members = [os.path.join(d, f"z{i}") for i in range(n)]
        for p in members:
            with open(p, "wb") as f:
                f.truncate(mib * MIB)
        self.log(f"pts: zfs-fuse RAIDZ2 {n - 2}+2 over {n} files of {mib} MiB")
        self.zfs = ZfsPool(self.tmp, f"uraidpts{os.getpid()}")
        self.zfs.start(members, mnt)
        avail = int(self.zfs.get("available"))
        size = min(self.volume, int(avail * ZFS_FILL) // MIB * MIB)
        path = os.path.join(mnt, "volume.img")
        with open(path, "wb") as f:
            f.truncate(size)
        arc = "?"
        try:
            with open("/etc/zfs/zfsrc") as f:
                for line in f:
                    k, _, v = line.partition("=")
                    if k.strip() == "max-arc-size":
                        arc = v.strip()
        except OSError:
            pass
        version = "?"
        try:
            version = run(["dpkg-query", "-W", "-f=${Version}", "zfs-fuse"]).strip()
        except Exception:
            pass
        self.zfs_info = {"status": "ran", "version": version, "member_mib": mib, "file_bytes": size,
                         "avail_bytes": avail, "fill": ZFS_FILL, "arc_mib": arc, "daemon": self.zfs.daemon,
                         **{p: self.zfs.get(p) for p in ("recordsize", "compression", "checksum")}}
        # The raw target's fio jobs: same engine and depth handling, O_DIRECT (FUSE passes it to
        # the daemon: the kernel's page cache is bypassed, ZFS's own ARC is not).
        engine = {"ioengine": "psync"} if self.tmpfs else {"ioengine": "io_uring"}
        targets["zfs-raidz2"] = FioTarget("zfs-raidz2", self, dict(engine, direct=1, filename=path, size=size),
                                          {"total": size, "per_file": size}, qd_engine=not self.tmpfs)
        self.log(f"pts: preconditioning the zfs-fuse file ({size // MIB} MiB, fio {engine['ioengine']})")
        targets["zfs-raidz2"].precondition()

    def cleanup(self):
        if self.zfs:
            self.zfs.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- rounds ------------------------------------------------------------------------------
    def steady(self, test, rounds):
        """SNIA steady state over the last `window` rounds of the tracking cell: range within 20%
        of the window's average and the least-squares slope's excursion within 10% of it."""
        w = self.cfg["window"]
        if len(rounds) < max(w, self.cfg["min_rounds"]):
            return False
        bs, m, field = TRACK[test]
        ys = [r[key((bs, m))][field] for r in rounds[-w:]]
        avg = statistics.mean(ys)
        if avg <= 0:
            return False
        if w == 1:
            return True
        xs = list(range(w))
        mx = statistics.mean(xs)
        slope = sum((x - mx) * (y - avg) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return (max(ys) - min(ys)) <= 0.2 * avg and abs(slope) * (w - 1) <= 0.1 * avg

    def measure(self):
        cfg = self.cfg
        self.rounds = {t: {n: [] for n in self.names} for t in TESTS}
        self.steady_at = {t: {} for t in TESTS}
        units = len(TESTS) * cfg["max_rounds"] * len(self.names)  # upper bound, shrinks
        done, t0 = 0, time.time()
        for test in TESTS:
            cs = cells(cfg, test)
            active = list(self.names)
            for r in range(1, cfg["max_rounds"] + 1):
                for n in active:
                    el = time.time() - t0
                    eta = f", <= {el / done * (units - done) / 60:.1f} min left" if done else ""
                    self.log(f"[{done + 1:3}/{units} {el / 60:4.1f} min{eta}] "
                             f"{TEST_TITLE[test]} round {r}: {n} ({len(cs)} cells)")
                    self.rounds[test][n].append(self.targets[n].run(test, cs))
                    done += 1
                still = []
                for n in active:
                    if self.steady(test, self.rounds[test][n]):
                        self.steady_at[test][n] = r
                        units -= cfg["max_rounds"] - r
                    else:
                        still.append(n)
                active = still
                if not active:
                    break
        self.elapsed = time.time() - t0

    def medians(self):
        w = self.cfg["window"]
        med = {t: {} for t in TESTS}
        for test in TESTS:
            for n, rounds in self.rounds[test].items():
                win = rounds[-w:]
                med[test][n] = {
                    k: {f: statistics.median(r[k][f] for r in win) for f in win[0][k]}
                    for k in win[0]
                }
        self.med = med
        return med

    def missing(self):
        bad = []
        for test in TESTS:
            for n in self.names:
                for c in cells(self.cfg, test):
                    r = self.med[test][n].get(key(c))
                    fields = ("iops", "mbps", "lat_avg_us", "lat_max_us")
                    if r is None or any(not (isinstance(r[f], (int, float)) and math.isfinite(r[f]) and r[f] > 0)
                                        for f in fields) or r.get("errors"):
                        bad.append(f"{test} {n} {key(c)}: {r}")
        return bad


# ---------------------------------------------------------------------------------------------
# machine description

def machine(s):
    def first(cmd):
        try:
            return run(cmd).strip().splitlines()[0]
        except Exception:
            return "?"
    cpu = cpu_model()
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // (1024 * 1024)
    commit = "?"
    try:
        commit = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).strip()
        if run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]).strip():
            commit += " (with uncommitted changes)"
    except Exception:
        pass
    return {
        "cpus": os.cpu_count(), "cpu": cpu, "mem_gib": mem, "kernel": platform.release(),
        "fio": first(["fio", "--version"]), "nbdkit": first(["nbdkit", "--version"]),
        "qemu-nbd": first(["qemu-nbd", "--version"]), "uraid": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "members_fs": "tmpfs" if s.tmpfs else "other",
        "md": md_note(),
    }


# ---------------------------------------------------------------------------------------------
# plots (matplotlib, no display)

def plots(s, assets):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg, med, names = s.cfg, s.med, s.names

    def save(fig, legend_from, bottom, name):
        h, l = legend_from.get_legend_handles_labels()
        fig.legend(h, l, loc="lower center", ncol=min(5, len(names)), fontsize=8)
        fig.tight_layout(rect=(0, bottom, 1, 1))
        path = os.path.join(assets, name)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return path

    def bars(ax, test, groups, field, title, ylabel, log=False):
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            ys = [med[test][n][key(g)][field] for g in groups]
            ax.bar([x + i * width for x in range(len(groups))], ys, width, label=n)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))])
        ax.set_xticklabels([f"{g[0]} {mix_label(g[1]) if test == 'lat' else g[1]}" for g in groups],
                           rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)

    files = {}
    # IOPS by mix, one panel per block size.
    bss = cfg["iops_bs"]
    cols = min(4, len(bss))
    rows = math.ceil(len(bss) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False)
    for i, bs in enumerate(bss):
        ax = axes[i // cols][i % cols]
        for n in names:
            ys = [med["iops"][n][key((bs, m))]["iops"] for m in cfg["iops_mix"]]
            ax.plot(cfg["iops_mix"], ys, marker="o", markersize=3, label=n)
        ax.set_title(f"{bs} random, {s.threads} threads x QD{s.qd}")
        ax.set_xlabel("read % (rest writes)")
        ax.set_ylabel("IOPS")
        ax.set_xticks(cfg["iops_mix"])
        ax.grid(alpha=0.3)
    for j in range(len(bss), rows * cols):
        axes[j // cols][j % cols].axis("off")
    files["iops"] = save(fig, axes[0][0], 0.08, "iops.png")

    lat_cells = cells(cfg, "lat")
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    bars(axes[0], "lat", lat_cells, "lat_avg_us", "QD1 latency, average", "µs", log=True)
    bars(axes[1], "lat", lat_cells, "lat_p999_us", "QD1 latency, p99.9", "µs", log=True)
    files["lat"] = save(fig, axes[0], 0.12, "latency.png")

    fig, ax = plt.subplots(figsize=(10, 4.5))
    bars(ax, "tp", cells(cfg, "tp"), "mbps", f"sequential throughput, {s.threads} threads x QD{s.tp_qd}", "MB/s")
    files["tp"] = save(fig, ax, 0.12, "throughput.png")
    return files


# ---------------------------------------------------------------------------------------------
# report

def fmt(v):
    return f"{v:,.0f}"


def fmt_us(v):
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def ratio(a, b):
    return a / b if b else float("nan")


def measured(s, t, test, c, f):
    """One median, or None when this run did not measure it: quick runs have fewer cells (no 128k
    throughput, for one) and targets may be dropped, so a check whose cells are missing is left
    out of its table instead of failing the report."""
    if t not in s.names:
        return None
    return s.med.get(test, {}).get(t, {}).get(key(c), {}).get(f)


def target_checks(s):
    """The engine's and the NBD server's targets (issues 2 and 3) that this suite's cells measure."""
    n = s.members
    g = lambda t, test, c, f: measured(s, t, test, c, f)
    out = []
    raw_r, raw_w = g("raw", "iops", ("4k", 100), "iops"), g("raw", "iops", ("4k", 0), "iops")
    u_r, u_w = g("uraid", "iops", ("4k", 100), "iops"), g("uraid", "iops", ("4k", 0), "iops")
    if raw_r and u_r:
        out.append(("engine: RAID6 4k random read >= 0.85 x raw", 0.85, u_r / raw_r,
                    f"{fmt(u_r)} vs {fmt(raw_r)} IOPS"))
    if raw_r and raw_w and u_w:
        bound = 1 / (3 / raw_r + 3 / raw_w)
        out.append(("engine: RAID6 4k random write >= 0.8 x read-modify-write bound 1/(3/R+3/W)", 0.8,
                    u_w / bound, f"{fmt(u_w)} vs bound {fmt(bound)} IOPS"))
    raw_sw, u_sw = g("raw", "tp", ("1m", "write"), "mbps"), g("uraid", "tp", ("1m", "write"), "mbps")
    if raw_sw and u_sw:
        share = (n - 2) / n
        out.append((f"engine: RAID6 1M sequential write >= 0.70 x {n - 2}/{n} x raw", 0.70,
                    u_sw / (share * raw_sw), f"{fmt(u_sw)} vs {fmt(share * raw_sw)} MB/s"))
    for t in ("unix", "tcp"):
        u, k = f"uraid-nbd-{t}", f"nbdkit-{t}"
        ur, kr = g(u, "iops", ("4k", 100), "iops"), g(k, "iops", ("4k", 100), "iops")
        if ur and kr:
            out.append((f"NBD ({t}): RAID6 4k random read >= 0.9 x nbdkit", 0.9, ur / kr,
                        f"{fmt(ur)} vs {fmt(kr)} IOPS"))
        us_, ks = g(u, "tp", ("1m", "read"), "mbps"), g(k, "tp", ("1m", "read"), "mbps")
        if us_ and ks:
            out.append((f"NBD ({t}): 1M sequential read >= nbdkit", 1.0, us_ / ks,
                        f"{fmt(us_)} vs {fmt(ks)} MB/s"))
    return out


def round2_checks(s):
    """Performance round 2 (issue 13): the targets this suite's cells measure. Tuples as in
    `target_checks`, plus whether higher is better (False for latency and CPU ratios). QD1
    writes on RAID0/RAID1 are `scripts/bench_nbd.py --set qd1` (RAID6 here)."""
    n = s.members
    g = lambda t, test, c, f: measured(s, t, test, c, f)
    out = []
    for t in ("unix", "tcp"):
        u, k = f"uraid-nbd-{t}", f"nbdkit-{t}"
        for f, what in (("lat_avg_us", "mean"), ("lat_p99_us", "p99")):
            ul, kl = g(u, "lat", ("4k", 100), f), g(k, "lat", ("4k", 100), f)
            if ul and kl:
                out.append((f"NBD ({t}): QD1 4k read {what} <= 1.0 x nbdkit", 1.0, ul / kl,
                            f"{ul:.1f} vs {kl:.1f} µs", False))
        uc, kc = g(u, "iops", CPU_CELL, "cpu_us"), g(k, "iops", CPU_CELL, "cpu_us")
        if uc and kc:
            out.append((f"NBD ({t}): server CPU per 4k read at QD{s.threads * s.qd} <= 0.5 x nbdkit", 0.5,
                        uc / kc, f"{uc:.2f} vs {kc:.2f} µs", False))
        ul, kl = g(u, "lat", ("4k", 0), "lat_avg_us"), g(k, "lat", ("4k", 0), "lat_avg_us")
        if ul and kl:
            out.append((f"NBD ({t}): QD1 4k write mean, RAID6 <= 1.3 x nbdkit", 1.3, ul / kl,
                        f"{ul:.1f} vs {kl:.1f} µs", False))
        for bs in ("1m", "128k"):
            uw, kw = g(u, "tp", (bs, "write"), "mbps"), g(k, "tp", (bs, "write"), "mbps")
            if uw and kw:
                out.append((f"NBD ({t}): {bs.upper() if bs == '1m' else bs} sequential write >= nbdkit",
                            1.0, uw / kw, f"{fmt(uw)} vs {fmt(kw)} MB/s", True))
    raw_sw, u_sw = g("raw", "tp", ("1m", "write"), "mbps"), g("uraid", "tp", ("1m", "write"), "mbps")
    if raw_sw and u_sw:
        share = (n - 2) / n
        out.append((f"engine: RAID6 1M sequential write >= 0.9 x {n - 2}/{n} x raw", 0.9,
                    u_sw / (share * raw_sw), f"{fmt(u_sw)} vs {fmt(share * raw_sw)} MB/s", True))
    raw_r, d2 = g("raw", "iops", ("4k", 100), "iops"), g("uraid-deg2", "iops", ("4k", 100), "iops")
    if raw_r and d2:
        # Member reads per 4k read with two of n members missing: 1, or k = n - 2 survivors when
        # the chunk's member is one of the two (2 in n).
        per = 1 + 2 / n * (n - 3)
        bound = raw_r / per
        out.append((f"engine: RAID6 4k random read, 2 members missing >= 0.9 x bound (raw / {per:.1f} reads)",
                    0.9, d2 / bound, f"{fmt(d2)} vs {fmt(bound)} IOPS", True))
    h, d1 = g("uraid", "tp", ("1m", "read"), "mbps"), g("uraid-deg1", "tp", ("1m", "read"), "mbps")
    if h and d1:
        out.append(("engine: RAID6 1M sequential read, 1 member missing >= 0.9 x healthy", 0.9, d1 / h,
                    f"{fmt(d1)} vs {fmt(h)} MB/s", True))
    u_r = g("uraid", "iops", ("4k", 100), "iops")
    if raw_r and u_r:
        out.append(("engine: RAID6 4k random read >= 0.95 x raw", 0.95, u_r / raw_r,
                    f"{fmt(u_r)} vs {fmt(raw_r)} IOPS", True))
    t = "tcp"
    us_, ks = g(f"uraid-nbd-{t}", "tp", ("1m", "read"), "mbps"), g(f"nbdkit-{t}", "tp", ("1m", "read"), "mbps")
    if us_ and ks:
        out.append(("NBD (tcp): 1M sequential read >= 1.0 x nbdkit", 1.0, us_ / ks,
                    f"{fmt(us_)} vs {fmt(ks)} MB/s", True))
    return out


def analysis(s, checks):
    med, names = s.med, s.names
    lines = []
    g = lambda t, test, c, f: med[test][t][key(c)][f]
    has = lambda *ts: all(t in names for t in ts)
    if has("raw", "uraid"):
        rr = [ratio(g("uraid", "iops", c, "iops"), g("raw", "iops", c, "iops")) for c in cells(s.cfg, "iops")]
        reads = [ratio(g("uraid", "iops", (bs, 100), "iops"), g("raw", "iops", (bs, 100), "iops"))
                 for bs in s.cfg["iops_bs"]]
        writes = [ratio(g("uraid", "iops", (bs, 0), "iops"), g("raw", "iops", (bs, 0), "iops"))
                  for bs in s.cfg["iops_bs"]]
        lines.append(
            f"**Engine against the raw members.** In-process, RAID6 reaches {min(reads):.2f}–{max(reads):.2f}× "
            f"of the raw files' IOPS on pure random reads (by block size) and {min(writes):.2f}–{max(writes):.2f}× "
            f"on pure random writes; over the whole matrix {min(rr):.2f}–{max(rr):.2f}×. Writes smaller than a "
            f"stripe are read-modify-write (3 reads + 3 writes per RAID6 update), so their ceiling is a fraction "
            f"of raw by construction; the target below compares them with that bound.")
        lr = ratio(g("uraid", "lat", ("4k", 100), "lat_avg_us"), g("raw", "lat", ("4k", 100), "lat_avg_us"))
        lines.append(
            f"**QD1 latency.** A 4k read takes {fmt_us(g('uraid', 'lat', ('4k', 100), 'lat_avg_us'))} µs on average "
            f"in-process against {fmt_us(g('raw', 'lat', ('4k', 100), 'lat_avg_us'))} µs raw ({lr:.1f}×).")
    for t in ("unix", "tcp"):
        u, k, q = f"uraid-nbd-{t}", f"nbdkit-{t}", f"qemu-nbd-{t}"
        if has(u, k, q):
            r4 = ratio(g(u, "iops", ("4k", 100), "iops"), g(k, "iops", ("4k", 100), "iops"))
            w4 = ratio(g(u, "iops", ("4k", 0), "iops"), g(k, "iops", ("4k", 0), "iops"))
            q4 = ratio(g(u, "iops", ("4k", 100), "iops"), g(q, "iops", ("4k", 100), "iops"))
            allr = [ratio(g(u, "iops", c, "iops"), g(k, "iops", c, "iops")) for c in cells(s.cfg, "iops")]
            l4 = (g(u, "lat", ("4k", 100), "lat_avg_us"), g(k, "lat", ("4k", 100), "lat_avg_us"),
                  g(q, "lat", ("4k", 100), "lat_avg_us"))
            lines.append(
                f"**Over NBD ({'Unix socket' if t == 'unix' else 'TCP loopback'}).** uraid serving RAID6 against "
                f"nbdkit serving a plain file: 4k random read {r4:.2f}×, 4k random write {w4:.2f}× (RAID6 "
                f"read-modify-write against a file write), {min(allr):.2f}–{max(allr):.2f}× over the matrix; "
                f"against qemu-nbd 4k random read {q4:.2f}×. QD1 4k read: uraid {fmt_us(l4[0])} µs, "
                f"nbdkit {fmt_us(l4[1])} µs, qemu-nbd {fmt_us(l4[2])} µs.")
    z = "zfs-raidz2"
    if has(z) and any(has(u) for u in ("uraid", "uraid-nbd-unix")):
        u = "uraid" if has("uraid") else "uraid-nbd-unix"
        r4 = ratio(g(u, "iops", ("4k", 100), "iops"), g(z, "iops", ("4k", 100), "iops"))
        w4 = ratio(g(u, "iops", ("4k", 0), "iops"), g(z, "iops", ("4k", 0), "iops"))
        sw = ratio(g(u, "tp", ("1m", "write"), "mbps"), g(z, "tp", ("1m", "write"), "mbps"))
        lines.append(
            f"**Against ZFS RAIDZ2 (zfs-fuse).** `{u}` against a file on the RAIDZ2 pool: 4k random read "
            f"{r4:.2f}×, 4k random write {w4:.2f}×, 1M sequential write {sw:.2f}× (ZFS's numbers include a "
            f"FUSE round trip through the kernel per request, and its records are 128K copy-on-write, so "
            f"small random writes rewrite whole records).")
    if has("uraid", "uraid-deg1", "uraid-deg2"):
        h = g("uraid", "iops", ("4k", 100), "iops")
        d1, d2 = g("uraid-deg1", "iops", ("4k", 100), "iops"), g("uraid-deg2", "iops", ("4k", 100), "iops")
        lines.append(
            f"**Degraded.** With one member missing, 4k random reads run at {d1 / h:.2f}× of the healthy array, "
            f"with two missing at {d2 / h:.2f}× (reads of a missing member's chunk are rebuilt from the "
            f"stripe: {s.members - 2} reads and a decode instead of one read).")
    if checks:
        worst = min(checks, key=lambda c: c[2] / c[1])
        missed = [c for c in checks if c[2] < c[1]]
        lines.append(
            f"**Furthest from its target:** {worst[0]}: {worst[2]:.2f} measured against {worst[1]:.2f} "
            f"needed ({worst[3]}). {len(missed)} of {len(checks)} targets missed in this run.")
    return lines


def zfs_sentence(s):
    """What the report says about ZFS RAIDZ2: how the target was built, or why it was not run."""
    zi = getattr(s, "zfs_info", None)
    if not zi:
        return ""
    if zi["status"] != "ran":
        return f" There is no ZFS RAIDZ2 target in this run: {zi['why']}."
    n, mib, size = s.members, zi["member_mib"], zi["file_bytes"]
    size_why = ""
    if size < s.volume:
        size_why = (f", less than the volume's {s.volume // MIB} MiB: the pool has {zi['avail_bytes'] // MIB} MiB "
                    f"free and a copy-on-write pool needs room, so the file takes at most "
                    f"{zi['fill'] * 100:.0f}% of it")
    member_why = (f" (ZFS's minimum vdev size; this run's members are {s.cfg['member_mib']} MiB)"
                  if mib != s.cfg["member_mib"] else "")
    return (f" `zfs-raidz2` is Debian's zfs-fuse {zi['version']} (ZFS pool version 23 in a user-space daemon "
            f"behind FUSE; this kernel has no ZFS): a RAIDZ2 pool over {n} files of {mib} MiB{member_why} beside "
            f"the others (ashift 12, recordsize {int(zi['recordsize']) // KIB}K, compression {zi['compression']}, "
            f"checksum {zi['checksum']}, ARC capped at {zi['arc_mib']} MiB by /etc/zfs/zfsrc; daemon "
            f"{zi['daemon']}), holding one file of {size // MIB} MiB{size_why}. fio drives that file with the "
            f"raw target's jobs (O_DIRECT works through FUSE: it bypasses the kernel's page cache, not ZFS's ARC).")


def report(s, files, path, json_rel):
    cfg, med, names, m = s.cfg, s.med, s.names, s.machine
    rel = lambda f: os.path.relpath(f, os.path.dirname(os.path.abspath(path)))
    has_raw = "raw" in names
    checks = target_checks(s)
    L = []
    w = L.append
    w("# uraid benchmarks\n")
    took = f"this run took {s.total_elapsed / 60:.0f} min" if s.total_elapsed else "about 45 min on this machine"
    w(f"This page, its plots and the raw numbers are produced by one command on a fresh machine ({took}):\n")
    w("```sh\n./scripts/setup.sh && python3 scripts/pts.py\n```\n")
    w(f"Machine-readable results: [{os.path.basename(json_rel)}]({json_rel}). "
      "Deeper one-off investigations (CPU per request, profiles, RAID0/RAID5, performance round 2) are in "
      "[perf-notes.md](investigations/perf-notes.md) and [round2-performance.md](investigations/round2-performance.md).\n")
    if s.quick:
        w("**Quick mode** (smoke run: reduced matrix, one short round; numbers are not comparable).\n")
    w("## Machine\n")
    w("| | |\n|---|---|")
    w(f"| CPU | {m['cpus']} × {m['cpu']} |")
    w(f"| memory | {m['mem_gib']} GiB |")
    w(f"| kernel | Linux {m['kernel']} |")
    zi = getattr(s, "zfs_info", None) or {}
    zfs_tool_text = f", zfs-fuse {zi['version']} (Debian)" if zi.get("status") == "ran" else ""
    w(f"| tools | {m['fio']}, {m['nbdkit']}, {m['qemu-nbd']}{zfs_tool_text} |")
    w(f"| uraid | commit {m['uraid']}, release build |")
    w(f"| run | finished {m['date']}" + (f", {s.total_elapsed / 60:.0f} min |" if s.total_elapsed else " |"))
    w(f"| devices | {s.members} member files of {cfg['member_mib']} MiB on {m['members_fs']} "
      f"(`/dev/shm`), opened O_DIRECT; RAID6 {s.members - 2}+2, chunk 64 KiB, volume {s.volume // MIB} MiB |\n")
    w("A shared virtual machine: identical runs differ by 10–20% over a session, so only ratios from "
      "one run mean much; every target below was measured in the same run, rounds interleaved "
      "(round 1 of every target, then round 2, ...).\n")
    w("## Method\n")
    w("After SNIA SSS PTS-E 1.1, scaled to this machine:\n")
    w(f"- **Targets.** {', '.join(f'`{n}` ({TARGETS[n]})' for n in names)}. "
      f"The raw target is fio on {s.members} member-sized files of its own "
      f"(ioengine={getattr(s, 'raw_engine', '?')}, O_DIRECT, the first MiB skipped like uraid's "
      "superblock area" + ("; on tmpfs a psync read is a memcpy in the caller while io_uring hands it "
                           "to worker threads at half the rate, so psync with one job per thread is "
                           "the hardware's best" if getattr(s, "raw_engine", None) == "psync" else "")
      + "). "
      "`uraid` is `uraid bench --json` on the array (no network). The NBD targets are fio "
      "`ioengine=nbd` against `uraid serve`, `nbdkit -f file` and `qemu-nbd -f raw --cache=none "
      "--aio=native -t -e 16`, each serving a file of the volume's size (nbdkit and qemu-nbd share one file). "
      "The degraded targets are copies of the preconditioned array with the last one or two member "
      "files left out." + zfs_sentence(s) + (" " + m["md"] if m.get("md") else ""))
    w(f"- **Load.** IOPS test: random, {s.threads} threads × QD{s.qd} (fio numjobs={s.threads}, "
      f"iodepth={s.qd}; one NBD connection per thread; `uraid bench --threads {s.threads} --qd "
      f"{s.threads * s.qd}`). Latency test: one thread, QD1. Throughput test: sequential, "
      f"{s.threads} threads × QD{s.tp_qd}, each thread streaming its own half of the device. "
      f"Block sizes {' '.join(cfg['iops_bs'])}; mixes {' '.join(mix_label(x) for x in cfg['iops_mix'])}.")
    w("- **Preconditioning.** Every device is written end to end twice with 128 KiB sequential "
      "writes (uraid through its NBD server, which also allocates every granule; the peers' file "
      "through nbdkit; the raw files" + (" and the file on the ZFS pool" if "zfs-raidz2" in names else "")
      + " directly), then the rounds themselves are the workload-dependent pass.")
    w(f"- **Rounds and steady state.** Each cell runs {cfg['runtime']:g} s per round. Rounds repeat "
      f"(at least {cfg['min_rounds']}, at most {cfg['max_rounds']}) until the test's tracking cell "
      f"(IOPS: 4k R0/W100 IOPS; latency: 4k R0/W100 average; throughput: 1M write MB/s) is in steady "
      f"state over the last {cfg['window']} rounds: range ≤ 20% and least-squares slope excursion "
      f"≤ 10% of the window's average (SNIA uses 5-round windows of 1-minute rounds). The median of "
      "the window is reported; the steady-state table at the end says where it was reached.")
    w("- **Numbers.** IOPS and MB/s count reads and writes together; latency is submission to "
      "completion over both, from fio's `lat` (percentiles enabled) or `uraid bench`'s histogram. "
      "`(×raw)` is the cell divided by the raw target's same cell.\n")

    w("## Summary\n")
    for line in analysis(s, checks):
        w(line + "\n")
    if checks:
        w("Targets from the engine (issue 2) and NBD server (issue 3) issues that this suite measures "
          "(the NBD issue's RAID0 and CPU-per-request targets need `scripts/bench_nbd.py`; see "
          "investigations/perf-notes.md)." + (" The raw baseline here is fio psync, which on tmpfs runs about twice as "
          "fast as the fio io_uring baseline the engine targets were first measured against, so these "
          "ratios are stricter than the issue's." if getattr(s, "raw_engine", None) == "psync" else "") + "\n")
        w("| target | needed | measured | | met |\n|---|---:|---:|---|---|")
        for name, need, got, detail in checks:
            w(f"| {name} | {need:.2f} | {got:.2f} | {detail} | {'yes' if got >= need else 'no'} |")
        w("")
    r2 = round2_checks(s)
    if r2:
        w("Targets of performance round 2 (issue 13) that this suite measures (ratios; for latency "
          "lower is better). Server CPU per request is utime+stime from /proc/PID/stat around the 4k "
          "random read cell of the IOPS test (run on its own), over the requests fio completed. The "
          "QD1 write targets on RAID0/RAID1 are measured by `scripts/bench_nbd.py --set qd1`; its "
          "latest run is in [round2-performance.md](investigations/round2-performance.md) (\"Where each target stands\").\n")
        w("| target | needed | measured | | met |\n|---|---:|---:|---|---|")
        for name, need, got, detail, higher in r2:
            met = got >= need if higher else got <= need
            w(f"| {name} | {'≥' if higher else '≤'} {need:.2f} | {got:.2f} | {detail} | {'yes' if met else 'no'} |")
        w("")

    w("## IOPS\n")
    w(f"![IOPS by read/write mix, one panel per block size]({rel(files['iops'])})\n")
    def vs_raw(test, n, c, field, text, digits=2, suffix=""):
        """`text`, followed by the cell's ratio to the raw target's same cell when there is one."""
        if not has_raw or n == "raw":
            return text
        return f"{text} ({ratio(med[test][n][key(c)][field], med[test]['raw'][key(c)][field]):.{digits}f}{suffix})"

    def matrix(test, bss, mixes, cell):
        """A seeds-style table: block sizes down, read/write mixes across."""
        w("| block size | " + " | ".join(mix_label(x) for x in mixes) + " |")
        w("|---|" + "---:|" * len(mixes))
        for bs in bss:
            w(f"| {bs} | " + " | ".join(cell((bs, x)) for x in mixes) + " |")
        w("")

    lat_fields = ("lat_avg_us", "lat_p99_us", "lat_p999_us", "lat_max_us")
    for n in names:
        w(f"### {TARGETS[n]} (`{n}`)\n")
        w(f"IOPS{'' if n == 'raw' or not has_raw else ' (×raw)'}, read/write mix %:\n")
        matrix("iops", cfg["iops_bs"], cfg["iops_mix"],
               lambda c: vs_raw("iops", n, c, "iops", fmt(med["iops"][n][key(c)]["iops"])))

    w("## Latency at QD1\n")
    w(f"![QD1 latency]({rel(files['lat'])})\n")
    w("Average / p99 / p99.9 / max in µs; `(×raw)` compares the averages.\n")
    for n in names:
        w(f"**{TARGETS[n]}** (`{n}`)\n")
        matrix("lat", cfg["lat_bs"], cfg["lat_mix"],
               lambda c: vs_raw("lat", n, c, "lat_avg_us",
                                " / ".join(fmt_us(med["lat"][n][key(c)][f]) for f in lat_fields),
                                digits=1, suffix="×"))

    w("## Throughput\n")
    w(f"![sequential throughput]({rel(files['tp'])})\n")
    tcs = cells(cfg, "tp")
    w("MB/s (×raw):\n")
    w("| target | " + " | ".join(f"{bs} seq {d}" for bs, d in tcs) + " |")
    w("|---|" + "---:|" * len(tcs))
    for n in names:
        row = [vs_raw("tp", n, c, "mbps", fmt(med["tp"][n][key(c)]["mbps"])) for c in tcs]
        w(f"| {TARGETS[n]} | " + " | ".join(row) + " |")
    w("")

    w("## Steady state\n")
    w("Rounds run per test and target, and the round at which the tracking cell was in steady state "
      "(— : not reached within the round limit; the last rounds are reported anyway):\n")
    w("| target | " + " | ".join(TEST_TITLE[t] for t in TESTS) + " |")
    w("|---|" + "---|" * len(TESTS))
    for n in names:
        row = []
        for t in TESTS:
            got = len(s.rounds[t][n])
            at = s.steady_at[t].get(n)
            row.append(f"{got} rounds, steady at {at}" if at else f"{got} rounds, —")
        w(f"| `{n}` | " + " | ".join(row) + " |")
    w("")
    # Reports of separate commands (bitmap cost, resync, ...), kept in docs/bench-sections/
    # and carried into every regeneration of this page; each says how it was produced.
    sections = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(path)), "bench-sections", "*.md")))
    for sec in sections:
        with open(sec) as f:
            w(f.read().rstrip() + "\n")
    with open(path, "w") as f:
        f.write("\n".join(L))


# ---------------------------------------------------------------------------------------------

def ensure_matplotlib():
    """Plots need matplotlib; Debian's python3-matplotlib (scripts/setup.sh) lives in the system
    interpreter, which a pyenv or venv python3 first on PATH does not see: re-run under it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            os.execv(system, [system, os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit("pts: matplotlib not found: run scripts/setup.sh (installs python3-matplotlib)")


def render(a):
    """Rebuilds report and plots from a saved run (after editing the report's wording, say);
    every number comes from the JSON, nothing is measured."""
    with open(a.render) as f:
        d = json.load(f)
    c = d["config"]
    TARGETS["zfs-raidz2"] = zfs_label(c["members"])
    if "md" not in d["machine"] and d["machine"].get("kernel") == platform.release():
        d["machine"]["md"] = md_note()  # results from before the note existed, rendered on their kernel
    s = argparse.Namespace(
        cfg={k: c[k] for k in FULL}, med=d["median"], rounds=d["rounds"], steady_at=d["steady_at"],
        names=list(d["targets"]), threads=c["threads"], qd=c["qd"], tp_qd=c["tp_qd"],
        members=c["members"], volume=c["volume_bytes"], quick=c["quick"], raw_engine=c["raw_engine"],
        machine=d["machine"], total_elapsed=d.get("elapsed_s"), tmpfs=d["machine"]["members_fs"] == "tmpfs",
        zfs_info=c.get("zfs"))
    if a.out:
        report_path, assets = os.path.join(a.out, "benchmarks.md"), a.out
    else:
        report_path, assets = os.path.join(ROOT, "docs", "benchmarks.md"), os.path.join(ROOT, "docs", "bench")
    os.makedirs(assets, exist_ok=True)
    json_path = os.path.join(assets, "results.json")
    if os.path.abspath(json_path) != os.path.abspath(a.render):
        shutil.copyfile(a.render, json_path)
    files = plots(s, assets)
    report(s, files, report_path, os.path.relpath(json_path, os.path.dirname(os.path.abspath(report_path))))
    print(f"pts: report {report_path} redrawn from {a.render}", file=sys.stderr)


def main():
    ensure_matplotlib()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="CI smoke: reduced matrix, one short round")
    ap.add_argument("--out", help="directory for the report, plots and JSON (default: docs/benchmarks.md "
                                  "and docs/bench/, or a temp dir in quick mode)")
    ap.add_argument("--targets", help=f"comma-separated subset of: {','.join(TARGETS)}")
    ap.add_argument("--threads", type=int, default=2, help="threads (fio jobs, NBD connections, reactors)")
    ap.add_argument("--qd", type=int, default=16, help="queue depth per thread in the IOPS test")
    ap.add_argument("--tp-qd", type=int, default=8, help="queue depth per thread in the throughput test")
    ap.add_argument("--members", type=int, default=10, help="RAID6 members (data = members - 2)")
    ap.add_argument("--member-mib", type=int, help="member size in MiB (full: 256, quick: 16)")
    ap.add_argument("--runtime", type=float, help="seconds per cell per round (full: 1, quick: 0.1)")
    ap.add_argument("--rounds", type=int, help="fixed number of rounds instead of steady-state detection")
    ap.add_argument("--dir", help="where the member files go (default: a directory in /dev/shm)")
    ap.add_argument("--uraid", default=URAID)
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="measure nothing: redraw the report and plots from a results.json")
    a = ap.parse_args()
    if a.render:
        return render(a)
    for tool in ("fio", "nbdkit", "qemu-nbd", "nbdinfo"):
        if not shutil.which(tool):
            sys.exit(f"pts: {tool} not found: run scripts/setup.sh")
    if not os.access(a.uraid, os.X_OK):
        sys.exit(f"pts: {a.uraid} not found: run scripts/setup.sh")
    if a.members < 4:
        sys.exit("pts: RAID6 needs at least 4 members")
    if a.out:
        out_dir = a.out
        report_path, assets = os.path.join(out_dir, "benchmarks.md"), out_dir
    elif a.quick:
        out_dir = tempfile.mkdtemp(prefix="uraid-pts-quick-")
        report_path, assets = os.path.join(out_dir, "benchmarks.md"), out_dir
    else:
        report_path, assets = os.path.join(ROOT, "docs", "benchmarks.md"), os.path.join(ROOT, "docs", "bench")
    os.makedirs(assets, exist_ok=True)

    s = Suite(a)
    # A SIGTERM unwinds like an error: the finally below tears the servers, the ZFS pool and its daemon down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.time()
    try:
        s.setup()
        s.measure()
    finally:
        for t in getattr(s, "targets", {}).values():
            t.stop()
        s.cleanup()
    s.total_elapsed = time.time() - t0
    s.medians()
    s.machine = machine(s)
    bad = s.missing()
    json_path = os.path.join(assets, "results.json")
    with open(json_path, "w") as f:
        json.dump({"config": dict(s.cfg, threads=s.threads, qd=s.qd, tp_qd=s.tp_qd, members=s.members,
                                  quick=s.quick, raw_engine=getattr(s, "raw_engine", None),
                                  volume_bytes=s.volume, zfs=s.zfs_info),
                   "machine": s.machine, "targets": {n: TARGETS[n] for n in s.names},
                   "cells": {t: [key(c) for c in cells(s.cfg, t)] for t in TESTS},
                   "median": s.med, "rounds": s.rounds, "steady_at": s.steady_at,
                   "elapsed_s": s.total_elapsed,
                   "targets_checked": [dict(zip(("target", "needed", "measured", "detail"), c))
                                       for c in target_checks(s)]}, f, indent=1)
    files = plots(s, assets)
    report(s, files, report_path, os.path.relpath(json_path, os.path.dirname(os.path.abspath(report_path))))
    print(f"pts: report {report_path}, plots and results.json in {assets} "
          f"({s.total_elapsed / 60:.1f} min)", file=sys.stderr)
    if bad:
        print("pts: cells without a number:\n  " + "\n  ".join(bad), file=sys.stderr)
        sys.exit(1)
    cnt = sum(len(cells(s.cfg, t)) for t in TESTS) * len(s.names)
    print(f"pts: {cnt} cells, every one measured", file=sys.stderr)


if __name__ == "__main__":
    main()
