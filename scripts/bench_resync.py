#!/usr/bin/env python3
"""Resync after an unclean stop: its rate on an idle array against what the member files do
raw, and client I/O while it runs (issue 10's report; docs/benchmarks.md).

RAID6 8+2 over /dev/shm member files, written end to end (`uraid bench --precondition`). A
run dirties every write-intent bitmap region (a 4 KiB write into each through NBD, then
SIGKILL: a crash with writes everywhere), restarts `uraid serve` and:
  idle    resync with no client: time from start to "finished" (the server's own event),
          member bytes it read per second (stripes x members x chunk / time);
  load    another dirty restart with fio (nbd engine, one connection) running 4k random
          reads, then 4k random writes, QD32, during resync at the default limits, then the
          same fio on the same server after resync finished: client IOPS during / after,
          and the resync rate the throttle let through meanwhile.
The members raw, same files, all at once (fio, io_uring, O_DIRECT, one job per member):
sequential reads at resync's I/O size (one chunk, 8 in flight per member: its batch) and
sequential 1M writes. Runs alternate; medians.

    scripts/bench_resync.py [--runs 3] [--size 1G] [--load-seconds 8] [--out -]
"""
import argparse, json, os, shutil, statistics, sys, time

from benchlib import URAID, events, fio_json, run, status, uraid_serve, write_report

CHUNK = 64 << 10
MEMBERS = 10


def serve(d, members, extra=()):
    """`uraid serve` of the array ("res") on D/nbd.sock with its control socket at D/ctl.sock,
    started; stop it with `.stop(timeout=120, check=True)`."""
    return uraid_serve(d, members, "res", extra).start()


def dirty_everything(d, members, volume, region_volume_bytes):
    """Writes 4 KiB into every bitmap region, then SIGKILL: every region dirty."""
    s = serve(d, members)
    cmds = []
    for off in range(0, volume, region_volume_bytes):
        cmds += ["-c", f"write -P 0x5a {off} 4k"]
    run(["qemu-io", "-f", "raw", *cmds, s.uri])
    st = status(s.ctl)
    assert st["bitmap"]["dirty_regions"] == st["bitmap"]["regions"], st["bitmap"]
    s.kill()


def wait_resync(s, timeout=600):
    while time.monotonic() - s.t0 < timeout:
        st = status(s.ctl)
        if not st["background"]:
            for e in events(s.ctl):
                if "resync finished in" in e["message"]:
                    return float(e["message"].split("resync finished in ")[1].split(" s")[0])
            raise RuntimeError("resync done but no 'finished' event")
        time.sleep(0.02)
    raise RuntimeError("resync did not finish")


def fio_nbd(uri, rw, seconds):
    j = fio_json(["fio", "--name=c", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k",
                  "--iodepth=32", "--size=2000m", "--norandommap", "--randrepeat=0",
                  f"--runtime={seconds}", "--time_based", "--output-format=json"])["jobs"][0]
    return (j["read"] if rw == "randread" else j["write"])["iops"]


def fio_members(members, rw, bs, qd, size):
    cmd = ["fio", "--ioengine=io_uring", "--direct=1", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", f"--size={size}", "--group_reporting", "--output-format=json"]
    for i, m in enumerate(members):
        cmd += [f"--name=m{i}", f"--filename={m}", "--offset=1m"]
    j = fio_json(cmd)["jobs"][0]
    return (j["read"] if rw == "read" else j["write"])["bw_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", default="1G", help="each member file")
    ap.add_argument("--load-seconds", type=int, default=8)
    ap.add_argument("--dir", default="/dev/shm/uraid-resync")
    ap.add_argument("--out", default="-")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    members = [os.path.join(a.dir, f"m{i}") for i in range(MEMBERS)]
    run([URAID, "create", "--level", "6", "--size", a.size, "-N", "res", "--force"] + members)
    run([URAID, "bench", "--precondition", "--runtime", "0.1", "--allow-writes"] + members)
    sb = json.loads(run([URAID, "examine", "--json", members[0]]))
    volume, member_data, bc = sb["volume_size"], sb["member_data"], sb["bitmap_chunk"]
    region_volume = bc * (MEMBERS - 2)
    stripes = member_data // CHUNK
    resync_bytes = stripes * MEMBERS * CHUNK
    raw_span = f"{(member_data >> 20) - 1}m"
    res = {k: [] for k in ("raw_read", "raw_write", "idle_s", "ioload_r", "ioafter_r",
                           "rate_r", "ioload_w", "ioafter_w", "rate_w")}
    for r in range(a.runs):
        res["raw_read"].append(fio_members(members, "read", f"{CHUNK >> 10}k", 8, raw_span))
        res["raw_write"].append(fio_members(members, "write", "1m", 8, raw_span))
        # fio's raw writes scribbled over the data areas: precondition again so parity holds.
        run([URAID, "bench", "--precondition", "--runtime", "0.1", "--allow-writes"] + members)
        dirty_everything(a.dir, members, volume, region_volume)
        s = serve(a.dir, members)
        res["idle_s"].append(wait_resync(s))
        s.stop(timeout=120, check=True)
        for rw, key in (("randread", "r"), ("randwrite", "w")):
            dirty_everything(a.dir, members, volume, region_volume)
            # Idle rate capped so that resync is still running when fio starts; while fio
            # runs the throttle applies --resync-min (default 50 MiB/s).
            s = serve(a.dir, members, ["--resync-max", "200"])
            d0, t0 = status(s.ctl)["background"][0]["done"], time.monotonic()
            during = fio_nbd(s.uri, rw, a.load_seconds)
            bg, t1 = status(s.ctl)["background"], time.monotonic()
            assert bg and bg[0]["state"] == "running", "resync ended before the client did"
            # Member bytes resync read per second while the client ran.
            res[f"rate_{key}"].append((bg[0]["done"] - d0) * MEMBERS * CHUNK / (t1 - t0))
            res[f"ioload_{key}"].append(during)
            s.stop(timeout=120, check=True)
            # The same client on the same array once resync has finished.
            s = serve(a.dir, members)
            wait_resync(s)
            res[f"ioafter_{key}"].append(fio_nbd(s.uri, rw, a.load_seconds))
            s.stop(timeout=120, check=True)
        print(f"run {r}: " + ", ".join(f"{k} {v[-1]:.4g}" for k, v in res.items()), file=sys.stderr)
    shutil.rmtree(a.dir, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    idle_rate = resync_bytes / med["idle_s"]
    gb = lambda b: f"{b / 1e9:.2f} GB/s"
    out = [
        f"RAID6 8+2, chunk 64K, {a.size} member files on /dev/shm, preconditioned; every bitmap "
        f"region dirty (4 KiB written into each, then SIGKILL); {a.runs} runs, medians. Resync "
        f"reads {resync_bytes / 1e9:.2f} GB of members (every chunk of {stripes} stripes).\n",
        "| measure | value | ratio |",
        "|---|---:|---:|",
        f"| members raw, sequential {CHUNK >> 10}K reads, QD8 each, all at once | {gb(med['raw_read'])} | |",
        f"| members raw, sequential 1M writes, QD8 each, all at once | {gb(med['raw_write'])} | |",
        f"| resync, idle: member bytes read per second | {gb(idle_rate)} | "
        f"{idle_rate / med['raw_read']:.2f} of raw reads, {idle_rate / med['raw_write']:.2f} of raw writes |",
        f"| client 4k randread QD32 during resync / after | {med['ioload_r']:,.0f} / {med['ioafter_r']:,.0f} IOPS "
        f"| {med['ioload_r'] / med['ioafter_r']:.2f} |",
        f"| resync rate meanwhile (`--resync-min 50`: 52 MB/s) | {med['rate_r'] / 1e6:.0f} MB/s | |",
        f"| client 4k randwrite QD32 during resync / after | {med['ioload_w']:,.0f} / {med['ioafter_w']:,.0f} IOPS "
        f"| {med['ioload_w'] / med['ioafter_w']:.2f} |",
        f"| resync rate meanwhile (`--resync-min 50`: 52 MB/s) | {med['rate_w'] / 1e6:.0f} MB/s | |",
    ]
    write_report(a.out, "\n".join(out) + "\n")


if __name__ == "__main__":
    main()
