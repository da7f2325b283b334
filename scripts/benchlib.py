"""What the benchmark scripts share (pts.py, bench_*.py, ab_*.py, all in this directory, which
Python puts on the import path of a script it runs): running commands, servers (uraid serve,
nbdkit, qemu-nbd) and uraid's control socket, fio, and writing reports. Each script keeps its
own workloads and tables.
"""
import json, os, signal, socket, statistics, subprocess, sys, time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
URAID = os.path.join(ROOT, "target", "release", "uraid")
KIB, MIB = 1 << 10, 1 << 20


# ---------------------------------------------------------------------------------------------
# processes

def run(cmd, **kw):
    """Runs `cmd` and returns its stdout; raises RuntimeError with the end of its output if it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p.stdout


TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    """utime + stime of a process (all its threads, live and exited), in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_bytes(pid, field):
    """A size field of /proc/PID/status (VmRSS, VmHWM, ...) in bytes; 0 if absent."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def size_bytes(s):
    """"4k", "64K", "1m", "1G" or a plain number of bytes."""
    mult = {"k": KIB, "m": MIB, "g": 1 << 30}
    return int(s[:-1]) * mult[s[-1].lower()] if s[-1].lower() in mult else int(s)


def is_tmpfs(path):
    best, fs = "", ""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fs = mnt, parts[2]
    return fs == "tmpfs"


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), which every benchmark report states."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


# ---------------------------------------------------------------------------------------------
# servers

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_socket(unix=None, port=None, proc=None, timeout=30):
    """Waits until the Unix socket `unix` or loopback `port` accepts a connection; raises if
    `proc` exits first or nothing listens within `timeout` s."""
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        try:
            s = socket.socket(socket.AF_UNIX) if unix else socket.socket()
            s.connect(unix if unix else ("127.0.0.1", port))
            s.close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not come up ({unix or port})")


class Server:
    """A server process (uraid serve, nbdkit, qemu-nbd) listening on the Unix socket `sock` or
    the loopback TCP `port`; `start` may be called again after `stop`. Its output goes to
    `log` (appended) or nowhere. `unlink` names more files a stale run may have left (a
    control socket)."""

    def __init__(self, argv, sock=None, port=None, log=None, unlink=()):
        self.argv, self.sock, self.port, self.log = argv, sock, port, log
        self.unlink = [p for p in (sock, *unlink) if p]
        self.proc, self.t0 = None, None

    @property
    def pid(self):
        return self.proc.pid

    def start(self):
        """Starts the server and waits until it accepts connections; returns self."""
        for p in self.unlink:
            if os.path.exists(p):
                os.unlink(p)
        out = open(self.log, "a") if self.log else subprocess.DEVNULL
        self.t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=out)
        finally:
            if self.log:
                out.close()  # the child has its own copy
        try:
            wait_socket(unix=self.sock, port=None if self.sock else self.port, proc=self.proc)
        except RuntimeError as e:
            self.kill()
            tail = ""
            if self.log:
                with open(self.log) as f:
                    tail = "\n" + f.read()[-2000:]
            raise RuntimeError(f"{' '.join(self.argv)}: {e}{tail}") from None
        return self

    def stop(self, timeout=60, check=False):
        """SIGTERM, and the exit status; a server still running after `timeout` s is killed
        (status None). With `check`, anything but a clean exit 0 raises RuntimeError."""
        if self.proc is None:
            return None
        p, self.proc = self.proc, None
        p.send_signal(signal.SIGTERM)
        try:
            st = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            st = None
        if check and st != 0:
            why = f"exited with {st}" if st is not None else f"did not stop within {timeout} s (killed)"
            raise RuntimeError(f"{' '.join(self.argv[:2])} {why}")
        return st

    def kill(self):
        """SIGKILL (a crash: no clean stop)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def uraid_serve(d, members, export, extra=(), control=True, binary=URAID):
    """`uraid serve` of `members` on DIR/nbd.sock (`.uri` is `export` there), with its
    control socket at DIR/ctl.sock (`.ctl`) or none; not started yet."""
    sock, ctl = os.path.join(d, "nbd.sock"), (os.path.join(d, "ctl.sock") if control else None)
    argv = [binary, "serve", f"--listen=unix:{sock}", f"--control=unix:{ctl}" if ctl else "--control=none",
            *extra, *members]
    s = Server(argv, sock=sock, unlink=[ctl] if ctl else [])
    s.ctl, s.uri = ctl, f"nbd+unix:///{export}?socket={sock}"
    return s


def status(ctl):
    """GET /status on a uraid control socket."""
    return json.loads(run(["curl", "-sS", "--unix-socket", ctl, "http://uraid/status"]))


def events(ctl):
    """The event log (GET /events) of a uraid control socket."""
    return json.loads(run(["curl", "-sS", "--unix-socket", ctl, "http://uraid/events"]))["events"]


# ---------------------------------------------------------------------------------------------
# fio

def fio_json(cmd):
    """Runs fio with --output-format=json in `cmd`; its parsed output (past any notices fio
    prints before the JSON)."""
    out = run(cmd)
    return json.loads(out[out.index("{"):])


# ---------------------------------------------------------------------------------------------
# reports

def write_report(path, text):
    """Writes a report to `path`, or to stdout for "-"."""
    if path == "-":
        sys.stdout.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)


def spread(values):
    """Run-to-run noise: (max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


class FuseMember:
    """A member file for benchmarks with nbdkit filters in front: DIR/backing (`size` bytes)
    served by nbdkit's file plugin on DIR/nbdkit.sock and mounted by nbdfuse at DIR/mnt/member
    (`path`, which takes O_DIRECT). `start(filters, params)` (again after `stop` to change them),
    e.g. `start(["--filter=delay"], ["delay-read=2ms"])`."""

    def __init__(self, d, size):
        self.d, self.size, self.nbdkit, self.fuse = d, size, None, None
        os.makedirs(os.path.join(d, "mnt"), exist_ok=True)
        with open(os.path.join(d, "backing"), "wb") as f:
            f.truncate(size)
        self.path = os.path.join(d, "mnt", "member")

    def start(self, filters=(), params=()):
        sock = os.path.join(self.d, "nbdkit.sock")
        self.nbdkit = Server(["nbdkit", "-f", "--exit-with-parent", "-U", sock, *filters, "file",
                              os.path.join(self.d, "backing"), *params], sock=sock).start()
        self.fuse = subprocess.Popen(["nbdfuse", self.path, "--unix", sock], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        t = time.monotonic()
        while not (os.path.exists(self.path) and os.path.getsize(self.path) == self.size):
            if time.monotonic() - t > 30:
                raise RuntimeError(f"nbdfuse did not mount {self.path}")
            time.sleep(0.05)
        return self

    def stop(self):
        if self.fuse:
            subprocess.run(["fusermount3", "-u", os.path.dirname(self.path)], capture_output=True)
            self.fuse.wait()
            self.fuse = None
        if self.nbdkit:
            self.nbdkit.stop()
            self.nbdkit = None
