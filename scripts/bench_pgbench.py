#!/usr/bin/env python3
"""PostgreSQL pgbench on ext4 on an NBD volume, uraid against nbdkit, as a new user would stack
it: the server on a Unix socket, nbdfuse exposing the export as a file, a loop device with
direct I/O on that file, ext4, PostgreSQL (the Debian package's binaries; synchronous commit,
the default). Each round builds every case from nothing (members, array, file system,
`initdb`, `pgbench -i -s SCALE`) and then runs `pgbench -c 8 -j 2 -T SECONDS`; the cases
alternate within a round. Reports each run's TPS, the medians, and uraid's over nbdkit's.

    scripts/bench_pgbench.py [--rounds 5] [--seconds 30] [--scale 20] [--journal]
                             [--no-busy-poll-too] [--compare BINARY]
                             [--dir /dev/shm/uraid-pg] [--out -]

Cases: `uraid` serves RAID6 8+2 over ten /dev/shm files (chunk 64K, the default bitmap);
`nbdkit` serves one /dev/shm file of the same size with its file plugin. `--journal` adds a
case: the same RAID6 with a write-back journal on an eleventh /dev/shm file;
`--no-busy-poll-too` one served with `--busy-poll 0`; `--compare BINARY` one served by another
build (an A/B).
Needs root (loop devices, mount), PostgreSQL 15's server binaries, nbdfuse, nbdkit.
"""
import argparse, os, platform, re, shutil, statistics, subprocess, time

from benchlib import TICK, URAID, cpu_model, Server, cpu_ticks, run, status, write_report

PGBIN = "/usr/lib/postgresql/15/bin"
MEMBERS, DATA = 10, 8
VOLUME = 4 << 30


def as_postgres(cmd, **kw):
    return run(["runuser", "-u", "postgres", "--", *cmd], **kw)


class Stack:
    """One case, built from nothing in `d`: a server (started by `serve`), nbdfuse, a loop
    device, ext4 and a PostgreSQL cluster on it. `close` takes it all down, whatever failed."""

    def __init__(self, d, case, port, binary=URAID, serve_args=()):
        self.d, self.case, self.port, self.binary, self.serve_args = d, case, port, binary, serve_args
        self.server = self.fuse = self.loop = self.ctl = None
        self.mounted = self.pg = False
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        self.mnt, self.fs = os.path.join(d, "mnt"), os.path.join(d, "fs")
        os.makedirs(self.mnt)
        os.makedirs(self.fs)
        self.sockdir = os.path.join(d, "pgsock")  # PostgreSQL's socket: a directory it may write
        os.makedirs(self.sockdir)
        shutil.chown(self.sockdir, "postgres", "postgres")

    def serve(self):
        sock = os.path.join(self.d, "nbd.sock")
        if self.case == "nbdkit":
            backing = os.path.join(self.d, "volume")
            with open(backing, "wb") as f:
                f.truncate(VOLUME)
            self.server = Server(["nbdkit", "-f", "--exit-with-parent", "-U", sock, "file", backing],
                                 sock=sock, log=os.path.join(self.d, "server.log")).start()
            return f"nbd+unix:///?socket={sock}"
        member = VOLUME // DATA + (16 << 20)  # room for the superblocks and the bitmap
        paths = [os.path.join(self.d, f"m{i}") for i in range(MEMBERS)]
        extra = []
        if self.case.startswith("uraid-journal"):
            jpath = os.path.join(self.d, "journal")
            with open(jpath, "wb") as f:
                f.truncate(1 << 30)
            extra = ["--journal", jpath, "--journal-mode", "write-back"]
        run([URAID, "create", "--level", "6", "-N", "pg", "--chunk", "64K", "--size", str(member), *extra, *paths])
        ctl = os.path.join(self.d, "ctl.sock")
        # The journal device is given to serve with the members.
        self.ctl = ctl
        self.server = Server([self.binary, "serve", f"--listen=unix:{sock}", f"--control=unix:{ctl}",
                              *self.serve_args, *paths,
                              *extra[1:2]], sock=sock, unlink=[ctl], log=os.path.join(self.d, "server.log")).start()
        return f"nbd+unix:///pg?socket={sock}"

    def build(self, scale):
        uri = self.serve()
        disk = os.path.join(self.mnt, "disk")
        self.fuse = subprocess.Popen(["nbdfuse", disk, uri], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t = time.monotonic()
        while not (os.path.exists(disk) and os.path.getsize(disk) >= VOLUME):
            if time.monotonic() - t > 30 or self.fuse.poll() is not None:
                raise RuntimeError(f"nbdfuse did not expose {uri} at {disk}")
            time.sleep(0.05)
        self.loop = run(["losetup", "--direct-io=on", "--find", "--show", disk]).strip()
        # Inode tables and the journal initialised now, not by a background thread during the run.
        run(["mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.loop])
        run(["mount", self.loop, self.fs])
        self.mounted = True
        data = os.path.join(self.fs, "pgdata")
        os.makedirs(data)
        shutil.chown(data, "postgres", "postgres")
        as_postgres([f"{PGBIN}/initdb", "-D", data, "--auth=trust"])
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"port = {self.port}\nunix_socket_directories = '{self.sockdir}'\nlisten_addresses = ''\n"
                    "shared_buffers = 128MB\n")
        # Marked before the start: a start that fails late may leave a postmaster to stop.
        self.pg, self.data = True, data
        as_postgres([f"{PGBIN}/pg_ctl", "-D", data, "-w", "-l", os.path.join(self.sockdir, "pg.log"), "start"])
        as_postgres([f"{PGBIN}/pgbench", "-h", self.sockdir, "-p", str(self.port), "-i", "-q", "-s", str(scale),
                     "postgres"])
        as_postgres([f"{PGBIN}/psql", "-h", self.sockdir, "-p", str(self.port), "-q", "-c", "CHECKPOINT", "postgres"])

    def counters(self):
        """What the server did so far: its CPU seconds and, for uraid, the requests, the member
        I/O summed over the members, and the stripe operations."""
        c = {"server CPU s": cpu_ticks(self.server.pid) / TICK}
        if self.ctl:
            st = status(self.ctl)
            for op in ("write", "flush", "read"):
                c[f"NBD {op}s"] = st["requests"]["ops"][op]["count"]
            for op in ("write", "flush"):
                o = st["requests"]["ops"][op]
                c[f"mean µs: NBD {op}"] = (o["latency_mean_us"] or 0) * o["count"]  # a total here
            for op in ("write", "flush", "read"):
                c[f"member {op}s"] = sum(s[op]["count"] for s in st["slots"])
            c["bitmap set rounds"] = st["bitmap"]["set_rounds"]
            for op in ("full", "read_modify_write", "reconstruct", "merged", "plugged"):
                c[f"stripe {op}"] = st["stripe_operations"][op]
        return c

    def bench(self, seconds):
        before = self.counters()
        out = as_postgres([f"{PGBIN}/pgbench", "-h", self.sockdir, "-p", str(self.port), "-c", "8", "-j", "2",
                           "-T", str(seconds), "postgres"])
        m = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
        if not m:
            raise RuntimeError(f"no tps in pgbench's output:\n{out}")
        n = re.search(r"number of transactions actually processed: ([0-9]+)", out)
        after = self.counters()
        per = {}
        for k in after if n else ():
            if k.startswith("mean"):  # latency totals over the requests of the run
                count = f"NBD {k.rsplit(' ', 1)[1]}s"
                per[k] = (after[k] - before[k]) / max(1, after[count] - before[count])
            else:
                per[k] = (after[k] - before[k]) / int(n.group(1))
        return float(m.group(1)), per

    def close(self):
        if self.pg:
            subprocess.run(["runuser", "-u", "postgres", "--", f"{PGBIN}/pg_ctl", "-D", self.data, "-m", "fast",
                            "-w", "stop"], capture_output=True)
            self.pg = False
        if self.mounted:
            if subprocess.run(["umount", self.fs], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", self.fs], capture_output=True)
            self.mounted = False
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
            self.loop = None
        if self.fuse:
            subprocess.run(["fusermount3", "-u", self.mnt], capture_output=True)
            try:
                self.fuse.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.fuse.kill()
                self.fuse.wait()
            self.fuse = None
        if self.server:
            self.server.stop()
            self.server = None
        shutil.rmtree(self.d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--journal", action="store_true", help="add RAID6 with a write-back journal")
    ap.add_argument("--no-busy-poll-too", action="store_true", help="add RAID6 served with --busy-poll 0")
    ap.add_argument("--compare", help="another uraid binary: adds RAID6 served by it (an A/B)")
    ap.add_argument("--dir", default="/dev/shm/uraid-pg")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_pgbench: needs root (loop devices, mount)")
    # name: (uraid binary, serve's extra arguments)
    spec = {"uraid": (URAID, ()), "nbdkit": (None, ())}
    if a.journal:
        spec["uraid-journal"] = (URAID, ())
    if a.no_busy_poll_too:
        spec["uraid-busy-poll-0"] = (URAID, ("--busy-poll", "0"))
    if a.compare:
        spec["uraid-compare"] = (os.path.abspath(a.compare), ())
    cases = list(spec)
    tps = {c: [] for c in cases}
    per = {c: [] for c in cases}
    for r in range(a.rounds):
        order = cases if r % 2 == 0 else cases[::-1]
        for c in order:
            s = Stack(os.path.join(a.dir, c), c, 5433 + cases.index(c), *spec[c])
            try:
                s.build(a.scale)
                t, p = s.bench(a.seconds)
                tps[c].append(t)
                per[c].append(p)
            finally:
                s.close()
            print(f"round {r + 1}: {c} {tps[c][-1]:.0f} tps", flush=True)
    shutil.rmtree(a.dir, ignore_errors=True)
    med = {c: statistics.median(v) for c, v in tps.items()}
    lines = [f"CPU: {cpu_model()}, {os.cpu_count()} cores; kernel {platform.release()}; HEAD "
             f"{run(['git', '-C', os.path.dirname(URAID), 'rev-parse', '--short', 'HEAD']).strip()}"
             f"{' with uncommitted changes' if run(['git', '-C', os.path.dirname(URAID), 'status', '--porcelain', '-uno']).strip() else ''}"
             " (what target/release/uraid was built from is not checked)",
             f"pgbench -i -s {a.scale}, then -c 8 -j 2 -T {a.seconds}; {a.rounds} rounds, cases alternated",
             "", "| case | TPS per round | median | / nbdkit |", "|---|---|---:|---:|"]
    for c in cases:
        lines.append(f"| {c} | {', '.join(f'{t:.0f}' for t in tps[c])} | {med[c]:.0f} | "
                     f"{med[c] / med['nbdkit']:.2f}× |")
    keys = sorted({k for c in cases for p in per[c] for k in p}, key=lambda k: (k != "server CPU s", k))
    lines += ["", "Per transaction (medians over the rounds; server CPU in µs; \"mean µs\": the requests' mean latency in the server over the run):", "",
              "| | " + " | ".join(cases) + " |", "|---|" + "---:|" * len(cases)]
    for k in keys:
        cells = []
        for c in cases:
            v = [p[k] for p in per[c] if k in p]
            m = statistics.median(v) * (1e6 if k == "server CPU s" else 1) if v else None
            cells.append("" if m is None else f"{m:.2f}")
        lines.append(f"| {'server CPU µs' if k == 'server CPU s' else k} | " + " | ".join(cells) + " |")
    write_report(a.out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
