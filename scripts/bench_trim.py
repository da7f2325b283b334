#!/usr/bin/env python3
"""TRIM passed down to the members: the member space a trim returns, and what trims cost the
writes running beside them. uraid serve (RAID6 8+2 over 10 /dev/shm files, chunk 64 KiB) with
`--discard on` (the default) and `--discard off`, on a Unix socket; fio's nbd engine.

1. Space: the volume written end to end, then trimmed whole (qemu-io `discard`, which the
   server runs in 1 GiB slices); member bytes allocated (st_blocks) before and after, and the
   trim's wall time.
2. Cost on concurrent writes: fio job `writer` (4k random writes, QD16, first half of the
   volume) alone, and beside job `trimmer` (rw=trimwrite bs=1m QD1 on the second half: each
   1 MiB trimmed, then written again: holes punched and filled back), with discards on and off.
   The writer's IOPS and the trimmer's MB/s; runs alternate between the three cells.

    scripts/bench_trim.py [--runs 3] [--runtime 10] [--member-size 256m] [--dir /dev/shm/uraid-trim]
                          [--out -] [--uraid target/release/uraid]
"""
import argparse, os, shutil, statistics, sys, time

from benchlib import MIB, URAID, cpu_model, cpu_ticks, fio_json, run, size_bytes, spread, uraid_serve, write_report

MEMBERS = 10


def allocated(files):
    return sum(os.stat(f).st_blocks * 512 for f in files)


def fio(uri, jobs, runtime):
    """fio (nbd engine) with `jobs` [(name, rw, bs, qd, offset, size)] in parallel; {name: job}."""
    cmd = ["fio", "--output-format=json", "--ioengine=nbd", f"--uri={uri}", "--direct=1",
           "--time_based", f"--runtime={runtime}", "--group_reporting=0"]
    for name, rw, bs, qd, off, size in jobs:
        cmd += [f"--name={name}", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
                f"--offset={off}", f"--size={size}", "--randrepeat=0"]
    return {j["jobname"]: j for j in fio_json(cmd)["jobs"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--member-size", default="256m")
    ap.add_argument("--dir", default="/dev/shm/uraid-trim")
    ap.add_argument("--out", default="-")
    ap.add_argument("--uraid", default=URAID)
    a = ap.parse_args()
    t0 = time.time()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    files = [os.path.join(a.dir, f"m{i}") for i in range(MEMBERS)]
    msize = size_bytes(a.member_size)
    run([a.uraid, "create", "--level", "6", "--chunk", "64K", "--name", "trim", "--force",
         "--size", str(msize), *files])
    servers = {mode: uraid_serve(a.dir, files, "trim", extra=[f"--discard={mode}"], binary=a.uraid)
               for mode in ("on", "off")}
    cmds, space, cells = [], {}, {}
    try:
        for mode in ("on", "off"):
            s = servers[mode].start()
            vol = int(run(["nbdinfo", "--size", s.uri]).strip())
            w = ["fio", "--output-format=json", "--ioengine=nbd", f"--uri={s.uri}", "--name=fill",
                 "--rw=write", "--bs=1m", "--iodepth=8", f"--size={vol}"]
            fio_json(w)
            full = allocated(files)
            t = time.time()
            q = ["qemu-io", "-f", "raw", "-c", f"discard 0 {vol}", s.uri]
            run(q)
            secs = time.time() - t
            space[mode] = (vol, full, allocated(files), secs)
            cmds += [" ".join(w), " ".join(q)] if mode == "on" else []
            s.stop(check=True)
        half = vol // 2
        writer = ("writer", "randwrite", "4k", 16, 0, half)
        trimmer = ("trimmer", "trimwrite", "1m", 1, half, half)
        plan = [("writes alone", "on", [writer]), ("writes + trims, discard on", "on", [writer, trimmer]),
                ("writes + trims, discard off", "off", [writer, trimmer])]
        for r in range(a.runs):
            for name, mode, jobs in plan:
                s = servers[mode].start()
                # Every run starts from a volume written end to end.
                fio_json(["fio", "--output-format=json", "--ioengine=nbd", f"--uri={s.uri}",
                          "--name=fill", "--rw=write", "--bs=1m", "--iodepth=8", f"--size={vol}"])
                c0 = cpu_ticks(s.pid)
                out = fio(s.uri, jobs, a.runtime)
                cpu = cpu_ticks(s.pid) - c0
                st = s.stop(check=True)
                del st
                wr = out["writer"]["write"]["iops"]
                tr = out.get("trimmer")
                tmb = (tr["trim"]["bw_bytes"] + tr["write"]["bw_bytes"]) / MIB if tr else None
                cells.setdefault(name, []).append((wr, tmb, cpu))
                print(f"run {r + 1} {name}: writer {wr:.0f} IOPS"
                      + (f", trimmer {tmb:.0f} MiB/s (trim+write)" if tmb is not None else "")
                      + f", server CPU {cpu} ticks", file=sys.stderr)
        cmds.append("fio --ioengine=nbd --direct=1 --time_based --runtime=%d --name=writer --rw=randwrite "
                    "--bs=4k --iodepth=16 --offset=0 --size=%d [--name=trimmer --rw=trimwrite --bs=1m "
                    "--iodepth=1 --offset=%d --size=%d]" % (a.runtime, half, half, half))
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(a.dir, ignore_errors=True)

    md = ["## TRIM passed down to the members", "",
          f"CPU: {cpu_model()}, {os.cpu_count()} cores; kernel {os.uname().release}; "
          f"`scripts/bench_trim.py --runs {a.runs} --runtime {a.runtime}` "
          f"({time.time() - t0:.0f} s). RAID6 8+2, chunk 64 KiB, {MEMBERS} member files of "
          f"{msize // MIB} MiB on /dev/shm (tmpfs: a hole punch there is a page-cache operation, "
          "cheaper than a discard on an SSD); uraid serve on a Unix socket.", "",
          "Member space returned by a trim of the whole volume (written end to end first):", "",
          "| `--discard` | volume | members allocated before | after | returned | trim time |",
          "|---|---|---|---|---|---|"]
    for mode in ("on", "off"):
        vol, full, after, secs = space[mode]
        md.append(f"| {mode} | {vol / MIB:.0f} MiB | {full / MIB:.0f} MiB | {after / MIB:.0f} MiB | "
                  f"{(full - after) / MIB:.0f} MiB | {secs:.2f} s |")
    md += ["", f"4k random writes (QD16, first half) beside 1 MiB trim-then-write (QD1, second half), "
           f"{a.runtime} s per run, median of {a.runs} (spread = (max-min)/median):", "",
           "| cell | writer IOPS | vs alone | trimmer MiB/s | server CPU s/run |", "|---|---|---|---|---|"]
    alone = statistics.median(v[0] for v in cells["writes alone"])
    for name, _, _ in plan:
        v = cells[name]
        wr = statistics.median(x[0] for x in v)
        tm = [x[1] for x in v if x[1] is not None]
        cpu = statistics.median(x[2] for x in v) / os.sysconf("SC_CLK_TCK")
        md.append(f"| {name} | {wr:.0f} (spread {spread([x[0] for x in v]):.0%}) | {wr / alone:.2f}× | "
                  + (f"{statistics.median(tm):.0f}" if tm else "–") + f" | {cpu:.2f} |")
    md += ["", "Per run (writer IOPS / trimmer MiB/s):", ""]
    for name, _, _ in plan:
        md.append(f"- {name}: " + ", ".join(
            f"{x[0]:.0f}" + (f" / {x[1]:.0f}" if x[1] is not None else "") for x in cells[name]))
    md += ["", "Commands:", "", "```sh", *cmds, "```", ""]
    write_report(a.out, "\n".join(md))


if __name__ == "__main__":
    main()
