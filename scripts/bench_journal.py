#!/usr/bin/env python3
"""Journal device: sync-write latency and IOPS without a journal, with a write-through and
with a write-back journal, side by side in one run (docs/benchmarks.md).

RAID6 4+2, chunk 64K. The members are files on a *slower* device than the journal: the
machine's disk (default --dir /var/tmp/...; fdatasync there costs real device time) while
the journal is a file on /dev/shm (memory: its flush is nearly free) — seed 003's setup, a
fast log device in front of slower members. The same member files serve every mode: between
modes the array is stopped cleanly and `uraid journal remove` / `uraid journal add --mode M`
switch it (offline superblock rewrites). The volume is written end to end first.

Per mode, `uraid serve` on a Unix socket and fio's nbd engine (libnbd), 4 KiB random writes:
  qd1-sync   one client, each write followed by an NBD FLUSH (fio fsync=1: fio's nbd engine
             cannot set FUA; uraid runs a FUA write as the write then the same flush), mean
             and p99 of write + flush per operation;
  qd32-sync  32 clients (32 connections), each write followed by a FLUSH: IOPS;
  qd32       32 clients, no FLUSH at all: what the journal costs when nothing asks for sync.
Raw context, same disk: one member file with fio io_uring O_DIRECT, 4k random write +
fdatasync, QD1. Modes rotate order every run; medians over --runs.

    scripts/bench_journal.py [--runs 3] [--seconds 6] [--size 512M] [--out -]
"""
import argparse, json, os, shutil, statistics

from benchlib import URAID, fio_json, is_tmpfs, run, spread, uraid_serve, write_report

MODES = ["none", "write-through", "write-back"]


def fio_nbd(uri, jobs, fsync, seconds, size):
    cmd = ["fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", "--rw=randwrite", "--bs=4k",
           "--iodepth=1", f"--numjobs={jobs}", "--thread", "--group_reporting",
           f"--size={size}", "--norandommap", "--randrepeat=0", f"--runtime={seconds}",
           "--time_based", "--output-format=json"]
    if fsync:
        cmd.append("--fsync=1")
    j = fio_json(cmd)["jobs"][0]
    w = j["write"]
    r = {"iops": w["iops"], "write_us": w["lat_ns"]["mean"] / 1e3,
         "write_p99_us": w["clat_ns"]["percentile"]["99.000000"] / 1e3}
    if fsync:
        s = j["sync"]
        r["sync_us"] = s["lat_ns"]["mean"] / 1e3
        r["sync_p99_us"] = s["lat_ns"].get("percentile", {}).get("99.000000", 0) / 1e3
        r["op_us"] = r["write_us"] + r["sync_us"]
    return r


def fio_raw(path, seconds):
    j = fio_json(["fio", "--name=raw", "--ioengine=io_uring", "--direct=1", f"--filename={path}",
                  "--rw=randwrite", "--bs=4k", "--iodepth=1", "--fsync=1", "--offset=1m",
                  "--size=256m", f"--runtime={seconds}", "--time_based", "--output-format=json"])["jobs"][0]
    return {"write_us": j["write"]["lat_ns"]["mean"] / 1e3,
            "sync_us": j["sync"]["lat_ns"]["mean"] / 1e3}


def set_mode(members, jn, cur, mode):
    if cur == mode:
        return
    if cur != "none":
        run([URAID, "journal", "remove", *members, jn])
    if mode != "none":
        run([URAID, "journal", "add", "--force", "--journal", jn, "--mode", mode, *members])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--size", default="512M", help="each member file")
    ap.add_argument("--journal-size", default="256M")
    ap.add_argument("--dir", default="/var/tmp/uraid-journal-bench", help="members (disk)")
    ap.add_argument("--jdir", default="/dev/shm/uraid-journal-bench", help="journal (fast)")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    for d in (a.dir, a.jdir):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    members = [os.path.join(a.dir, f"m{i}") for i in range(6)]
    jn = os.path.join(a.jdir, "jn")
    run(["truncate", "-s", a.journal_size, jn])
    run([URAID, "create", "--level", "6", "--size", a.size, "-N", "jb", "--force"] + members)
    run([URAID, "bench", "--precondition", "--runtime", "0.1", "--allow-writes"] + members)
    vol = int(json.loads(run([URAID, "examine", "--json", members[0]]))["volume_size"])
    res = {m: {"qd1-sync": [], "qd32-sync": [], "qd32": []} for m in MODES}
    cur = "none"
    for r in range(a.runs):
        order = MODES[r % 3:] + MODES[:r % 3]
        for mode in order:
            set_mode(members, jn, cur, mode)
            cur = mode
            paths = members + ([jn] if mode != "none" else [])
            s = uraid_serve(a.dir, paths, "jb", control=False).start()
            try:
                res[mode]["qd1-sync"].append(fio_nbd(s.uri, 1, True, a.seconds, vol))
                res[mode]["qd32-sync"].append(fio_nbd(s.uri, 32, True, a.seconds, vol))
                res[mode]["qd32"].append(fio_nbd(s.uri, 32, False, a.seconds, vol))
            finally:
                s.stop(timeout=120, check=True)
    # Raw context on a scratch file beside the members (same disk).
    scratch = os.path.join(a.dir, "scratch")
    run(["truncate", "-s", "300M", scratch])
    raws = [fio_raw(scratch, a.seconds) for _ in range(a.runs)]
    med = lambda xs: statistics.median(xs)
    m = lambda mode, test, k: med([x[k] for x in res[mode][test]])
    out = []
    w = out.append
    w("## Journal device: sync writes")
    w("")
    w(f"Command: `python3 scripts/bench_journal.py --runs {a.runs} --seconds {a.seconds} "
      f"--size {a.size}` (release build; the script's docstring says what each row measures). "
      f"RAID6 4+2, chunk 64K, {a.size} member files on {'tmpfs' if is_tmpfs(a.dir) else 'the disk'} "
      f"({a.dir}), journal {a.journal_size} on {'tmpfs' if is_tmpfs(a.jdir) else 'the disk'} "
      f"({a.jdir}); the same members in every mode, modes rotated each run; {a.runs} runs of "
      f"{a.seconds} s per cell, medians.")
    w("")
    w(f"Raw context, one file on the members' disk (fio io_uring O_DIRECT, 4k random write + "
      f"fdatasync, QD1): write {med([x['write_us'] for x in raws]):.0f} µs + fdatasync "
      f"{med([x['sync_us'] for x in raws]):.0f} µs.")
    w("")
    w("| workload | no journal | write-through | write-back | write-back / none |")
    w("|---|---:|---:|---:|---:|")
    row = lambda name, vals, ratio, fmt: w(
        f"| {name} | " + " | ".join(fmt(v) for v in vals) + f" | {ratio:.2f} |")
    us = lambda v: f"{v:,.0f} µs"
    iops = lambda v: f"{v:,.0f} IOPS"
    v = [m(x, "qd1-sync", "op_us") for x in MODES]
    row("4k write + FLUSH, QD1: mean per operation", v, v[2] / v[0], us)
    v = [m(x, "qd1-sync", "write_us") for x in MODES]
    row("  of which the write", v, v[2] / v[0], us)
    v = [m(x, "qd1-sync", "sync_us") for x in MODES]
    row("  of which the FLUSH", v, v[2] / v[0], us)
    v = [m(x, "qd1-sync", "sync_p99_us") for x in MODES]
    row("  FLUSH p99", v, v[2] / max(v[0], 1e-9), us)
    v = [m(x, "qd32-sync", "iops") for x in MODES]
    row("4k write + FLUSH, 32 clients: IOPS", v, v[2] / v[0], iops)
    v = [m(x, "qd32", "iops") for x in MODES]
    row("4k write, 32 clients, no FLUSH: IOPS", v, v[2] / v[0], iops)
    w("")
    qd1 = {mode: [x["op_us"] for x in res[mode]["qd1-sync"]] for mode in MODES}
    sp = ", ".join(f"{mode} {(spread(qd1[mode]) if qd1[mode] else 0) * 100:.0f}%" for mode in MODES)
    w(f"Run-to-run spread of the QD1 operation time ((max - min) / median): {sp}.")
    w("")
    with open(os.path.join(a.dir, "results.json"), "w") as f:
        json.dump({"modes": res, "raw": raws}, f, indent=1)
    write_report(a.out, "\n".join(out) + "\n")
    shutil.rmtree(a.jdir, ignore_errors=True)


if __name__ == "__main__":
    main()
