#!/usr/bin/env python3
"""A/B engine benchmark: two uraid binaries side by side on the same kind of /dev/shm members.

Used to show that a change leaves the engine's speed unchanged within run-to-run noise
(docs/investigations/perf-notes.md). Each binary gets its own member files (its own on-disk format version),
created and preconditioned (whole volume written) by that binary; then every workload runs
alternately A, B, A, B... and the medians, the ratio B/A and each side's spread
((max - min) / median, the noise) are reported. Usage:

    scripts/ab_engine.py --a OLD/uraid --b target/release/uraid [--runs 5] [--runtime 3]
                         [--size 256M] [--threads 2] [--out FILE]

The same binary twice with different `uraid create` options compares array settings, e.g.
the write-intent bitmap's cost:

    scripts/ab_engine.py --a target/release/uraid --b target/release/uraid \
        --create-a="--bitmap-chunk none" --only "raid6"
"""
import argparse, json, os, shutil, statistics, sys

from benchlib import run, spread, write_report

WORKLOADS = [
    # name, uraid bench args, metric
    ("4k randread QD32", ["--pattern", "rand", "--bs", "4K", "--qd", "32", "--read-pct", "100"], "iops"),
    ("4k randwrite QD32", ["--pattern", "rand", "--bs", "4K", "--qd", "32", "--read-pct", "0"], "iops"),
    ("4k 65/35 QD32", ["--pattern", "rand", "--bs", "4K", "--qd", "32", "--read-pct", "65"], "iops"),
    ("1M seq read QD8", ["--pattern", "seq", "--bs", "1M", "--qd", "8", "--read-pct", "100"], "mbps"),
    ("1M seq write QD8", ["--pattern", "seq", "--bs", "1M", "--qd", "8", "--read-pct", "0"], "mbps"),
    ("4k randread QD32, 1 member out", ["--pattern", "rand", "--bs", "4K", "--qd", "32", "--read-pct", "100",
                                        "--fail", "1"], "iops"),
    ("4k randread QD32, 2 members out", ["--pattern", "rand", "--bs", "4K", "--qd", "32",
                                         "--read-pct", "100", "--fail", "1", "--fail", "2"], "iops"),
    ("1M seq read QD8, 1 member out", ["--pattern", "seq", "--bs", "1M", "--qd", "8", "--read-pct", "100",
                                       "--fail", "1"], "mbps"),
    ("1M seq read QD8, 2 members out", ["--pattern", "seq", "--bs", "1M", "--qd", "8",
                                        "--read-pct", "100", "--fail", "1", "--fail", "2"], "mbps"),
]

ARRAYS = [("raid6 8+2", "6", 10), ("raid0 x4", "0", 4), ("raid10 x4", "10", 4)]


def write_flag(binary):
    """Newer binaries refuse to write to named members without --allow-writes."""
    return ["--allow-writes"] if "--allow-writes" in run([binary, "bench", "--help"]) else []


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="baseline uraid binary")
    ap.add_argument("--b", required=True, help="candidate uraid binary")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--runtime", type=float, default=3)
    ap.add_argument("--size", default="256M")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default="/dev/shm/uraid-ab")
    ap.add_argument("--out", default="-")
    ap.add_argument("--only", help="substring filter on 'array workload' (a quick subset)")
    ap.add_argument("--create-a", default="", help="extra `uraid create` options for A's arrays")
    ap.add_argument("--create-b", default="", help="extra `uraid create` options for B's arrays")
    a = ap.parse_args()
    rows = []
    for aname, level, n in ARRAYS:
        if a.only and not any(a.only in f"{aname} {w[0]}" for w in WORKLOADS):
            continue
        members = {}
        for side, binary in (("a", a.a), ("b", a.b)):
            d = f"{a.dir}-{side}"
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            members[side] = [os.path.join(d, f"m{i}") for i in range(n)]
            extra = (a.create_a if side == "a" else a.create_b).split()
            run([binary, "create", "--level", level, "--size", a.size, "--chunk", "64K", "--force"] + extra
                + members[side])
            run([binary, "bench", "--precondition", "--runtime", "0.1", "--threads", str(a.threads)]
                + write_flag(binary) + members[side])
        for wname, wargs, metric in WORKLOADS:
            if "--fail" in wargs and level == "0":
                continue
            if a.only and a.only not in f"{aname} {wname}":
                continue
            res = {"a": [], "b": []}
            for r in range(a.runs):
                for side, binary in (("a", a.a), ("b", a.b)):
                    writes = wargs[wargs.index("--read-pct") + 1] != "100"
                    extra = write_flag(binary) if writes else []
                    j = json.loads(run([binary, "bench", "--json", "--runtime", str(a.runtime), "--threads",
                                        str(a.threads)] + wargs + extra + members[side]))
                    res[side].append(j["iops"] if metric == "iops" else j["mb_per_s"])
                print(f"  {aname} {wname} run {r}: A {res['a'][-1]:.0f} B {res['b'][-1]:.0f}", file=sys.stderr)
            rows.append((aname, wname, metric, res["a"], res["b"]))
        for side in ("a", "b"):
            shutil.rmtree(f"{a.dir}-{side}", ignore_errors=True)
    unit = {"iops": "IOPS", "mbps": "MB/s"}
    opts = "".join(f" {side}: create {o!r}." for side, o in (("A", a.create_a), ("B", a.create_b)) if o)
    out = [f"{a.runs} alternating runs of {a.runtime:g} s per cell and binary, medians; {a.threads} reactor "
           f"threads; members: {a.size} files on /dev/shm, chunk 64K, preconditioned. Spread = (max - min) / "
           f"median of one side's runs.{opts}\n",
           "| array | workload | A (baseline) | B (candidate) | B / A | spread A | spread B |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for aname, wname, metric, ra, rb in rows:
        ma, mb = statistics.median(ra), statistics.median(rb)
        out.append(f"| {aname} | {wname} | {ma:,.0f} {unit[metric]} | {mb:,.0f} {unit[metric]} | {mb / ma:.2f} | "
                   f"{spread(ra):.0%} | {spread(rb):.0%} |")
    write_report(a.out, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
