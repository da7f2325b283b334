#!/usr/bin/env python3
"""Rebuild and scrub: their rates on an idle array against what fio does with the same member
reads and writes, and client reads during a rebuild against the same array degraded without
one (issue 12's report; docs/benchmarks.md).

RAID6 8+2 over /dev/shm member files, written end to end (`uraid bench --precondition`). A
run:
  raw      fio (io_uring, O_DIRECT) doing the rebuild's member I/O by itself: sequential
           chunk-sized reads of the 9 surviving member files (QD8 each, the rebuild's batch)
           and sequential chunk-sized writes of a new file of a member's size, all at once;
  idle     member 3 failed and a new file added (`uraid fail`, `uraid add`, offline), then
           `uraid serve`: time from start to the server's "rebuild ... finished" event;
  degraded member 3 failed, no replacement: fio (nbd engine, one connection) 4k random reads
           QD32 for --load-seconds;
  load-*   a new member added, `uraid serve` with one of the throttles in LOADS (an in-flight
           budget of 1 or 2 stripes while clients are active with the pause of a priority,
           or md's `--resync-min 50`): the same fio while the rebuild runs, and how far the
           rebuild got meanwhile (counted from fio's start);
  scrub    `uraid scrub --wait` on the healthy array served, idle: member bytes read per
           second (the server's "scrub ... finished" event).
Runs repeat; medians. The client rows carry fio's p99 completion latency too. Then, once:
  half     the array created again and half its volume written (fio, nbd, 1M sequential),
           member 3 replaced as above and the idle rebuild timed (`--runs` times): the
           rebuild skips what holds no data (the allocation map), against `idle` above.

    scripts/bench_rebuild.py [--runs 3] [--size 1G] [--load-seconds 8] [--out -]
"""
import argparse, json, os, shutil, statistics, sys, time

from bench_resync import serve
from benchlib import URAID, events, fio_json, run, size_bytes, status, write_report

CHUNK = 64 << 10
# The throttles compared under client load: key, `uraid serve` flags, label.
LOADS = [
    ("load_b1", ["--background-budget", "1"],
     "`--background-budget 1`, priority normal: the default"),
    ("load_b2", ["--background-budget", "2"], "`--background-budget 2`, priority normal"),
    ("load_low", ["--background-budget", "2", "--priority", "low"],
     "`--background-budget 2 --priority low`"),
    ("load_md", ["--background-budget", "0"], "`--background-budget 0`: md's `--resync-min 50`"),
]
MEMBERS = 10
SLOT = 3


def raw_rebuild_io(survivors, new, span):
    """fio: the rebuild's reads and writes, all at once; seconds for all of it."""
    cmd = ["fio", "--ioengine=io_uring", "--direct=1", f"--bs={CHUNK >> 10}k", "--iodepth=8",
           f"--size={span}", "--offset=1m", "--output-format=json"]
    for i, m in enumerate(survivors):
        cmd += [f"--name=r{i}", "--rw=read", f"--filename={m}"]
    cmd += ["--name=w", "--rw=write", f"--filename={new}"]
    t0 = time.monotonic()
    run(cmd)
    return time.monotonic() - t0


def fio_nbd(uri, seconds):
    """fio's nbd engine, 4k random reads QD32: (IOPS, p99 completion latency in µs)."""
    j = fio_json(["fio", "--name=c", "--ioengine=nbd", f"--uri={uri}", "--rw=randread", "--bs=4k",
                  "--iodepth=32", "--size=2000m", "--norandommap", "--randrepeat=0",
                  f"--runtime={seconds}", "--time_based", "--output-format=json"])["jobs"][0]["read"]
    return j["iops"], j["clat_ns"]["percentile"]["99.000000"] / 1000


def finished_in(ctl, what, timeout=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for e in events(ctl):
            m = e["message"]
            if what in m and "finished in" in m:
                return float(m.split("finished in ")[1].split(" s")[0])
        time.sleep(0.02)
    raise RuntimeError(f"no '{what} ... finished' event")


def fresh_member(new, size):
    """An empty member file `new` of `size` bytes, after writing and deleting as much memory in
    its directory: on this VM a tmpfs page the guest never touched costs several times more to
    write first (the host backs it then), so a rebuild into a file on such pages ran 2-3x
    slower than one on pages freed earlier (1G members: 3.3-5.0 s against 1.0-1.5 s, in the
    same run). Pages just freed are the ones the kernel hands out next."""
    if os.path.exists(new):
        os.unlink(new)
    warm = new + ".warm"
    with open(warm, "wb") as f:
        for _ in range(-(-size // (1 << 20))):
            f.write(bytes(1 << 20))
    os.unlink(warm)
    with open(new, "wb") as f:
        f.truncate(size)


def replace(members, new, size):
    """Fails member SLOT offline and adds `new` (a fresh file) in its place."""
    fresh_member(new, size)
    run([URAID, "fail", str(SLOT), *members])
    run([URAID, "add", new, *members])
    out = list(members)
    out[SLOT] = new
    return out


def drop_unused_new(d, members):
    """Deletes the new member files of earlier rounds that are no longer members."""
    for m in os.listdir(d):
        p = os.path.join(d, m)
        if m.startswith("new") and p not in members:
            os.unlink(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="1G", help="each member file")
    ap.add_argument("--load-seconds", type=int, default=8)
    ap.add_argument("--dir", default="/dev/shm/uraid-rebuild")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    size = size_bytes(a.size)
    members = [os.path.join(a.dir, f"m{i}") for i in range(MEMBERS)]
    run([URAID, "create", "--level", "6", "--size", a.size, "-N", "res", "--force"] + members)
    run([URAID, "bench", "--precondition", "--runtime", "0.1", "--allow-writes"] + members)
    sb = json.loads(run([URAID, "examine", "--json", members[0]]))
    member_data = sb["member_data"]
    units = member_data // CHUNK
    span = f"{(member_data >> 20) - 1}m"
    scratch = os.path.join(a.dir, "scratch")
    res = {k: [] for k in ("raw_s", "idle_s", "degraded", "degraded_p99", "scrub_s")}
    for key, _, _ in LOADS:
        for suffix in ("", "_p99", "_units"):
            res[key + suffix] = []
    gen = 0
    for r in range(a.runs):
        survivors = [m for i, m in enumerate(members) if i != SLOT]
        fresh_member(scratch, size)
        res["raw_s"].append(raw_rebuild_io(survivors, scratch, span))
        os.unlink(scratch)
        # Idle rebuild.
        gen += 1
        members = replace(members, os.path.join(a.dir, f"new{gen}"), size)
        s = serve(a.dir, members)
        res["idle_s"].append(finished_in(s.ctl, "rebuild"))
        s.stop(timeout=120, check=True)
        # Degraded, no rebuild: the client's reads.
        run([URAID, "fail", str(SLOT), *members])
        s = serve(a.dir, members)
        iops, p99 = fio_nbd(s.uri, a.load_seconds)
        res["degraded"].append(iops)
        res["degraded_p99"].append(p99)
        s.stop(timeout=120, check=True)
        # A new member, rebuilding under the same client: the default throttle, then md's.
        for n, (key, extra, _) in enumerate(LOADS):
            if n > 0:
                run([URAID, "fail", str(SLOT), *members])
            gen += 1
            new = os.path.join(a.dir, f"new{gen}")
            fresh_member(new, size)
            run([URAID, "add", new, *members])
            members[SLOT] = new
            s = serve(a.dir, members, extra)
            rb0 = [b for b in status(s.ctl)["background"] if b["op"] == "rebuild"]
            d0 = rb0[0]["done"] if rb0 else 0
            t0 = time.monotonic()
            iops, p99 = fio_nbd(s.uri, a.load_seconds)
            res[key].append(iops)
            res[key + "_p99"].append(p99)
            t1 = time.monotonic()
            rb = [b for b in status(s.ctl)["background"] if b["op"] == "rebuild"]
            done = rb[0]["done"] if rb else units
            res[key + "_units"].append((done - d0) / (t1 - t0))
            finished_in(s.ctl, "rebuild")
            s.stop(timeout=120, check=True)
        # Scrub, idle, on the healthy array.
        s = serve(a.dir, members)
        run([URAID, "scrub", "--wait", f"--control=unix:{s.ctl}", *members])
        res["scrub_s"].append(finished_in(s.ctl, "scrub (check)"))
        s.stop(timeout=120, check=True)
        drop_unused_new(a.dir, members)
        print(f"run {r}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in res.items()), file=sys.stderr)
    # Half full: the array created again, half of its volume written, rebuilt idle.
    drop_unused_new(a.dir, [])
    members = [os.path.join(a.dir, f"m{i}") for i in range(MEMBERS)]
    run([URAID, "create", "--level", "6", "--size", a.size, "-N", "res", "--force"] + members)
    s = serve(a.dir, members)
    half = status(s.ctl)["volume_size"] // 2
    run(["fio", "--name=h", "--ioengine=nbd", f"--uri={s.uri}", "--rw=write", "--bs=1m",
         "--iodepth=8", f"--size={half}", "--output-format=json"])
    s.stop(timeout=120, check=True)
    res["half_s"] = []
    for r in range(a.runs):
        gen += 1
        members = replace(members, os.path.join(a.dir, f"new{gen}"), size)
        s = serve(a.dir, members)
        res["half_s"].append(finished_in(s.ctl, "rebuild"))
        s.stop(timeout=120, check=True)
        drop_unused_new(a.dir, members)
        print(f"half run {r}: {res['half_s'][-1]:.4g} s", file=sys.stderr)
    shutil.rmtree(a.dir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    idle_units = units / med["idle_s"]
    rebuilt = member_data / med["idle_s"]
    scrub_read = units * MEMBERS * CHUNK / med["scrub_s"]
    gb = lambda b: f"{b / 1e9:.2f} GB/s"
    out = [
        f"RAID6 8+2, chunk 64K, {a.size} member files on /dev/shm, preconditioned; member {SLOT} "
        f"replaced by a new file; {a.runs} runs, medians. A rebuild reads 9 members and writes "
        f"{member_data / 1e9:.2f} GB to the new one ({units} stripes).\n",
        "| measure | value | ratio |",
        "|---|---:|---:|",
        f"| fio doing the rebuild's member I/O (9 sequential {CHUNK >> 10}K readers, one writer, "
        f"QD8 each) | {med['raw_s']:.2f} s | |",
        f"| rebuild, idle | {med['idle_s']:.2f} s ({gb(rebuilt)} written to the new member) | "
        f"{med['raw_s'] / med['idle_s']:.2f} of fio's rate (goal 0.8) |",
        f"| client 4k randread QD32, degraded (no rebuild) | {med['degraded']:,.0f} IOPS, "
        f"p99 {med['degraded_p99']:,.0f} µs | |",
    ] + [
        row
        for key, _, label in LOADS
        for row in (
            f"| client 4k randread QD32, during the rebuild ({label}) | {med[key]:,.0f} IOPS, "
            f"p99 {med[key + '_p99']:,.0f} µs | {med[key] / med['degraded']:.2f} of degraded"
            f"{' (goal 0.7)' if 'default' in label else ''}; p99 "
            f"{med[key + '_p99'] / med['degraded_p99']:.2f}× |",
            f"| rebuild progress meanwhile | {med[key + '_units']:,.0f} stripes/s | "
            f"{med[key + '_units'] / idle_units:.2f} of its idle rate"
            f"{' (goal 0.1)' if 'default' in label else ''} |",
        )
    ] + [
        f"| scrub (check), idle: member bytes read per second | {gb(scrub_read)} | |",
        f"| rebuild, idle, array with half its volume written (created again; the rest never "
        f"written) | {med['half_s']:.2f} s | {med['half_s'] / med['idle_s']:.2f} of the full "
        f"array's time |",
    ]
    write_report(a.out, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
