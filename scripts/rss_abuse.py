#!/usr/bin/env python3
"""Peak RSS of `uraid serve` under abusive clients (docs/benchmarks.md, "Server memory").

Each scenario starts its own server (release build), drives it for a few seconds, reads the
server's peak resident set (VmHWM in /proc/PID/status) and then checks that nothing was lost
(every block written reads back). Scenarios:

  slow        RAID6 4+2 whose members sit behind nbdkit's delay filter (delay-write) and
              nbdfuse, a large write-back journal (a sparse file on disk), and clients
              writing 1 MiB blocks flat out: acknowledged writes pile up in memory until
              the members have them, up to --write-back-memory.
  noread      clients that pipeline large READs (32 MiB) or whole-volume BLOCK_STATUS
              requests and never read a reply until the server stops taking requests.
  conns       many connections (--conns) each writing and reading 128 KiB blocks at QD4.

The NBD client is written here over a Unix socket (no libnbd Python bindings needed).
Usage: python3 scripts/rss_abuse.py [--bin target/release/uraid] [--dir /tmp/uraid-rss]
       [--seconds 15] [--bound-mib 1024] [--conns 128] [--write-back-memory SIZE]
       [scenario ...]
"""

import argparse
import json
import os
import random
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

from benchlib import proc_bytes

MIB = 1 << 20
REQ_MAGIC, SIMPLE_MAGIC, STRUCT_MAGIC = 0x25609513, 0x67446698, 0x668E33EF
OPT_MAGIC, OPT_REPLY_MAGIC = 0x49484156454F5054, 0x3E889045565A9
CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_BLOCK_STATUS = 0, 1, 2, 3, 7


def recv_exact(s, n):
    b = bytearray()
    while len(b) < n:
        c = s.recv(min(n - len(b), 4 * MIB))
        if not c:
            raise EOFError("server closed the connection")
        b += c
    return bytes(b)


class Client:
    """Fixed newstyle, structured replies, base:allocation, export `name`."""

    def __init__(self, sock_path, name):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(sock_path)
        recv_exact(self.s, 18)
        self.s.sendall(struct.pack(">I", 3))
        self.opt(8, b"")
        q = b"base:allocation"
        self.opt(10, struct.pack(">I", len(name)) + name + struct.pack(">II", 1, len(q)) + q)
        self.opt(7, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))

    def opt(self, o, data):
        self.s.sendall(struct.pack(">QII", OPT_MAGIC, o, len(data)) + data)
        while True:
            _, _, typ, n = struct.unpack(">QIII", recv_exact(self.s, 20))
            d = recv_exact(self.s, n)
            if typ == 3 and d[:2] == b"\0\0":
                self.size = struct.unpack(">Q", d[2:10])[0]
            if typ == 1:
                return
            if typ & 0x80000000:
                raise RuntimeError(f"option {o} refused: {typ:#x}")

    def send(self, typ, handle, off, length, data=b""):
        self.s.sendall(struct.pack(">IHHQQI", REQ_MAGIC, 0, typ, handle, off, length) + data)

    def reply(self):
        """One whole reply: (handle, error, {offset: bytes} of read data)."""
        data, err = {}, 0
        while True:
            magic = struct.unpack(">I", recv_exact(self.s, 4))[0]
            if magic == SIMPLE_MAGIC:
                err, h = struct.unpack(">IQ", recv_exact(self.s, 12))
                return h, err, data
            assert magic == STRUCT_MAGIC, hex(magic)
            flags, typ, h, n = struct.unpack(">HHQI", recv_exact(self.s, 16))
            p = recv_exact(self.s, n)
            if typ == 1:
                data[struct.unpack(">Q", p[:8])[0]] = p[8:]
            elif typ == 2:
                off, ln = struct.unpack(">QI", p)
                data[off] = bytes(ln)
            elif typ & 0x8000:
                err = struct.unpack(">I", p[:4])[0]
            if flags & 1:
                return h, err, data

    def close(self):
        try:
            self.send(CMD_DISC, 0, 0, 0)
        finally:
            self.s.close()


def read_back(c, off, length, handle=1):
    c.send(CMD_READ, handle, off, length)
    h, err, data = c.reply()
    assert err == 0, f"read at {off}: error {err}"
    out = bytearray(length)
    for o, b in data.items():
        out[o - off:o - off + len(b)] = b
    return bytes(out)


def hwm_kib(pid):
    return proc_bytes(pid, "VmHWM") // 1024


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


class Env:
    def __init__(self, args, tag):
        self.args = args
        self.dir = os.path.join(args.dir, tag)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.procs, self.mounts, self.server = [], [], None
        ENVS.append(self)

    def slow_member(self, i, size, delay):
        """A member file behind nbdkit's delay filter, mounted back with nbdfuse."""
        d = os.path.join(self.dir, f"m{i}")
        os.makedirs(os.path.join(d, "mnt"))
        backing = os.path.join(d, "backing")
        with open(backing, "wb") as f:
            f.truncate(size)
        sock = os.path.join(d, "nbdkit.sock")
        self.procs.append(subprocess.Popen(
            ["nbdkit", "--exit-with-parent", "-f", "-U", sock, "--filter=delay", "file",
             backing, f"delay-write={delay}"], stderr=subprocess.DEVNULL))
        for _ in range(300):
            if os.path.exists(sock):
                break
            time.sleep(0.02)
        time.sleep(0.2)
        mnt = os.path.join(d, "mnt", "member")
        self.procs.append(subprocess.Popen(["nbdfuse", mnt, "--unix", sock],
                                           stderr=subprocess.DEVNULL))
        self.mounts.append(os.path.join(d, "mnt"))
        for _ in range(300):
            if os.path.exists(mnt) and os.path.getsize(mnt) == size:
                return mnt
            time.sleep(0.02)
        raise RuntimeError(f"nbdfuse did not mount {mnt}")

    def file_member(self, name, size):
        p = os.path.join(self.dir, name)
        with open(p, "wb") as f:
            f.truncate(size)
        return p

    def serve(self, members, extra=()):
        sock = os.path.join(self.dir, "nbd.sock")
        self.control = os.path.join(self.dir, "control.sock")
        log = open(os.path.join(self.dir, "serve.log"), "w")
        p = subprocess.Popen([self.args.bin, "serve", "--listen", f"unix:{sock}", "--control",
                              f"unix:{self.control}", *extra, *members], stdout=log, stderr=log)
        for _ in range(500):
            if os.path.exists(sock):
                break
            if p.poll() is not None:
                raise RuntimeError(open(log.name).read())
            time.sleep(0.02)
        time.sleep(0.2)
        self.server = p
        return sock

    def stop(self):
        """Stops the server (SIGINT, then SIGKILL after 120 s), unmounts, stops nbdkit."""
        if self.server is not None:
            self.server.send_signal(2)
            try:
                self.server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()
            self.server = None
        for m in self.mounts:
            subprocess.run(["fusermount3", "-u", m], capture_output=True)
        for p in self.procs:
            p.kill()
            p.wait()
        self.mounts, self.procs = [], []


ENVS = []


def status(control):
    """GET /status on the control socket, as JSON."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(control)
    s.sendall(b"GET /status HTTP/1.0\r\nHost: x\r\n\r\n")
    b = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        b += c
    s.close()
    return json.loads(b.split(b"\r\n\r\n", 1)[1])


def patterns(n=16):
    rnd = random.Random(7)
    return [rnd.randbytes(MIB) for _ in range(n)]


def writer(sock, name, region, blk, pats, deadline, last, qd=8):
    """Writes `blk`-byte blocks over `region` (first, count) round and round at QD `qd`."""
    c = Client(sock, name)
    first, count = region
    inflight, pas, i, h = {}, 0, 0, 0
    while True:
        while len(inflight) < qd and time.time() < deadline:
            b = first + i
            gen = (b + pas) % len(pats)
            c.send(CMD_WRITE, h, b * blk, blk, pats[gen][:blk])
            inflight[h] = (b, gen)
            h += 1
            i += 1
            if i == count:
                i, pas = 0, pas + 1
        if not inflight:
            break
        hh, err, _ = c.reply()
        b, gen = inflight.pop(hh)
        assert err == 0, f"write of block {b}: error {err}"
        last[b] = gen
    c.send(CMD_FLUSH, h, 0, 0)
    assert c.reply()[1] == 0
    c.close()


def verify(sock, name, blk, last, pats):
    c = Client(sock, name)
    bad = 0
    for b, gen in sorted(last.items()):
        if read_back(c, b * blk, blk) != pats[gen][:blk]:
            bad += 1
    c.close()
    return bad


def scenario_slow(args, pats):
    env = Env(args, "slow")
    size = args.member_mib * MIB
    members = [env.slow_member(i, size, args.delay) for i in range(6)]
    journal = env.file_member("journal", 1024 * MIB)
    run([args.bin, "create", "--level", "6", "--chunk", "64K", "-N", "rss", "--journal-mode",
         "write-back", "--journal", journal, *members])
    extra = ["--write-back-memory", args.write_back_memory] if args.write_back_memory else []
    sock = env.serve(members + [journal], extra)
    c = Client(sock, b"rss")
    vol = c.size
    c.close()
    blk, conns = MIB, 8
    count = (vol // blk) // conns
    last, deadline = {}, time.time() + args.seconds
    ts = [threading.Thread(target=writer, args=(sock, b"rss", (k * count, count), blk, pats,
                                                deadline, last)) for k in range(conns)]
    t0 = time.time()
    for t in ts:
        t.start()
    peak_deferred = 0
    while any(t.is_alive() for t in ts):
        j = status(env.control).get("journal") or {}
        peak_deferred = max(peak_deferred, j.get("deferred_bytes", 0))
        time.sleep(0.05)
    for t in ts:
        t.join()
    written = len(last)
    hwm = hwm_kib(env.server.pid)
    bad = verify(sock, b"rss", blk, last, pats)
    env.stop()
    return dict(name="slow members, write-back journal 1 GiB, 8 clients writing 1 MiB at QD8",
                hwm_mib=hwm / 1024, bad=bad, blocks=written, secs=time.time() - t0,
                note=f"peak deferred {peak_deferred / MIB:.0f} MiB; "
                     f"members behind nbdkit delay-write={args.delay}; "
                     f"--write-back-memory {args.write_back_memory or 'default (256M)'}")


def scenario_noread(args, pats):
    env = Env(args, "noread")
    size = 64 * MIB
    members = [env.file_member(f"m{i}", size) for i in range(6)]
    run([args.bin, "create", "--level", "6", "--chunk", "64K", "-N", "rss", *members])
    sock = env.serve(members)
    # Every other 1 MiB allocated (alternating allocated/hole runs for BLOCK_STATUS).
    c = Client(sock, b"rss")
    vol = 192 * MIB
    last = {}
    for b in range(0, vol // MIB, 2):
        c.send(CMD_WRITE, b, b * MIB, MIB, pats[b % 16])
        assert c.reply()[1] == 0
        last[b] = b % 16
    c.close()
    abusers = [Client(sock, b"rss") for _ in range(4)]
    hdr = lambda typ, h, off, ln: struct.pack(">IHHQQI", REQ_MAGIC, 0, typ, h, off, ln)
    # Each client sends all its requests at once (a thread blocks once the server stops
    # reading them) and reads no reply for --seconds: READ clients 64 x 32 MiB (2 GiB
    # asked each), BLOCK_STATUS clients 20,000 whole-volume requests each.
    sent = [args.reads if k % 2 == 0 else args.statuses for k in range(len(abusers))]

    def requests(k):
        for i in range(sent[k]):
            if k % 2 == 0:
                yield hdr(CMD_READ, i, (i * 32 * MIB) % (vol - 32 * MIB), 32 * MIB)
            else:
                yield hdr(CMD_BLOCK_STATUS, i, 0, vol)

    for k, a in enumerate(abusers):
        threading.Thread(target=a.s.sendall, args=(b"".join(requests(k)),)).start()
    time.sleep(args.seconds)
    hwm = hwm_kib(env.server.pid)
    # Now read every reply: reads must carry the data written (or zeros for the holes).
    bad = 0
    for k, a in enumerate(abusers):
        for _ in range(sent[k]):
            h, err, data = a.reply()
            if err:
                bad += 1
            elif k % 2 == 0:
                off = (h * 32 * MIB) % (vol - 32 * MIB)
                for o, b in data.items():
                    for j in range(0, len(b), MIB):
                        blk = (o + j) // MIB
                        want = pats[last[blk]] if blk in last else bytes(MIB)
                        if b[j:j + MIB] != want[:len(b[j:j + MIB])]:
                            bad += 1
        a.close()
    bad += verify(sock, b"rss", MIB, last, pats)
    env.stop()
    return dict(name=f"4 clients reading no reply for {args.seconds:.0f} s: 2 x {args.reads} "
                     f"READs of 32 MiB, 2 x {args.statuses} whole-volume BLOCK_STATUS",
                hwm_mib=hwm / 1024, bad=bad, blocks=sum(sent), secs=args.seconds,
                note="then every reply read and checked")


def scenario_conns(args, pats):
    env = Env(args, "conns")
    size = 64 * MIB
    members = [env.file_member(f"m{i}", size) for i in range(6)]
    run([args.bin, "create", "--level", "6", "--chunk", "64K", "-N", "rss", *members])
    sock = env.serve(members)
    blk = 128 * 1024
    vol = 192 * MIB
    count = (vol // blk) // args.conns
    last, deadline = {}, time.time() + args.seconds
    ts = [threading.Thread(target=writer, args=(sock, b"rss", (k * count, count), blk, pats,
                                                deadline, last, 4)) for k in range(args.conns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    hwm = hwm_kib(env.server.pid)
    bad = verify(sock, b"rss", blk, last, pats)
    env.stop()
    return dict(name=f"{args.conns} connections writing 128 KiB at QD4", hwm_mib=hwm / 1024,
                bad=bad, blocks=len(last), secs=args.seconds, note="")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/uraid")
    ap.add_argument("--dir", default="/tmp/uraid-rss")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--bound-mib", type=int, default=1024)
    ap.add_argument("--conns", type=int, default=128)
    ap.add_argument("--delay", default="5ms")
    ap.add_argument("--write-back-memory", help="passed to serve in the slow scenario")
    ap.add_argument("--member-mib", type=int, default=128, help="slow scenario's members")
    ap.add_argument("--reads", type=int, default=64)
    ap.add_argument("--statuses", type=int, default=20000)
    ap.add_argument("scenarios", nargs="*", default=["slow", "noread", "conns"])
    args = ap.parse_args()
    pats = patterns()
    rows, ok = [], True
    for s in args.scenarios:
        try:
            r = {"slow": scenario_slow, "noread": scenario_noread, "conns": scenario_conns}[s](
                args, pats)
        finally:
            for e in ENVS:
                if e.server is not None and e.server.poll() is None:
                    e.server.kill()
                    e.server.wait()
                e.stop()
        met = r["hwm_mib"] <= args.bound_mib and r["bad"] == 0
        ok &= met
        rows.append(r)
        print(f"{s}: peak RSS {r['hwm_mib']:.0f} MiB (bound {args.bound_mib}), "
              f"{r['blocks']} blocks/requests, {r['bad']} wrong; {r['note']}", flush=True)
    print()
    print("| abusive client | bound | peak RSS (VmHWM) | lost or wrong |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {args.bound_mib} MiB | {r['hwm_mib']:.0f} MiB | {r['bad']} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
