#!/usr/bin/env python3
"""A/B over NBD: two uraid binaries serving the same members in turn, fio (ioengine=nbd, one
connection, Unix socket) against each, alternating A, B, A, B...; medians of IOPS and of the
server's CPU time per request (utime+stime from /proc/PID/stat around the run), the ratio B/A
and each side's spread ((max - min) / median). Used for the metrics cost in
docs/investigations/perf-notes.md
(A = the build before the change, B = with it; with B's control socket and a Prometheus
scrape every second while it runs, --scrape). Usage:

    scripts/ab_nbd.py --a OLD/uraid --b target/release/uraid [--runs 7] [--runtime 3] [--scrape]
        [--set random|write|qd1]
"""
import argparse, os, shutil, statistics, subprocess, sys, threading

from benchlib import TICK, Server, cpu_ticks, fio_json, run, spread

WORKLOADS = [("4k randread QD32", "randread", "4k", 32), ("4k randwrite QD32", "randwrite", "4k", 32)]
# --set write: sequential writes (the zero-copy write path); IOPS x block size = throughput.
WRITES = [("1M seq write QD8", "write", "1m", 8), ("128k seq write QD8", "write", "128k", 8)]
# --set qd1: one request at a time (IOPS = 1 / mean latency).
QD1 = [("4k randread QD1", "randread", "4k", 1), ("4k randwrite QD1", "randwrite", "4k", 1)]



def fio(uri, rw, bs, qd, runtime, extra=()):
    cmd = ["fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", "--output-format=json", "--norandommap", "--randrepeat=0",
           f"--runtime={runtime}", "--time_based", "--size=100%"] + list(extra)
    j = fio_json(cmd)["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["iops"], side["total_ios"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--runtime", type=float, default=3)
    ap.add_argument("--dir", default="/dev/shm/uraid-abnbd")
    ap.add_argument("--scrape", action="store_true", help="scrape B's /metrics every second while it runs")
    ap.add_argument("--set", choices=("random", "write", "qd1"), default="random",
                    help="random: 4k random read and write QD32; write: 1M and 128k sequential writes QD8; "
                         "qd1: 4k random read and write QD1")
    a = ap.parse_args()
    workloads = {"random": WORKLOADS, "write": WRITES, "qd1": QD1}[a.set]
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    members = [os.path.join(a.dir, f"m{i}") for i in range(10)]
    run([a.b, "create", "--level", "6", "--size", "256M", "-N", "ab"] + members)
    sock, ctl = os.path.join(a.dir, "nbd.sock"), os.path.join(a.dir, "ctl.sock")
    uri = f"nbd+unix:///ab?socket={sock}"
    has_control = {b: "--control" in run([b, "serve", "--help"]) for b in (a.a, a.b)}

    def start(binary):
        argv = [binary, "serve", "--listen", f"unix:{sock}"]
        if has_control[binary]:
            argv += ["--control", f"unix:{ctl}"]
        return Server(argv + members, sock=sock).start()

    def stop(p):
        p.stop(timeout=30, check=True)

    p = start(a.b)
    fio(uri, "write", "1m", 8, 0.1, ["--time_based=0", "--runtime=0"])  # precondition: whole volume
    stop(p)
    res = {}
    for r in range(a.runs):
        for side, binary in (("a", a.a), ("b", a.b)):
            p = start(binary)
            stop_scrape = threading.Event()
            if a.scrape and side == "b":
                def scrape():
                    while not stop_scrape.wait(1.0):
                        subprocess.run(["curl", "-s", "-o", "/dev/null", "--unix-socket", ctl,
                                        "http://uraid/metrics"])
                threading.Thread(target=scrape, daemon=True).start()
            for wl, rw, bs, qd in workloads:
                t0 = cpu_ticks(p.pid)
                iops, ios = fio(uri, rw, bs, qd, a.runtime)
                cpu = (cpu_ticks(p.pid) - t0) / TICK * 1e6 / max(ios, 1)
                res.setdefault((wl, side), []).append((iops, cpu))
                print(f"run {r} {side} {wl}: {iops:.0f} IOPS {cpu:.2f} us/req", file=sys.stderr)
            stop_scrape.set()
            stop(p)
    print(f"{a.runs} alternating runs of {a.runtime:g} s, raid6 8+2 over 256M /dev/shm files, fio nbd "
          f"(one connection, Unix socket); medians; spread = (max - min) / median.\n")
    print("| workload | A IOPS | B IOPS | B / A | spread A | spread B | A CPU us/req | B CPU us/req | B / A |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for wl, *_ in workloads:
        ia = [x[0] for x in res[(wl, "a")]]
        ib = [x[0] for x in res[(wl, "b")]]
        ca = statistics.median(x[1] for x in res[(wl, "a")])
        cb = statistics.median(x[1] for x in res[(wl, "b")])
        ma, mb = statistics.median(ia), statistics.median(ib)
        print(f"| {wl} | {ma:,.0f} | {mb:,.0f} | {mb / ma:.2f} | {spread(ia):.0%} | {spread(ib):.0%} | "
              f"{ca:.2f} | {cb:.2f} | {cb / ca:.2f} |")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
