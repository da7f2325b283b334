#!/usr/bin/env python3
"""A fail-slow member: 4k random reads over NBD (fio, ioengine=nbd) from a RAID6 of six members,
each a file behind nbdkit (file plugin, delay filter) exposed by nbdfuse, in three cases run
alternately: healthy (no delay anywhere), member 2 made N times slower than its measured
latency with `--slow-factor 5` (the default: reads go around it once it is flagged), and the
same slow member with `--slow-factor 0` (every read of its chunks waits for it). Medians of
IOPS and p99 completion latency over the runs, and each slow case against healthy. Usage:

    scripts/bench_slow.py [--runs 5] [--runtime 10] [--qd 8] [--times 20] [--dir /dev/shm/uraid-slow]
                          [--compare OTHER_URAID_BINARY]

--compare adds a fourth case in the same runs: the slow member read around by another build
(an A/B of a change to the read-around path).

--raw: the members are the plain files on /dev/shm (io_uring, O_DIRECT: cheap for the host, as
NVMe is), and only the slow cases put member 2 behind nbdkit's delay filter and nbdfuse. With
every member behind FUSE (the default) the six member processes share the host's cores with
the server and fio, so the extra member reads of a read-around cost IOPS that NVMe would not;
--raw shows the mechanism without that. The slow member is then the filter's smallest step
(1 ms) plus the FUSE path: far more than 20x a raw member, printed as measured.
"""
import argparse, os, shutil, statistics

from benchlib import cpu_model, URAID, FuseMember, Server, fio_json, run, spread, status

MEMBERS, SLOW, SIZE = 6, 2, 128 << 20


def start(m, delay_ms):
    """(Re)starts member `m` with a per-request delay of `delay_ms` on reads and writes."""
    m.start(["--filter=delay"], [f"delay-read={delay_ms}ms", f"delay-write={delay_ms}ms"])


def fio(target, runtime, qd, nbd=True, rw="randread"):
    eng = [f"--ioengine=nbd", f"--uri={target}"] if nbd else ["--ioengine=libaio", "--direct=1",
                                                               f"--filename={target}"]
    j = fio_json(["fio", "--name=slow", *eng, f"--rw={rw}", "--bs=4k", f"--iodepth={qd}", "--norandommap",
                  "--randrepeat=0", f"--runtime={runtime}", "--time_based", "--size=100%",
                  "--output-format=json"])["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    pct = side["clat_ns"]["percentile"]
    fio.last = {q: pct[f"{q:.6f}"] / 1000 for q in (50, 80, 90, 95) if f"{q:.6f}" in pct}
    return side["iops"], pct["99.000000"] / 1000, side["clat_ns"]["mean"] / 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runtime", type=float, default=10)
    ap.add_argument("--qd", type=int, default=8)
    ap.add_argument("--times", type=float, default=20, help="how many times slower member 2 is made")
    ap.add_argument("--dir", default="/dev/shm/uraid-slow")
    ap.add_argument("--compare", help="another uraid binary: adds its read-around case")
    ap.add_argument("--raw", action="store_true",
                    help="members are plain files; only the slow member goes through nbdkit and FUSE")
    ap.add_argument("--read-ahead", default="on", choices=("on", "off"),
                    help="the same for every case (with --raw, `auto` would turn it on only where a "
                         "member is not memory: the slow cases)")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    members = [FuseMember(os.path.join(a.dir, f"m{i}"), SIZE) for i in range(MEMBERS)]
    raw = [os.path.join(m.d, "backing") for m in members]
    try:
        for m in members if not a.raw else [members[SLOW]]:
            start(m, 0)
        # The slow member's delay: `times` x one member's own 4k read latency at QD1.
        _, _, base_us = fio(raw[SLOW] if a.raw else members[SLOW].path, 3, 1, nbd=False)
        delay_ms = max(1, round(a.times * base_us / 1000))
        members[SLOW].stop()
        start(members[SLOW], delay_ms)
        _, _, slow_us = fio(members[SLOW].path, 3, 1, nbd=False)
        print(f"member 4k read at QD1: {base_us:.1f} us mean; slow member: +{delay_ms} ms per request, "
              f"{slow_us:.0f} us measured ({slow_us / base_us:.0f}x)")
        members[SLOW].stop()
        start(members[SLOW], 0)
        paths = raw if a.raw else [m.path for m in members]
        run([URAID, "create", "--level", "6", "-N", "slow", "--chunk", "64K"] + paths)
        sock, ctl = os.path.join(a.dir, "nbd.sock"), os.path.join(a.dir, "ctl.sock")
        uri = f"nbd+unix:///slow?socket={sock}"

        def serve(factor, binary=URAID, delay=0):
            # --raw: member 2 goes through FUSE only when it is the slow one.
            p = paths if not (a.raw and delay) else paths[:SLOW] + [members[SLOW].path] + paths[SLOW + 1:]
            return Server([binary, "serve", f"--listen=unix:{sock}", f"--control=unix:{ctl}",
                           f"--slow-factor={factor}", f"--read-ahead={a.read_ahead}", *p],
                          sock=sock, unlink=[ctl],
                          log=os.path.join(a.dir, "serve.log")).start()

        s = serve(5)
        run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m", "--iodepth=4",
             "--size=100%"])
        s.stop(check=True)
        cases = [("healthy", 0, 5, URAID), ("slow, read around (--slow-factor 5)", delay_ms, 5, URAID),
                 ("slow, --slow-factor 0", delay_ms, 0, URAID)]
        if a.compare:
            cases.append((f"slow, read around, {a.compare}", delay_ms, 5, a.compare))
        res = {c[0]: [] for c in cases}
        for r in range(a.runs):
            for name, delay, factor, binary in cases:
                members[SLOW].stop()
                start(members[SLOW], delay)
                s = serve(factor, binary, delay)
                # Long enough for the judgement (3 s) before the measured run.
                fio(uri, 5, a.qd)
                st = status(ctl)
                flagged = st["slots"][SLOW]["slow"]
                iops, p99, _ = fio(uri, a.runtime, a.qd)
                # Reads the slow member served during the run (a flagged member: its probes).
                slow_reads = (status(ctl)["slots"][SLOW]["read"]["count"] - st["slots"][SLOW]["read"]["count"]) \
                    / a.runtime
                s.stop(check=True)
                res[name].append((iops, p99, flagged, slow_reads))
                print(f"run {r + 1}: {name}: {iops:.0f} IOPS, p99 {p99:.0f} us, flagged {flagged}, "
                      f"member {SLOW} read {slow_reads:.0f}/s; "
                      + ", ".join(f"p{q} {v:.0f}" for q, v in fio.last.items()))
        h_iops = statistics.median(v[0] for v in res["healthy"])
        h_p99 = statistics.median(v[1] for v in res["healthy"])
        cpu = cpu_model()
        print(f"\nCPU: {cpu}; RAID6 of {MEMBERS} (64K chunk), {'raw' if a.raw else 'FUSE'} members, "
              f"fio nbd randread 4k QD{a.qd}, read-ahead {a.read_ahead}, "
              f"{a.runs} runs x {a.runtime:.0f} s, medians")
        print(f"| case | IOPS | vs healthy | p99 (us) | vs healthy | IOPS spread | flagged | member {SLOW} reads/s |")
        print("|---|---|---|---|---|---|---|---|")
        for name, _, _, _ in cases:
            iops = statistics.median(v[0] for v in res[name])
            p99 = statistics.median(v[1] for v in res[name])
            flagged = sum(v[2] for v in res[name])
            print(f"| {name} | {iops:.0f} | {iops / h_iops:.2f} | {p99:.0f} | {p99 / h_p99:.2f} | "
                  f"{spread([v[0] for v in res[name]]):.0%} | {flagged}/{len(res[name])} | "
                  f"{statistics.median(v[3] for v in res[name]):.0f} |")
    finally:
        for m in members:
            m.stop()
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
