#!/usr/bin/env python3
"""NBD servers side by side: uraid serve (raid0 over 4 /dev/shm files, raid6 8+2) against
nbdkit (file plugin) and qemu-nbd (cache=none, aio=native) each serving one /dev/shm file of
the same size. Same fio job for all (ioengine=nbd, one connection), over a Unix socket and
TCP loopback; every device preconditioned (written end to end) first. For each cell: IOPS or
MB/s and the server's CPU time per request (utime+stime from /proc/PID/stat around the run,
divided by the requests fio completed). Runs alternate between servers; medians are reported.

    scripts/bench_nbd.py [--set throughput|qd1|cpu|seqwrite] [--runs 3] [--runtime 4]
                         [--dir /dev/shm/uraid-nbd] [--out -] [--no-busy-poll-too]
                         [--no-merge-wait-too]

Sets: `throughput` (default) the four QD32/QD8 jobs; `qd1` 4k random read and write at queue
depth 1 with mean and p99 latency (issue 13's QD1 targets: uraid against nbdkit, RAID0, RAID1
and RAID6); `cpu` 4k random read at QD32 with the server's CPU per request (issue 13's CPU
target); `seqwrite` 128 KiB and 1 MiB sequential writes at QD8 on one connection and on two
(each streaming its own half), beside 4k random writes at QD32
and QD1 (issue 26's write-merging targets), with each uraid array's stripe operations
(full-stripe, reconstruct, read-modify-write, plugged) counted over the run.
`--no-merge-wait-too` adds each uraid array with `--merge-wait 0` (write plugging's A/B).
"""
import argparse, json, os, shutil, statistics, sys

from benchlib import TICK, URAID, Server, cpu_ticks, fio_json, free_port, run, write_report
MEMBER_MIB = 512  # raid0 members; raid6 members hold the same volume in 8 data shares
FIO_SIZE = "2000m"

SETS = {
    "throughput": [
        ("4k randread QD32", "randread", "4k", 32, "iops"),
        ("4k randwrite QD32", "randwrite", "4k", 32, "iops"),
        ("1M seq read QD8", "read", "1m", 8, "mbps"),
        ("1M seq write QD8", "write", "1m", 8, "mbps"),
    ],
    "qd1": [
        ("4k randread QD1", "randread", "4k", 1, "lat"),
        ("4k randwrite QD1", "randwrite", "4k", 1, "lat"),
    ],
    "cpu": [
        ("4k randread QD32", "randread", "4k", 32, "iops"),
    ],
    "seqwrite": [
        ("128k seq write QD8", "write", "128k", 8, "mbps"),
        ("1M seq write QD8", "write", "1m", 8, "mbps"),
        # Two connections, each streaming its own half (the PTS suite's throughput load).
        ("128k seq write 2x QD8", "write", "128k", "2x8", "mbps"),
        ("1M seq write 2x QD8", "write", "1m", "2x8", "mbps"),
        ("4k randwrite QD32", "randwrite", "4k", 32, "iops"),
        ("4k randwrite QD1", "randwrite", "4k", 1, "lat"),
    ],
}


UNITS = {"iops": "IOPS", "mbps": "MB/s", "lat": "us mean"}


class Peer:
    """One server compared, started over a Unix socket or TCP loopback for each run."""

    def __init__(self, name, argv_unix, argv_tcp, uri_unix, uri_tcp, sock, port, ctl=None):
        self.name = name
        self.ctl = ctl  # uraid's control socket (stripe operation counts)
        self.server = {"unix": Server(argv_unix, sock=sock), "tcp": Server(argv_tcp, port=port)}
        self.uri = {"unix": uri_unix, "tcp": uri_tcp}
        self.proc = None

    def start(self, transport):
        self.proc = self.server[transport].start()

    def stop(self):
        self.proc.stop(timeout=30)


def fio(uri, rw, bs, qd, runtime, extra=()):
    jobs = []
    if isinstance(qd, str):  # "JOBSxQD": that many connections, each on its own part
        n, qd = (int(x) for x in qd.split("x"))
        part = int(FIO_SIZE.rstrip("m")) // n
        jobs = [f"--numjobs={n}", f"--offset_increment={part}m", "--group_reporting"]
    size = f"{part}m" if jobs else FIO_SIZE
    cmd = ["fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}",
           f"--iodepth={qd}", f"--size={size}", "--output-format=json", "--norandommap",
           "--randrepeat=0"] + jobs + list(extra)
    if runtime:
        cmd += [f"--runtime={runtime}", "--time_based"]
    j = fio_json(cmd)["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    pct = side.get("clat_ns", {}).get("percentile", {})
    lat = (side["lat_ns"]["mean"] / 1000, pct.get("99.000000", 0) / 1000)
    return side["iops"], side["bw_bytes"] / 1e6, side["total_ios"], lat


def stripe_ops(s):
    """A uraid server's stripe operation counters (`/status`), or None for a peer."""
    if not s.ctl:
        return None
    ctl, members = s.ctl
    out = run([URAID, "status", "--control", f"unix:{ctl}", "--json"] + members)
    ops = json.loads(out)["stripe_operations"]
    keep = ("full", "reconstruct", "read_modify_write", "merged", "plugged", "plug_filled")
    return {k: ops.get(k, 0) for k in keep}


def seqwrite_ratios(servers, workloads, results, opcounts, transport):
    """Each uraid cell against nbdkit's (higher is better for MB/s and IOPS, lower for
    latency), with the median stripe operations of its runs."""
    lines = ["| workload | server | / nbdkit | full | reconstruct | read-modify-write | plugged (filled) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for wl, _, _, _, metric in workloads:
        ref = statistics.median(x[0] for x in results[("nbdkit file", transport, wl)])
        for s in servers:
            if not s.name.startswith("uraid"):
                continue
            v = statistics.median(x[0] for x in results[(s.name, transport, wl)])
            oc = opcounts.get((s.name, transport, wl), {})
            med = lambda k: f"{statistics.median(oc[k]):.0f}" if k in oc else "-"
            lines.append(f"| {wl} | {s.name} | {v / ref:.2f}× | {med('full')} | {med('reconstruct')} | "
                         f"{med('read_modify_write')} | {med('plugged')} ({med('plug_filled')}) |")
    lines.append("")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=sorted(SETS), default="throughput")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runtime", type=float, default=4)
    ap.add_argument("--dir", default="/dev/shm/uraid-nbd")
    ap.add_argument("--out", default="-")
    ap.add_argument("--no-busy-poll-too", action="store_true",
                    help="also run each uraid array with --busy-poll 0 (the busy-poll's A/B)")
    ap.add_argument("--no-merge-wait-too", action="store_true",
                    help="also run each uraid array with --merge-wait 0 (write plugging's A/B)")
    a = ap.parse_args()
    workloads = SETS[a.set]
    for tool in ("fio", "nbdkit", "qemu-nbd"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: run scripts/setup.sh")
    d = a.dir
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sockdir = os.path.join("/tmp", f"uraid-nbd-bench-{os.getpid()}")
    os.makedirs(sockdir, exist_ok=True)

    # Devices.
    r0 = [os.path.join(d, f"r0-{i}") for i in range(4)]
    r6 = [os.path.join(d, f"r6-{i}") for i in range(10)]
    r1 = [os.path.join(d, f"r1-{i}") for i in range(2)]
    run([URAID, "create", "--level", "0", "-N", "r0", "--size", f"{MEMBER_MIB}M"] + r0)
    run([URAID, "create", "--level", "6", "-N", "r6", "--size", f"{MEMBER_MIB // 2 + 1}M"] + r6)
    arrays = [("uraid raid0 4", r0), ("uraid raid6 8+2", r6)]
    if a.set == "qd1":  # the QD1 write target names RAID1 too
        run([URAID, "create", "--level", "1", "-N", "r1", "--size", f"{4 * MEMBER_MIB}M"] + r1)
        arrays.insert(1, ("uraid raid1 2", r1))
    peer = os.path.join(d, "peer.img")
    with open(peer, "wb") as f:
        f.truncate(4 * (MEMBER_MIB - 1) << 20)

    servers = []
    variants = [("", [])]
    if a.no_busy_poll_too:
        variants.append((", no busy-poll", ["--busy-poll", "0"]))
    if a.no_merge_wait_too:
        variants.append((", no merge-wait", ["--merge-wait", "0"]))
    for name, members in arrays:
        for vi, (suffix, extra) in enumerate(variants):
            tag = f"{name.split()[1]}-{vi}"
            sock, port = os.path.join(sockdir, tag + ".sock"), free_port()
            ctl = os.path.join(sockdir, tag + ".ctl")
            base = [URAID, "serve", "--export", "v", "--control", f"unix:{ctl}"] + extra
            servers.append(Peer(name + suffix, base + ["--listen", f"unix:{sock}"] + members,
                                  base + ["--listen", f"tcp:127.0.0.1:{port}"] + members,
                                  f"nbd+unix:///v?socket={sock}", f"nbd://127.0.0.1:{port}/v", sock, port,
                                  ctl=(ctl, members)))
    sock, port = os.path.join(sockdir, "nbdkit.sock"), free_port()
    servers.append(Peer("nbdkit file", ["nbdkit", "-f", "-U", sock, "file", peer],
                          ["nbdkit", "-f", "-i", "127.0.0.1", "-p", str(port), "file", peer],
                          f"nbd+unix:///?socket={sock}", f"nbd://127.0.0.1:{port}/", sock, port))
    sock, port = os.path.join(sockdir, "qemu.sock"), free_port()
    q = ["qemu-nbd", "-f", "raw", "--cache=none", "--aio=native", "-t", "-e", "16"]
    servers.append(Peer("qemu-nbd", q + ["-k", sock, peer],
                          q + ["-b", "127.0.0.1", "-p", str(port), peer],
                          f"nbd+unix:///?socket={sock}", f"nbd://127.0.0.1:{port}/", sock, port))

    # Precondition: every device written end to end (1M sequential writes through the server).
    for s in servers[:-1]:  # qemu-nbd shares nbdkit's file
        if s.name.endswith(("no busy-poll", "no merge-wait")):  # same members as before it
            continue
        s.start("unix")
        fio(s.uri["unix"], "write", "1m", 8, 0, ["--size=100%"])
        s.stop()
        print(f"preconditioned {s.name}", file=sys.stderr)

    results = {}  # (server, transport, workload) -> list of (value, cpu_us_per_req)
    opcounts = {}  # (server, transport, workload) -> {plan: [count per run]}
    for transport in ("unix", "tcp"):
        for r in range(a.runs):
            for s in servers:
                s.start(transport)
                for wl, rw, bs, qd, metric in workloads:
                    ops0 = stripe_ops(s)
                    t0 = cpu_ticks(s.proc.pid)
                    iops, mbps, ios, lat = fio(s.uri[transport], rw, bs, qd, a.runtime)
                    t1 = cpu_ticks(s.proc.pid)
                    ops1 = stripe_ops(s) if ops0 is not None else None
                    cpu_us = (t1 - t0) / TICK * 1e6 / max(ios, 1)
                    val = {"iops": iops, "mbps": mbps, "lat": lat[0]}[metric]
                    results.setdefault((s.name, transport, wl), []).append(
                        (val, cpu_us, lat[1]))
                    print(f"{transport} run {r + 1} {s.name:16} {wl:18} {val:10.1f} "
                          f"{UNITS[metric]}  p99 {lat[1]:7.1f} us  {cpu_us:6.2f} us/req",
                          file=sys.stderr)
                    if ops1 is not None:
                        d = {k: ops1[k] - ops0.get(k, 0) for k in ops1}
                        for k, v in d.items():
                            opcounts.setdefault((s.name, transport, wl), {}).setdefault(k, []).append(v)
                        print("    stripe operations: " + ", ".join(f"{k} {v}" for k, v in d.items() if v),
                              file=sys.stderr)
                s.stop()

    lines = []
    lines.append(f"Set `{a.set}`. Medians of {a.runs} runs of {a.runtime:g} s each, servers alternated; "
                 f"fio {run(['fio', '--version']).strip()}, ioengine=nbd, one connection, "
                 f"size={FIO_SIZE}. CPU = server utime+stime per completed request; latency = fio's "
                 f"lat mean and clat p99.")
    lines.append("")
    for transport in ("unix", "tcp"):
        lines.append(f"**{'Unix socket' if transport == 'unix' else 'TCP loopback'}**")
        lines.append("")
        lines.append("| workload | " + " | ".join(s.name for s in servers) + " |")
        lines.append("|---|" + "---:|" * len(servers))
        for wl, _, _, _, metric in workloads:
            cells = []
            for s in servers:
                rs = results[(s.name, transport, wl)]
                v = statistics.median(x[0] for x in rs)
                c = statistics.median(x[1] for x in rs)
                if metric == "lat":
                    p99 = statistics.median(x[2] for x in rs)
                    cells.append(f"{v:.1f} µs, p99 {p99:.1f} µs")
                elif metric == "iops":
                    cells.append(f"{v / 1000:.0f}k IOPS, {c:.2f} µs CPU")
                else:
                    cells.append(f"{v:.0f} MB/s, {c:.1f} µs CPU")
            lines.append(f"| {wl} | " + " | ".join(cells) + " |")
        lines.append("")
        if a.set == "throughput":
            continue
        if a.set == "seqwrite":
            lines.extend(seqwrite_ratios(servers, workloads, results, opcounts, transport))
            continue
        # Ratios against nbdkit, the reference peer.
        lines.append("| workload | server | " + ("mean / nbdkit | p99 / nbdkit" if a.set == "qd1"
                                                  else "CPU per request / nbdkit") + " |")
        lines.append("|---|---|---:|" + ("---:|" if a.set == "qd1" else ""))
        for wl, _, _, _, metric in workloads:
            ref = results[("nbdkit file", transport, wl)]
            for s in servers:
                if not s.name.startswith("uraid"):
                    continue
                rs = results[(s.name, transport, wl)]
                if a.set == "qd1":
                    m = statistics.median(x[0] for x in rs) / statistics.median(x[0] for x in ref)
                    p = statistics.median(x[2] for x in rs) / statistics.median(x[2] for x in ref)
                    lines.append(f"| {wl} | {s.name} | {m:.2f}× | {p:.2f}× |")
                else:
                    c = statistics.median(x[1] for x in rs) / statistics.median(x[1] for x in ref)
                    lines.append(f"| {wl} | {s.name} | {c:.2f}× |")
        lines.append("")
    json_out = {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in results.items()}
    write_report(a.out, "\n".join(lines) + "\n")
    if a.out != "-":
        with open(a.out + ".json", "w") as f:
            json.dump(json_out, f, indent=1)
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(sockdir, ignore_errors=True)


if __name__ == "__main__":
    main()
