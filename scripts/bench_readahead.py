#!/usr/bin/env python3
"""Read-ahead (issue 27): sequential and random reads over NBD (fio, ioengine=nbd, and
nbdcopy) from a RAID6 4+2 (64K chunk), with `--read-ahead on` (the default) and `off`,
servers alternated within each run, medians over the runs. Two kinds of members:

  slow  every member a file behind nbdkit (file plugin, delay filter: `delay-read=MS`)
        exposed by nbdfuse: members with latency, as disks behind a network are;
  shm   plain files on /dev/shm (io_uring, O_DIRECT): what read-ahead costs where members
        are as fast as memory.

Cells: one stream of 128 KiB reads at QD1 and QD16; the same stream split over 4 fio jobs
(zonemode=strided, each its own NBD connection, 4 deep: the server sees one stream,
reordered); nbdcopy of the volume with 4 connections to null:; 4k random reads at QD1 and
QD16. The server's peak RSS (VmHWM) is read once per server run. Usage:

    scripts/bench_readahead.py [--runs 3] [--runtime 5] [--members slow,shm] [--delay-ms 1]
                               [--dir /dev/shm/uraid-ra] [--memory 64M]
"""
import argparse, os, shutil, statistics, time

from benchlib import cpu_model, URAID, FuseMember, fio_json, proc_bytes, run, spread, status, uraid_serve

MEMBERS = 6


def fio(uri, runtime, rw, bs, qd, jobs=1, strided=False, size=None):
    """MB/s (reads) and IOPS of one fio run against `uri`."""
    extra = []
    if strided:
        # Job j reads 128 KiB at j * 128 KiB, then skips the other jobs' 3 x 128 KiB.
        extra = ["--zonemode=strided", f"--zonesize={bs}", f"--zoneskip={bs * (jobs - 1)}",
                 f"--offset_increment={bs}", "--group_reporting"]
    j = fio_json(["fio", "--name=ra", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
                  f"--iodepth={qd}", f"--numjobs={jobs}", "--norandommap", "--randrepeat=0",
                  f"--runtime={runtime}", "--time_based", f"--size={size}" if size else "--size=100%",
                  *extra, "--output-format=json"])
    r = j["jobs"][0]["read"]
    return r["bw_bytes"] / 1e6, r["iops"]


def nbdcopy(uri, conns):
    t = time.monotonic()
    run(["nbdcopy", f"--connections={conns}", "--no-extents", uri, "null:"])
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runtime", type=float, default=5)
    ap.add_argument("--members", default="slow,shm")
    ap.add_argument("--delay-ms", type=int, default=1, help="the slow members' delay per read")
    ap.add_argument("--dir", default="/dev/shm/uraid-ra")
    ap.add_argument("--memory", default="64M", help="--read-ahead-memory")
    ap.add_argument("--compare", metavar="BINARY",
                    help="another uraid build: a third case, read-ahead on with it (an A/B)")
    ap.add_argument("--only", help="run only the cells whose name contains this")
    a = ap.parse_args()
    cpu = cpu_model()
    cells = [
        ("seq 128k QD1", dict(rw="read", bs=128 << 10, qd=1)),
        ("seq 128k QD16", dict(rw="read", bs=128 << 10, qd=16)),
        ("seq 128k, 4 strided jobs x QD1 (reordered)", dict(rw="read", bs=128 << 10, qd=1, jobs=4,
                                                            strided=True)),
        ("seq 128k QD4", dict(rw="read", bs=128 << 10, qd=4)),
        ("seq 128k, 4 strided jobs x QD4 (reordered)", dict(rw="read", bs=128 << 10, qd=4, jobs=4,
                                                            strided=True)),
        ("nbdcopy, 4 connections", None),
        ("rand 4k QD1", dict(rw="randread", bs=4096, qd=1)),
        ("rand 4k QD16", dict(rw="randread", bs=4096, qd=16)),
    ]
    if a.only:
        cells = [c for c in cells if a.only in c[0]]
    modes = ("on", "off") + (("before",) if a.compare else ())
    for kind in a.members.split(","):
        d = os.path.join(a.dir, kind)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        fuse = []
        try:
            if kind == "slow":
                size = 128 << 20
                fuse = [FuseMember(os.path.join(d, f"m{i}"), size) for i in range(MEMBERS)]
                for m in fuse:
                    m.start(["--filter=delay"], [f"delay-read={a.delay_ms}ms"])
                paths = [m.path for m in fuse]
            else:
                size = 256 << 20
                paths = [os.path.join(d, f"m{i}") for i in range(MEMBERS)]
                for p in paths:
                    with open(p, "wb") as f:
                        f.truncate(size)
            run([URAID, "create", "--level", "6", "-N", "ra", "--chunk", "64K"] + paths)

            def server(mode):
                binary = a.compare if mode == "before" else URAID
                return uraid_serve(d, paths, "ra", binary=binary,
                                   extra=[f"--read-ahead={'on' if mode == 'before' else mode}",
                                          f"--read-ahead-memory={a.memory}"])

            s = server("on").start()
            run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={s.uri}", "--rw=write", "--bs=1m",
                 "--iodepth=8", "--size=100%"])
            s.stop(check=True)
            res = {(c, m): [] for c, _ in cells for m in modes}
            rss, ra = {m: [] for m in modes}, []
            for r in range(a.runs):
                for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
                    s = server(mode).start()
                    for name, c in cells:
                        before = status(s.ctl)["read_ahead"] if mode != "off" else None
                        if c is None:
                            secs = nbdcopy(s.uri, 4)
                            vol = int(run(["nbdinfo", "--size", s.uri]).strip())
                            mbs = vol / secs / 1e6
                            res[(name, mode)].append((mbs, 0))
                        else:
                            res[(name, mode)].append(fio(s.uri, a.runtime, **c))
                        v = res[(name, mode)][-1]
                        ctr = ""
                        if before:
                            after = status(s.ctl)["read_ahead"]
                            ctr = "; " + ", ".join(f"{k} {after[k] - before[k]}" for k in
                                                   ("hits", "late_hits", "misses", "prefetched_bytes",
                                                    "unused_bytes"))
                        print(f"{kind} run {r + 1} read-ahead {mode}: {name}: {v[0]:.1f} MB/s, "
                              f"{v[1]:.0f} IOPS{ctr}", flush=True)
                    if mode == "on":
                        ra.append(status(s.ctl)["read_ahead"])
                    rss[mode].append(proc_bytes(s.pid, "VmHWM"))
                    s.stop(check=True)
            print(f"\n{kind} members; CPU: {cpu}; RAID6 4+2, 64K chunk"
                  + (f", each member behind nbdkit delay-read={a.delay_ms}ms + nbdfuse" if kind == "slow"
                     else ", /dev/shm files") + f"; {a.runs} runs x {a.runtime:g} s, medians\n")
            if a.compare:
                print(f"before: read-ahead on with {a.compare}\n")
            extra = " | before (on) | on / before | spread before" if a.compare else ""
            print(f"| cell | read-ahead on | off | on / off | spread on, off{extra} |")
            print("|---|---:|---:|---:|---:" + ("|---:|---:|---:" if a.compare else "") + "|")
            med = {}
            for name, c in cells:
                unit = "IOPS" if c and c["rw"] == "randread" else "MB/s"
                k = 1 if unit == "IOPS" else 0
                on = [v[k] for v in res[(name, "on")]]
                off = [v[k] for v in res[(name, "off")]]
                med[name] = (statistics.median(on), statistics.median(off))
                more = ""
                if a.compare:
                    bf = [v[k] for v in res[(name, "before")]]
                    mb = statistics.median(bf)
                    more = f" | {mb:,.0f} {unit} | {med[name][0] / mb:.2f} | {spread(bf):.0%}"
                print(f"| {name} | {med[name][0]:,.0f} {unit} | {med[name][1]:,.0f} {unit} | "
                      f"{med[name][0] / med[name][1]:.2f} | {spread(on):.0%}, {spread(off):.0%}{more} |")
            for depth, inorder in ((1, "seq 128k QD4"), (4, "seq 128k QD16")):
                key = f"seq 128k, 4 strided jobs x QD{depth} (reordered)"
                if key not in med or inorder not in med:
                    continue
                strided = med[key][0]
                print(f"\nreordered stream (4 jobs x QD{depth}) vs the in-order stream at the same "
                      f"depth ({inorder}), read-ahead on: {strided / med[inorder][0]:.2f}")
            print(f"peak RSS (VmHWM), median: read-ahead on {statistics.median(rss['on']) / 2**20:.0f} MiB, "
                  f"off {statistics.median(rss['off']) / 2**20:.0f} MiB"
                  + (f", before {statistics.median(rss['before']) / 2**20:.0f} MiB" if a.compare else "")
                  + f" (budget {a.memory})")
            last = ra[-1]
            print(f"read-ahead counters, last run: {last}\n", flush=True)
        finally:
            for m in fuse:
                m.stop()
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
