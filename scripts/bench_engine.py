#!/usr/bin/env python3
"""uraid bench vs fio (io_uring, O_DIRECT) on the same /dev/shm member files.

For each array (raid0 4, raid5 4+1, raid6 8+2) the script creates the array, preconditions it
by writing the whole volume through uraid (so every member byte, parity included, is written),
then alternates uraid and fio runs of each workload, same threads and total queue depth,
and reports medians. Usage:

    scripts/bench_engine.py [--runs 3] [--runtime 5] [--size 1G] [--dir /dev/shm/uraid-bench]
                            [--out docs/bench-engine.md]

The Markdown it writes is pasted into docs/investigations/perf-notes.md.
"""
import argparse, json, os, shutil, statistics, sys, time

from benchlib import URAID, fio_json, run, write_report

WORKLOADS = [
    # name, uraid args, fio rw, bs, total qd, metric
    ("4k randread QD32", ["--pattern", "rand", "--bs", "4K", "--qd", "32", "--read-pct", "100"], "randread", "4k", 32, "iops"),
    ("4k randwrite QD32", ["--pattern", "rand", "--bs", "4K", "--qd", "32", "--read-pct", "0"], "randwrite", "4k", 32, "iops"),
    ("1M seq read QD8", ["--pattern", "seq", "--bs", "1M", "--qd", "8", "--read-pct", "100"], "read", "1m", 8, "mbps"),
    ("1M seq write QD8", ["--pattern", "seq", "--bs", "1M", "--qd", "8", "--read-pct", "0"], "write", "1m", 8, "mbps"),
]

ARRAYS = [("raid0", "0", 4, []), ("raid5", "5", 5, []), ("raid6", "6", 10, [])]


def uraid_run(members, extra, runtime, threads):
    out = run([URAID, "bench", "--json", "--allow-writes", "--runtime", str(runtime), "--threads", str(threads)]
              + extra + members)
    j = json.loads(out)
    return j["iops"], j["mb_per_s"], j


def fio_run(members, rw, bs, qd, runtime, threads):
    cmd = ["fio", "--name=raw", "--ioengine=io_uring", "--direct=1", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd // threads}", f"--numjobs={threads}", "--group_reporting", "--thread",
           f"--runtime={runtime}", "--time_based", "--output-format=json", "--norandommap",
           "--randrepeat=0", "--offset=1m", "--filename=" + ":".join(members)]
    j = fio_json(cmd)["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    return side["iops"], side["bw_bytes"] / 1e6, cmd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runtime", type=float, default=5)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--dir", default="/dev/shm/uraid-bench")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    rows, raw = [], {}
    for name, level, n, extra in ARRAYS:
        shutil.rmtree(a.dir, ignore_errors=True)
        os.makedirs(a.dir)
        members = [os.path.join(a.dir, f"m{i}") for i in range(n)]
        run([URAID, "create", "--level", level, "--size", a.size, "--chunk", "64K", "--force"] + extra + members)
        t0 = time.time()
        run([URAID, "bench", "--precondition", "--allow-writes", "--runtime", "0.1", "--threads", str(a.threads)]
            + members)
        print(f"{name}: created and preconditioned in {time.time() - t0:.1f}s", file=sys.stderr)
        for wname, uargs, rw, bs, qd, metric in WORKLOADS:
            u, f = [], []
            for r in range(a.runs):
                iops, mbps, j = uraid_run(members, uargs, a.runtime, a.threads)
                u.append(iops if metric == "iops" else mbps)
                fi, fm, _ = fio_run(members, rw, bs, qd, a.runtime, a.threads)
                f.append(fi if metric == "iops" else fm)
                print(f"  {name} {wname} run {r}: uraid {u[-1]:.0f} raw {f[-1]:.0f} {metric} planner={j['planner']}", file=sys.stderr)
            um, fm = statistics.median(u), statistics.median(f)
            rows.append((name, wname, metric, um, fm, u, f))
            raw[(name, wname)] = fm
        shutil.rmtree(a.dir, ignore_errors=True)
    out = []
    out.append(f"Runs: {a.runs} alternating uraid/fio runs of {a.runtime:g}s per cell, median quoted; "
               f"{a.threads} threads; members {a.size} files in {a.dir}; chunk 64K.\n")
    out.append("| array | workload | uraid | raw (fio) | uraid / raw | all uraid runs | all raw runs |")
    out.append("|---|---|---:|---:|---:|---|---|")
    unit = {"iops": "IOPS", "mbps": "MB/s"}
    for name, wname, metric, um, fm, u, f in rows:
        out.append(f"| {name} | {wname} | {um:,.0f} {unit[metric]} | {fm:,.0f} {unit[metric]} | {um / fm:.2f} | "
                   f"{', '.join(f'{x:,.0f}' for x in u)} | {', '.join(f'{x:,.0f}' for x in f)} |")
    # Targets from the engine issue.
    def cell(arr, w):
        return next((r[3], r[4]) for r in rows if r[0] == arr and r[1] == w)
    out.append("\n| target | needed | measured | met |")
    out.append("|---|---|---|---|")
    u, f = cell("raid0", "4k randread QD32")
    out.append(f"| raid0 4k randread ≥ 90% of raw | ≥ 0.90 | {u / f:.2f} | {'yes' if u / f >= 0.9 else 'no'} |")
    u, f = cell("raid6", "4k randread QD32")
    out.append(f"| raid6 4k randread ≥ 85% of raw | ≥ 0.85 | {u / f:.2f} | {'yes' if u / f >= 0.85 else 'no'} |")
    u, f = cell("raid6", "1M seq write QD8")
    ratio = u / (0.8 * f)
    out.append(f"| raid6 1M seq write ≥ 70% of 8/10 × raw | ≥ 0.70 | {ratio:.2f} ({u:,.0f} vs 0.8 × {f:,.0f} MB/s) | {'yes' if ratio >= 0.7 else 'no'} |")
    R = cell("raid6", "4k randread QD32")[1]
    W = cell("raid6", "4k randwrite QD32")[1]
    bound = 1 / (3 / R + 3 / W)
    u = cell("raid6", "4k randwrite QD32")[0]
    out.append(f"| raid6 4k randwrite ≥ 0.8 × 1/(3/R + 3/W) | ≥ 0.80 | {u / bound:.2f} ({u:,.0f} vs bound {bound:,.0f} IOPS; R={R:,.0f}, W={W:,.0f}) | {'yes' if u / bound >= 0.8 else 'no'} |")
    write_report(a.out, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
