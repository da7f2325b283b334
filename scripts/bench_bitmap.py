#!/usr/bin/env python3
"""What a finer write-intent bitmap costs on members whose FLUSH is slow: RAID6 8+2 of ten
files on /dev/shm, each behind nbdkit (file plugin under scripts/flushdelay.c, a filter that
makes every FLUSH wait; nbdkit's delay filter cannot) exposed by nbdfuse. Per case the array is
created again with `--bitmap-chunk` none / 64M / 4M / 1M, filled (so no write meets an
unallocated granule) and stopped cleanly (every bit clear), then served and written with fio
(ioengine=nbd, Unix socket) from clear bits: the worst case, a burst after idle. Cases
alternate within each run; medians. Reports throughput against no bitmap, the bitmap's set
rounds (each a page write and a FLUSH of every member) per GiB written, and how much of the
volume a crash at the end would resync (dirty regions). Needs nbdkit-plugin-dev (the header)
and a C compiler. Usage:

    scripts/bench_bitmap.py [--runs 3] [--runtime 5] [--flush-ms 2] [--dir /dev/shm/uraid-bm]
"""
import argparse, os, shutil, statistics

from benchlib import cpu_model, ROOT, URAID, FuseMember, Server, fio_json, run, spread, status

MEMBERS, SIZE = 10, 128 << 20
CASES = ["none", "64M", "4M", "1M"]
LOADS = [
    ("1M seq write QD4", ["--rw=write", "--bs=1m", "--iodepth=4"]),
    ("4k randwrite QD8", ["--rw=randwrite", "--bs=4k", "--iodepth=8", "--norandommap", "--randrepeat=0"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runtime", type=float, default=5)
    ap.add_argument("--flush-ms", type=float, default=2)
    ap.add_argument("--dir", default="/dev/shm/uraid-bm")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    so = os.path.join(a.dir, "flushdelay.so")
    run(["cc", "-O2", "-shared", "-fPIC", "-o", so, os.path.join(ROOT, "scripts", "flushdelay.c")])
    members = []
    try:
        for i in range(MEMBERS):
            members.append(FuseMember(os.path.join(a.dir, f"m{i}"), SIZE).start(
                [f"--filter={so}"], [f"flush-delay-us={int(a.flush_ms * 1000)}"]))
        paths = [m.path for m in members]
        sock, ctl = os.path.join(a.dir, "nbd.sock"), os.path.join(a.dir, "ctl.sock")
        uri = f"nbd+unix:///bm?socket={sock}"

        def serve():
            return Server([URAID, "serve", f"--listen=unix:{sock}", f"--control=unix:{ctl}", *paths],
                          sock=sock, unlink=[ctl], log=os.path.join(a.dir, "serve.log")).start()

        res = {(c, l): [] for c in CASES for l, _ in LOADS}
        for r in range(a.runs):
            for case in CASES:
                for name, extra in LOADS:
                    run([URAID, "create", "--force", "--level", "6", "-N", "bm", "--bitmap-chunk", case] + paths)
                    s = serve()
                    run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m",
                         "--iodepth=4", "--size=100%"])
                    s.stop(check=True)
                    s = serve()
                    j = fio_json(["fio", "--name=w", "--ioengine=nbd", f"--uri={uri}", *extra, "--size=100%",
                                  f"--runtime={a.runtime}", "--time_based", "--output-format=json"])
                    w = j["jobs"][0]["write"]
                    bm = status(ctl)["bitmap"]
                    s.stop(check=True)
                    gib = w["io_bytes"] / (1 << 30)
                    v = (w["iops"] if "4k" in name else w["bw_bytes"] / 1e6, bm["set_rounds"] / gib,
                         bm["dirty_regions"] / max(1, bm["regions"]))
                    res[(case, name)].append(v)
                    print(f"run {r + 1}, bitmap {case}, {name}: {v[0]:.0f}, {bm['set_rounds']} set rounds in "
                          f"{gib:.2f} GiB, {bm['dirty_regions']} of {bm['regions']} regions dirty")
        cpu = cpu_model()
        print(f"\nCPU: {cpu}; RAID6 8+2, {SIZE >> 20} MiB members behind nbdkit (FLUSH +{a.flush_ms:g} ms) and "
              f"nbdfuse; {a.runs} runs x {a.runtime:g} s, cases alternating, medians")
        print("| region | load | result | vs none | spread | set rounds per GiB | dirty at the end |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for name, _ in LOADS:
            base = statistics.median(v[0] for v in res[("none", name)])
            unit = "IOPS" if "4k" in name else "MB/s"
            for case in CASES:
                vs = res[(case, name)]
                m = statistics.median(v[0] for v in vs)
                rounds = statistics.median(v[1] for v in vs)
                dirty = statistics.median(v[2] for v in vs)
                print(f"| {case} | {name} | {m:,.0f} {unit} | {m / base:.2f} | {spread([v[0] for v in vs]):.0%} | "
                      f"{rounds:.1f} | {dirty:.0%} |")
    finally:
        for m in members:
            m.stop()
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
