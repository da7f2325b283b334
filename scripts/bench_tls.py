#!/usr/bin/env python3
"""NBD over TLS: uraid serve --tls require (raid0 over 4 /dev/shm files) against nbdkit
--tls=require (file plugin, one /dev/shm file of the same size), same certificates and the
same cipher, and the same uraid array served in plaintext. Same fio job for all (ioengine=nbd,
one connection), TCP loopback or a Unix socket; every device preconditioned (written end to
end) first. For each cell: IOPS or MB/s and the server's CPU time (utime+stime from
/proc/PID/stat around the run) per request and per MiB; ratios uraid-TLS / nbdkit-TLS and
uraid-TLS / uraid-plain. Runs alternate between servers; medians are reported.

    scripts/bench_tls.py [--runs 3] [--runtime 4] [--size 1g] [--transport tcp|unix]
                         [--cipher AES-128-GCM] [--dir /dev/shm/uraid-tls] [--out -]
                         [--uraid target/release/uraid]

Certificates: a CA and a server certificate for localhost / 127.0.0.1, made with certtool
(gnutls-bin) in a temporary directory, given to both servers (--tls-certificates DIR).

The client side is libnbd (fio's nbd engine, nbdinfo), which takes its CA from
$HOME/.pki/libnbd/ca-cert.pem when the URI names none: fio's engine refuses the URI's
?tls-certificates= (it does not call nbd_set_uri_allow_local_file), so fio and nbdinfo run
with HOME set to a directory holding that link. The cipher: the two servers pick differently
from libnbd's default offer (nbdkit/GnuTLS AES-256-GCM, uraid/rustls AES-128-GCM), so the
client is limited to --cipher by a GnuTLS config file ([overrides] tls-disabled-cipher = every
other one, GNUTLS_SYSTEM_PRIORITY_FILE); `--cipher any` leaves the offer alone. The cipher each
server negotiated is taken from libnbd's debug line (LIBNBD_DEBUG=1 nbdinfo) and reported.
"""
import argparse, json, os, shutil, signal, statistics, subprocess, sys, tempfile

from benchlib import (cpu_model, MIB, TICK, URAID, Server, cpu_ticks, fio_json, free_port, run, size_bytes,
                      spread, write_report)

WORKLOADS = [
    ("4k randread QD32", "randread", "4k", 32, "iops"),
    ("1M seq read QD8", "read", "1m", 8, "mbps"),
    ("1M seq write QD8", "write", "1m", 8, "mbps"),
]
UNITS = {"iops": "IOPS", "mbps": "MB/s"}

# TLS ciphers GnuTLS 3.7 knows; all but the one chosen are disabled on the client.
CIPHERS = ["AES-128-GCM", "AES-256-GCM", "CHACHA20-POLY1305", "AES-128-CCM", "AES-256-CCM",
           "AES-128-CBC", "AES-256-CBC", "CAMELLIA-128-GCM", "CAMELLIA-256-GCM", "3DES-CBC",
           "ARCFOUR-128"]

CA_INFO = "cn = bench CA\nca\ncert_signing_key\nexpiration_days = 30\n"
SERVER_INFO = ("organization = uraid\ncn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\n"
               "tls_www_server\nencryption_key\nsigning_key\nexpiration_days = 30\n")

URAID_TLS, NBDKIT_TLS, URAID_PLAIN = "uraid TLS", "nbdkit TLS", "uraid plain"


def make_certs(d):
    """CA and server certificate (localhost, 127.0.0.1) in `d`, under the names nbdkit, qemu
    and uraid read: ca-cert.pem, server-cert.pem, server-key.pem."""
    os.makedirs(d)
    for name, text in (("ca.info", CA_INFO), ("server.info", SERVER_INFO)):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    for cmd in (["--generate-privkey", "--outfile", "ca-key.pem"],
                ["--generate-self-signed", "--load-privkey", "ca-key.pem", "--template", "ca.info",
                 "--outfile", "ca-cert.pem"],
                ["--generate-privkey", "--outfile", "server-key.pem"],
                ["--generate-certificate", "--load-ca-certificate", "ca-cert.pem", "--load-ca-privkey",
                 "ca-key.pem", "--load-privkey", "server-key.pem", "--template", "server.info",
                 "--outfile", "server-cert.pem"]):
        run(["certtool"] + cmd, cwd=d)


class Peer:
    """One server compared: started for each run, `uri` for fio."""

    def __init__(self, name, argv, uri, sock=None, port=None, log=None):
        self.name, self.uri = name, uri
        self.server = Server(argv, sock=sock, port=port, log=log)

    @property
    def argv(self):
        return self.server.argv

    @property
    def pid(self):
        return self.server.pid

    def start(self):
        self.server.start()

    def stop(self):
        self.server.stop(timeout=30)


def fio(env, uri, rw, bs, qd, runtime, extra=()):
    cmd = ["env"] + env + ["fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}",
                           f"--bs={bs}", f"--iodepth={qd}", "--size=100%", "--output-format=json",
                           "--norandommap", "--randrepeat=0"] + list(extra)
    if runtime:
        cmd += [f"--runtime={runtime}", "--time_based"]
    j = fio_json(cmd)["jobs"][0]
    side = j["read"] if "read" in rw else j["write"]
    print(f"  client: usr {j['usr_cpu']:.0f}% sys {j['sys_cpu']:.0f}% ctx {j['ctx']}", file=sys.stderr)
    return side["iops"], side["bw_bytes"] / 1e6, side["total_ios"], side["io_bytes"]


def tls_info(env, uri):
    """(libnbd's "connection is using TLS: ..." text, nbdinfo's "protocol:" line) for `uri`."""
    cmd = ["env", "LIBNBD_DEBUG=1"] + env + ["nbdinfo", uri]
    pr = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = pr.stdout
    if pr.returncode != 0:
        raise RuntimeError(f"command failed ({pr.returncode}): {' '.join(cmd)}\n{out[-2000:]}")
    using = next((l.split("using TLS: ", 1)[1].strip() for l in out.splitlines() if "using TLS: " in l),
                 "no TLS")
    proto = next((l.split("protocol:", 1)[1].strip() for l in out.splitlines()
                  if l.startswith("protocol:")), "?")
    return using, proto


def pool(files):
    """Pooled ratios over several runs' JSON files (--out X writes X.json): per workload, the
    median of every run of uraid TLS over the median of every run of nbdkit TLS, for the rate
    and the server CPU per request."""
    runs = {}
    for f in files:
        with open(f) as fh:
            for key, rows in json.load(fh)["results"].items():
                runs.setdefault(key, []).extend(rows)
    print("| workload | runs per server | uraid-TLS / nbdkit-TLS | CPU/req uraid-TLS / nbdkit-TLS |")
    print("|---|---:|---:|---:|")
    for name, *_ in WORKLOADS:
        u, n = runs.get(f"uraid TLS|{name}"), runs.get(f"nbdkit TLS|{name}")
        if not u or not n:
            continue
        rate = statistics.median(r[0] for r in u) / statistics.median(r[0] for r in n)
        cpu = statistics.median(r[1] for r in u) / statistics.median(r[1] for r in n)
        print(f"| {name} | {len(u)}, {len(n)} | {rate:.2f}× | {cpu:.2f}× |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--runtime", type=float, default=4)
    ap.add_argument("--size", default="1g", help="array volume (and nbdkit's file), a multiple of 4M")
    ap.add_argument("--transport", choices=["tcp", "unix"], default="tcp")
    ap.add_argument("--cipher", choices=CIPHERS[:3] + ["any"], default="AES-128-GCM",
                    help="the one cipher the client offers; any: libnbd's default offer")
    ap.add_argument("--dir", default="/dev/shm/uraid-tls")
    ap.add_argument("--out", default="-")
    ap.add_argument("--uraid", default=URAID, help="uraid binary (built with TLS)")
    ap.add_argument("--only", default="", help="run only the workloads whose name contains this")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for both uraid servers (repeat), e.g. --serve-arg=--busy-poll=0")
    ap.add_argument("--pool", nargs="+", metavar="JSON",
                    help="print ratios pooled over the runs of these result files, run nothing")
    a = ap.parse_args()
    if a.pool:
        return pool(a.pool)
    workloads = [w for w in WORKLOADS if a.only in w[0]]
    if not workloads:
        sys.exit(f"no workload matches --only {a.only!r}")
    for tool in ("fio", "nbdkit", "nbdinfo", "certtool"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: run scripts/setup.sh (certtool: gnutls-bin)")
    if "--tls-certificates" not in run([a.uraid, "serve", "--help"]):
        sys.exit(f"{a.uraid} has no --tls-certificates: build it with TLS")
    size = size_bytes(a.size)
    if size % (4 * MIB) or size <= 0:
        sys.exit("--size must be a positive multiple of 4M")
    # SIGTERM cleans up like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    d, tmp, peers = a.dir, tempfile.mkdtemp(prefix="uraid-tls-bench-"), []
    try:
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        certs = os.path.join(tmp, "certs")
        make_certs(certs)
        # libnbd's default CA directory, for fio (see the docstring).
        home = os.path.join(tmp, "home")
        os.makedirs(os.path.join(home, ".pki"))
        os.symlink(certs, os.path.join(home, ".pki", "libnbd"))
        env = [f"HOME={home}"]
        if a.cipher != "any":
            prio = os.path.join(tmp, "gnutls.conf")
            with open(prio, "w") as f:
                f.write("[overrides]\n" + "".join(f"tls-disabled-cipher = {c}\n"
                                                  for c in CIPHERS if c != a.cipher))
            env.append(f"GNUTLS_SYSTEM_PRIORITY_FILE={prio}")

        # Devices: raid0 over 4 members, and nbdkit's file of the array's size.
        members = [os.path.join(d, f"r0-{i}") for i in range(4)]
        run([a.uraid, "create", "--level", "0", "-N", "r0", "--size", f"{size // 4 // MIB + 1}M"] + members)
        peer_img = os.path.join(d, "peer.img")

        def listen(name):
            """(uraid --listen value, nbdkit address options, URI tail, sock, port)."""
            if a.transport == "unix":
                sock = os.path.join(tmp, name + ".sock")
                return f"unix:{sock}", ["-U", sock], f"+unix:///?socket={sock}", sock, None
            port = free_port()
            return f"tcp:127.0.0.1:{port}", ["-i", "127.0.0.1", "-p", str(port)], f"://127.0.0.1:{port}/", None, port

        lst, _, tail, sock, port = listen("uraid-tls")
        peers.append(Peer(URAID_TLS, [a.uraid, "serve", "--listen", lst, "--control", "none", "--tls", "require",
                                      "--tls-certificates", certs] + a.serve_arg + members,
                          "nbds" + tail, sock, port, os.path.join(tmp, "uraid-tls.log")))
        _, addr, tail, sock, port = listen("nbdkit-tls")
        peers.append(Peer(NBDKIT_TLS, ["nbdkit", "-f", "--exit-with-parent"] + addr +
                          ["--tls=require", f"--tls-certificates={certs}", "file", peer_img],
                          "nbds" + tail, sock, port, os.path.join(tmp, "nbdkit-tls.log")))
        lst, _, tail, sock, port = listen("uraid-plain")
        peers.append(Peer(URAID_PLAIN, [a.uraid, "serve", "--listen", lst, "--control", "none"] + a.serve_arg + members,
                          "nbd" + tail, sock, port, os.path.join(tmp, "uraid-plain.log")))
        by_name = {p.name: p for p in peers}

        # Precondition: every device written end to end (1M sequential writes through the
        # server); the array once (both uraid peers serve it), nbdkit's file sized to match.
        p = by_name[URAID_PLAIN]
        p.start()
        volume = int(run(["nbdinfo", "--size", p.uri]).strip())
        fio(env, p.uri, "write", "1m", 8, 0)
        p.stop()
        with open(peer_img, "wb") as f:
            f.truncate(volume)
        p = by_name[NBDKIT_TLS]
        p.start()
        fio(env, p.uri, "write", "1m", 8, 0)
        p.stop()
        print(f"preconditioned: {volume} bytes each", file=sys.stderr)

        # The TLS session each TLS server negotiates with this client.
        tls = {}
        for name in (URAID_TLS, NBDKIT_TLS):
            p = by_name[name]
            p.start()
            tls[name] = tls_info(env, p.uri)
            p.stop()
            print(f"{name}: {tls[name][0]}; protocol: {tls[name][1]}", file=sys.stderr)

        results = {}  # (server, workload) -> list of (value, cpu_us_per_req, cpu_us_per_mib)
        for r in range(a.runs):
            order = peers[r % len(peers):] + peers[:r % len(peers)]  # each one first in turn
            for p in order:
                p.start()
                for wl, rw, bs, qd, metric in workloads:
                    t0 = cpu_ticks(p.pid)
                    iops, mbps, ios, nbytes = fio(env, p.uri, rw, bs, qd, a.runtime)
                    t1 = cpu_ticks(p.pid)
                    cpu_us = (t1 - t0) / TICK * 1e6
                    per_req, per_mib = cpu_us / max(ios, 1), cpu_us / max(nbytes / MIB, 1e-9)
                    val = iops if metric == "iops" else mbps
                    results.setdefault((p.name, wl), []).append((val, per_req, per_mib))
                    print(f"run {r + 1} {p.name:12} {wl:18} {val:10.1f} {UNITS[metric]}  "
                          f"{per_req:7.2f} us/req  {per_mib:8.1f} us/MiB", file=sys.stderr)
                p.stop()

        def med(name, wl, i):
            return statistics.median(x[i] for x in results[(name, wl)])

        lines = []
        lines.append(f"CPU: {cpu_model()} ({os.cpu_count()} cores); client and servers share them.")
        lines.append("")
        lines.append(f"Medians of {a.runs} runs of {a.runtime:g} s each, servers alternated; "
                     f"{run(['fio', '--version']).strip()}, ioengine=nbd, one connection, size=100% "
                     f"of {volume} bytes, {'TCP loopback' if a.transport == 'tcp' else 'Unix socket'}; "
                     f"{run(['nbdkit', '--version']).strip()}, "
                     f"{run(['nbdinfo', '--version']).splitlines()[-1].strip()}. CPU = server "
                     f"utime+stime per completed request and per MiB transferred.")
        lines.append("")
        lines.append(f"Client cipher: {'libnbd default offer' if a.cipher == 'any' else a.cipher + ' only'}. "
                     "Negotiated (libnbd debug, nbdinfo):")
        lines.append("")
        for name in (URAID_TLS, NBDKIT_TLS):
            lines.append(f"- {name}: {tls[name][0]}; protocol: {tls[name][1]}")
        ciphers = {tls[n][0].split(" (")[0] for n in tls}
        if len(ciphers) > 1:
            lines.append("")
            lines.append(f"**Warning: the servers negotiated different ciphers ({', '.join(sorted(ciphers))}).**")
        lines.append("")
        lines.append("| workload | " + " | ".join(p.name for p in peers) + " |")
        lines.append("|---|" + "---:|" * len(peers))
        for wl, _, _, _, metric in workloads:
            cells = []
            for p in peers:
                v, c, m = med(p.name, wl, 0), med(p.name, wl, 1), med(p.name, wl, 2)
                if metric == "iops":
                    cells.append(f"{v / 1000:.1f}k IOPS, {c:.2f} µs CPU/req, {m:.0f} µs CPU/MiB")
                else:
                    cells.append(f"{v:.0f} MB/s, {c:.1f} µs CPU/req, {m:.1f} µs CPU/MiB")
            lines.append(f"| {wl} | " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("| workload | uraid-TLS / nbdkit-TLS | CPU/req uraid-TLS / nbdkit-TLS "
                     "| uraid-TLS / uraid-plain | CPU/req uraid-TLS / uraid-plain |")
        lines.append("|---|---:|---:|---:|---:|")
        for wl, _, _, _, metric in workloads:
            cols = []
            for ref in (NBDKIT_TLS, URAID_PLAIN):
                cols.append(f"{med(URAID_TLS, wl, 0) / med(ref, wl, 0):.2f}×")
                cols.append(f"{med(URAID_TLS, wl, 1) / med(ref, wl, 1):.2f}×")
            lines.append(f"| {wl} | " + " | ".join(cols) + " |")
        if a.runs > 1:
            lines.append("")
            lines.append("Run-to-run spread of the throughput ((max - min) / median): " + "; ".join(
                f"{p.name} {wl} {spread([x[0] for x in results[(p.name, wl)]]) * 100:.0f}%"
                for p in peers for wl, *_ in workloads) + ".")
        lines.append("")
        lines.append("Servers:")
        lines.append("")
        for p in peers:
            lines.append(f"- {p.name}: `{' '.join(p.argv)}`, fio `--uri={p.uri}`")
        lines.append("")
        write_report(a.out, "\n".join(lines))
        if a.out != "-":
            with open(a.out + ".json", "w") as f:
                json.dump({"tls": tls, "results": {f"{k[0]}|{k[1]}": v for k, v in results.items()}},
                          f, indent=1)
    finally:
        for p in peers:
            p.stop()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
