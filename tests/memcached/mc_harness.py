"""Start a private hatchkv-server and hatchkv-memcached for a test; stop both.

The server's transport is shm, or verbs with HKV_MC_TRANSPORT=verbs (the rdma
tier, in the Soft-RoCE guest: it serves on HKV_RDMA_ADDR; without an RDMA
device the test exits 77, skipped, unless HKV_REQUIRE_RDMA is set).

Ports are never fixed: hatchkv-memcached listens on port 0 and logs the port it
got; Debian's memcached gets a port found free just before it starts. Every
process started here is killed on close(), also when the test fails.
"""
import ctypes
import os
import hashlib
import hmac
import re
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time


def stop(p, wait_s=10):
    """SIGTERM a process we started, SIGKILL it after wait_s; reap it."""
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(wait_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def find_etcd():
    """The etcd binary: $HKV_ETCD_BIN, on PATH, or /usr/bin/etcd; None if none."""
    env = os.environ.get("HKV_ETCD_BIN")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("etcd") or (
        "/usr/bin/etcd" if os.access("/usr/bin/etcd", os.X_OK) else None)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def free_port_pair():
    """A port P with P+1 free too (hatchkv-server's rdma_cm port is P+1)."""
    for _ in range(100):
        p = free_port()
        s = socket.socket()
        try:
            s.bind(("0.0.0.0", p + 1))
            return p
        except OSError:
            continue
        finally:
            s.close()
    raise RuntimeError("no free port pair")


def rdma_addr():
    """The address to serve verbs on; exits 77 (skip) without an RDMA device."""
    devs = os.listdir("/sys/class/infiniband") if os.path.isdir("/sys/class/infiniband") else []
    addr = os.environ.get("HKV_RDMA_ADDR")
    if devs and addr:
        return addr
    why = "no RDMA device" if not devs else "HKV_RDMA_ADDR is not set"
    if os.environ.get("HKV_REQUIRE_RDMA"):
        raise RuntimeError("RDMA required (HKV_REQUIRE_RDMA) but " + why)
    print("SKIP: %s (run through scripts/softroce-run for the Soft-RoCE tier)" % why)
    sys.exit(77)


CTL_VERSION = 4  # common/ctl_proto.h HKV_CTL_VERSION


def ctl_auth(sock_path, token):
    """The control plane's authentication by hand over a shm control socket
    (common/ctl_proto.h: HELLO, CHALLENGE, PROVE; HMAC-SHA-256 keyed by the
    token over a label and both nonces): the type and status of the reply to
    PROVE, or to HELLO if that was refused (2 WELCOME, 3 ERROR)."""
    def recv_exact(s, n):
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))
            if not chunk:
                break
            buf += chunk
        return buf

    def mac(label, nc, ns):
        return hmac.new(token, label + b"\0" + nc + ns, hashlib.sha256).digest()

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(sock_path)
    nc = os.urandom(32)
    s.sendall(struct.pack("<IHHiI", 0x4C54434B, CTL_VERSION, 8, 0, len(nc)) + nc)
    _, _, typ, status, ln = struct.unpack("<IHHiI", recv_exact(s, 16))
    body = recv_exact(s, ln)
    if typ == 9:  # CHALLENGE: nonce_s, proofs; answer PROVE
        ns = body[:32]
        s.sendall(struct.pack("<IHHiI", 0x4C54434B, CTL_VERSION, 10, 0, 32) +
                  mac(b"hatchkv client", nc, ns))
        _, _, typ, status, _ = struct.unpack("<IHHiI", recv_exact(s, 16))
    s.close()
    return typ, status


class Mc:
    """The memcached text protocol over one connection."""

    def __init__(self, port, timeout=10):
        self.s = socket.create_connection(("127.0.0.1", port), timeout)
        self.s.settimeout(timeout)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(65536)
            if not chunk:
                raise OSError("closed")
            self.buf += chunk
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def set(self, k, v):
        self.s.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (k.encode(), len(v), v))
        return self.line() == b"STORED"

    def get(self, k):
        self.s.sendall(b"get %s\r\n" % k.encode())
        ln = self.line()
        if ln == b"END":
            return None
        if not ln.startswith(b"VALUE "):
            raise OSError("unexpected %r" % ln)
        n = int(ln.split()[3])
        while len(self.buf) < n + 2:
            chunk = self.s.recv(65536)
            if not chunk:
                raise OSError("closed")
            self.buf += chunk
        v, self.buf = self.buf[:n], self.buf[n + 2:]
        if self.line() != b"END":
            raise OSError("no END")
        return v

    def close(self):
        self.s.close()


def wait_for(pred, timeout, what, step=0.05, error=RuntimeError):
    """pred() every step s until it is true (its value is returned), for at
    most timeout s; then error("timed out ...")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise error("timed out (%g s) waiting for %s" % (timeout, what))


def die_with_parent():
    """In a child (Popen's preexec_fn): SIGKILL when the test dies (a ctest
    timeout, a ^C)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Procs:
    """Named processes, each with its output in NAME.log in a temp dir this
    owns (mkdtemp: mode 0700): the bookkeeping the cluster tests share.
    Every process dies with the test (die_with_parent) unless pdeathsig is
    False; stop_all continues the stopped ones first, then stops them all."""

    log_mode = "w"      # "a": a process started again under a name appends to its log
    pdeathsig = True    # preexec_fn=die_with_parent
    stop_wait_s = 10    # SIGTERM, then SIGKILL after this long
    stop_in_turn = False  # stop_all: each exits before the next is signalled

    def __init__(self, prefix, dir=None):
        self.tmp = tempfile.mkdtemp(prefix=prefix, dir=dir)
        self.procs = {}
        self.argv = {}      # (to start one again as it was)
        self.stopped = set()

    def spawn(self, name, argv, log=None):
        """Start argv as name, its output in LOG.log (log: name if None)."""
        f = open(os.path.join(self.tmp, (log or name) + ".log"), self.log_mode)
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             preexec_fn=die_with_parent if self.pdeathsig else None)
        f.close()
        self.procs[name] = p
        self.argv[name] = argv
        return p

    def log(self, name):
        """NAME.log so far ("" if there is none)."""
        try:
            with open(os.path.join(self.tmp, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def kill(self, name):
        """SIGKILL and reap it (it stays in procs: its exit status)."""
        p = self.procs[name]
        p.kill()
        p.wait()

    def sigstop(self, name):
        self.procs[name].send_signal(signal.SIGSTOP)
        self.stopped.add(name)

    def sigcont(self, name):
        self.procs[name].send_signal(signal.SIGCONT)
        self.stopped.discard(name)

    def stop(self, names):
        """SIGTERM these (continued first if stopped), SIGKILL after
        stop_wait_s; all at once, or one by one if stop_in_turn."""
        ps = [(n, self.procs.pop(n)) for n in names if n in self.procs]
        for n, p in ps:
            if n in self.stopped and p.poll() is None:
                p.send_signal(signal.SIGCONT)
            self.stopped.discard(n)
        if self.stop_in_turn:
            for _, p in ps:
                stop(p, self.stop_wait_s)
            return
        for _, p in ps:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in ps:
            try:
                p.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_order(self):
        """The order stop_all stops them in: etcd last (the others may call it
        as they stop)."""
        return [n for n in self.procs if n != "etcd"] + [n for n in self.procs if n == "etcd"]

    def stop_all(self):
        order = self.stop_order()
        self.stop(order + [n for n in self.procs if n not in order])
        self.stopped.clear()

    def close(self):
        """stop_all, then remove the temp dir."""
        self.stop_all()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Daemons:
    """hatchkv-server + hatchkv-memcached in a temp dir; .port is the memcached port."""

    def __init__(self, mc_bin, srv_bin, item_max="1m", threads=2, memory="256M", cache=False,
                 rekey=None, mc_extra=(), cache_segment="64K", mc_nofile=None):
        """rekey: path of hkv-rekey; the region (a file) gets the test secret first.
        mc_extra: more hatchkv-memcached arguments. cache_segment: the segment size
        in cache mode (None: the server's default, as scripts/memcached-demo runs it).
        mc_nofile: hatchkv-memcached's descriptor limit (soft and hard)."""
        self.procs = []
        self.mc_nofile = mc_nofile
        self.cache_segment = cache_segment
        self.tmp = tempfile.mkdtemp(prefix="hkv-mc-test-")
        self.rekey = rekey
        self.mc_extra = list(mc_extra)
        try:
            self._start(mc_bin, srv_bin, item_max, threads, memory, cache)
        except BaseException:
            self.close()
            raise

    def _spawn(self, argv, log, nofile=None):
        f = open(os.path.join(self.tmp, log), "w")

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                             preexec_fn=limit if nofile else None)
        self.procs.append(p)
        return p

    def _start(self, mc_bin, srv_bin, item_max, threads, memory, cache):
        sock = os.path.join(self.tmp, "ctl.sock")
        token = os.path.join(self.tmp, "token")
        extra = ["--cache"] if cache else []
        if cache and self.cache_segment:
            extra += ["--segment-size", self.cache_segment]
        if self.rekey:
            extra += ["--memory-file", os.path.join(self.tmp, "region")]
        if os.environ.get("HKV_MC_TRANSPORT", "shm") == "verbs":
            addr, port = rdma_addr(), free_port_pair()
            uri = "verbs://%s:%d" % (addr, port)
            srv = self._spawn([srv_bin, "--transport", "verbs", "--listen", addr, "--port",
                               str(port), "--memory", memory, "--token-file", token] + extra,
                              "server.log")
        else:
            uri = "shm:" + sock
            srv = self._spawn([srv_bin, "--transport", "shm", "--socket", sock, "--memory",
                               memory, "--token-file", token] + extra, "server.log")
        wait_for(lambda: "server: ready" in self.log("server.log") or srv.poll() is not None,
                 60, "hatchkv-server")
        if srv.poll() is not None:
            raise RuntimeError("hatchkv-server died: " + self.log("server.log"))
        if self.rekey:  # the test secret, before anything is stored; then start it warm
            srv.kill()
            srv.wait()
            subprocess.run([self.rekey, os.path.join(self.tmp, "region")], check=True)
            srv = self._spawn(srv.args, "server2.log")
            wait_for(lambda: "server: ready" in self.log("server2.log") or
                     srv.poll() is not None, 60, "hatchkv-server (re-keyed)")
            if srv.poll() is not None:
                raise RuntimeError("hatchkv-server died: " + self.log("server2.log"))
        depth = os.environ.get("HKV_MC_DEPTH")  # a tier may run every test at a depth
        if depth and "--depth" not in self.mc_extra:
            self.mc_extra += ["--depth", depth]
        mc = self._spawn([mc_bin, "--server", uri, "--token-file", token, "-p", "0",
                          "-t", str(threads), "-I", item_max] + self.mc_extra, "memcached.log",
                         self.mc_nofile)
        pat = re.compile(r"listening on \S+:(\d+)")
        wait_for(lambda: pat.search(self.log("memcached.log")) or mc.poll() is not None, 60,
                 "hatchkv-memcached")
        if mc.poll() is not None:
            raise RuntimeError("hatchkv-memcached died: " + self.log("memcached.log"))
        self.port = int(pat.search(self.log("memcached.log")).group(1))
        self.mc = mc

    def log(self, name):
        try:
            with open(os.path.join(self.tmp, name)) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        for p in reversed(self.procs):
            stop(p)
        self.procs = []
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RealMemcached:
    """Debian's memcached on a free port (for differential tests)."""

    def __init__(self, item_max="1m", extra=()):
        self.port = free_port()
        argv = ["memcached", "-p", str(self.port), "-U", "0", "-l", "127.0.0.1", "-I", item_max,
                "-t", "1"] + list(extra)
        if os.geteuid() == 0:
            argv += ["-u", "root"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up():
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return True
            except OSError:
                return self.proc.poll() is not None
        wait_for(up, 30, "memcached")
        if self.proc.poll() is not None:
            raise RuntimeError("memcached did not start")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
