#!/usr/bin/env python3
"""The cost of safe mode (serve --safe-mode-delay, md's safe_mode_delay) on QD1 4k writes over
NBD (fio, ioengine=nbd, Unix socket): A = `--safe-mode-delay 0` (off), B = the default (1 s),
same binary and members (RAID6 4+2 of files on /dev/shm, preconditioned), runs alternating A, B.
Two loads: writes back to back (the array never idles: safe mode never runs), and bursts after
idle (fio thinktime: each write follows an idle period longer than the delay, so with B it finds
the array clean and pays the round that marks it dirty again). Medians of the mean completion
latency and the ratio B / A. Usage:

    scripts/bench_safe_mode.py [--runs 5] [--dir /dev/shm/uraid-safe]
"""
import argparse, os, shutil, statistics

from benchlib import cpu_model, URAID, Server, fio_json, run, spread

LOADS = [
    ("4k randwrite QD1, back to back (5 s)", ["--runtime=5", "--time_based"]),
    ("4k randwrite QD1, one write per 1.5 s idle (10 writes)",
     ["--thinktime=1500000", "--thinktime_blocks=1", "--number_ios=10"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default="/dev/shm/uraid-safe")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    members = [os.path.join(a.dir, f"m{i}") for i in range(6)]
    run([URAID, "create", "--level", "6", "--size", "256M", "-N", "safe"] + members)
    sock = os.path.join(a.dir, "nbd.sock")
    uri = f"nbd+unix:///safe?socket={sock}"

    def serve(delay):
        return Server([URAID, "serve", f"--listen=unix:{sock}", "--control=none",
                       f"--safe-mode-delay={delay}", *members], sock=sock).start()

    s = serve(0)
    run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1m", "--iodepth=4",
         "--size=100%"])
    s.stop(check=True)
    res = {(l, d): [] for l, _ in LOADS for d in (0, 1)}
    for r in range(a.runs):
        for delay in (0, 1):
            s = serve(delay)
            for name, extra in LOADS:
                j = fio_json(["fio", "--name=w", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=4k",
                              "--iodepth=1", "--norandommap", "--randrepeat=0", "--size=100%",
                              "--output-format=json", *extra])["jobs"][0]["write"]
                res[(name, delay)].append(j["clat_ns"]["mean"] / 1000)
            s.stop(check=True)
            print(f"run {r + 1}, delay {delay}: " +
                  ", ".join(f"{res[(n, delay)][-1]:.0f} us" for n, _ in LOADS))
    cpu = cpu_model()
    print(f"\nCPU: {cpu}; RAID6 4+2, 256 MiB /dev/shm members; {a.runs} runs alternating; medians of the "
          f"mean write latency")
    print("| load | A: safe mode off | B: delay 1 s | B / A | spread A | spread B |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, _ in LOADS:
        va, vb = res[(name, 0)], res[(name, 1)]
        ma, mb = statistics.median(va), statistics.median(vb)
        print(f"| {name} | {ma:.0f} us | {mb:.0f} us | {mb / ma:.2f} | {spread(va):.0%} | {spread(vb):.0%} |")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
