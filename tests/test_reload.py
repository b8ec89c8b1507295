"""SIGHUP re-reads what can change live (issue 30, item 2).

    python3 test_reload.py BINDIR

In a temp dir, each program runs from a --config file:
  a. hatchkv-server (standalone, shm) without verbose logs no DEBUG line
     while a client stores items; its file gets `verbose` and another
     --memory, SIGHUP: one line says the level went info -> debug, one that
     --memory needs a restart; then items of new sizes log DEBUG lines and
     every item reads back. A file with an unknown option changes nothing
     (a line says so); without verbose again, the level goes back to info.
  b. hatchkv-memcached the same: a request line that is too long is closed
     without a DEBUG line before, with one after its SIGHUP.
  c. with etcd, openssl and etcdctl: a cache-mode member on an etcd with
     TLS (CA 1, a client certificate of CA 1) and a user (root, password 1),
     and hatchkv-memcached in front of it. A CA file that is no PEM, SIGHUP:
     a line names the file, the context in use stays. Then new files (a CA
     bundle 1+2, a client certificate of CA 2, password 2), SIGHUP to both;
     etcd's password becomes 2 (every token it gave is refused from then
     on) and etcd restarts with a certificate of CA 2 trusting CA 2 alone:
     only the new files work. The member keeps its lease and stays a member
     past its lease TTL, never fenced; memcached reads and writes through
     the cluster (a new map read from etcd).

Exit 0: passed, 1: failed; part c is skipped (a line says so) without etcd,
etcdctl or openssl. Every process started here is stopped; the temp dir is
removed.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
from mc_harness import Mc, die_with_parent, find_etcd, free_port, stop  # noqa: E402

LEASE_TTL = 10


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print("ok  ", what, flush=True)


class Env:
    def __init__(self, bindir):
        self.bindir = bindir
        self.tmp = tempfile.mkdtemp(prefix="hkv-reload-")
        os.chmod(self.tmp, 0o700)
        self.procs = {}
        # (HKV_LOG would set the level these tests change)
        self.env = {k: v for k, v in os.environ.items() if k not in ("HKV_LOG", "JOURNAL_STREAM")}

    def path(self, name):
        return os.path.join(self.tmp, name)

    def bin(self, name):
        return os.path.join(self.bindir, name)

    def write(self, name, text, mode=0o600):
        with open(self.path(name), "w") as f:
            f.write(text)
        os.chmod(self.path(name), mode)
        return self.path(name)

    def spawn(self, name, argv):
        f = open(self.path(name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=self.env, preexec_fn=die_with_parent)
        f.close()
        self.procs[name] = p
        return p

    def log(self, name):
        try:
            with open(self.path(name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_log(self, name, pattern, timeout=20, after=0):
        """The first match of pattern in name's log past offset after."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = rx.search(self.log(name), after)
            if m:
                return m
            if self.procs[name].poll() is not None:
                raise Failed("%s exited (%s):\n%s" % (name, self.procs[name].returncode,
                                                       self.log(name)[-2000:]))
            time.sleep(0.05)
        raise Failed("no %r in %s's log within %g s:\n%s" % (pattern, name, timeout,
                                                             self.log(name)[-2000:]))

    def hup(self, name, pattern=r"SIGHUP: re-read"):
        """SIGHUP name; its summary line (matched past what was logged)."""
        at = len(self.log(name))
        self.procs[name].send_signal(signal.SIGHUP)
        m = self.wait_log(name, r"[^\n]*" + pattern + r"[^\n]*", after=at)
        return m.group(0), at

    def stop(self, name):
        p = self.procs.pop(name, None)
        if p:
            stop(p)

    def close(self):
        for name in list(self.procs):
            self.stop(name)
        shutil.rmtree(self.tmp, ignore_errors=True)


def debug_lines(text):
    return [ln for ln in text.splitlines() if " DEBUG " in ln]


def mc_port(ev, name):
    return int(ev.wait_log(name, r"listening on \S+:(\d+)").group(1))


def sets_and_gets(port, tag, sizes):
    mc = Mc(port, 10)
    try:
        bad = [n for n in sizes if not mc.set("%s%d" % (tag, n), b"v" * n)]
        bad += [n for n in sizes if mc.get("%s%d" % (tag, n)) != b"v" * n]
    finally:
        mc.close()
    return bad


def long_line(port):
    """A request line longer than memcached allows: the connection closes."""
    mc = Mc(port, 10)
    try:
        mc.s.sendall(b"set " + b"k" * 4000)
        try:
            mc.line()
        except OSError:
            pass
    finally:
        mc.close()


# ---- a and b ----

SERVER_CONF = """# hatchkv-server, test_reload.py
transport = shm
socket = {sock}
token-file = {tok}
memory = {mem}
segment-size = 256K
{extra}
"""
MC_CONF = """server = shm:{sock}
token-file = {tok}
port = 0
threads = 1
{extra}
"""


def part_ab(ev):
    sock, tok = ev.path("s.sock"), ev.path("token")
    srv_conf = lambda mem, extra="": ev.write("server.conf", SERVER_CONF.format(
        sock=sock, tok=tok, mem=mem, extra=extra))
    mc_conf = lambda extra="": ev.write("mc.conf", MC_CONF.format(sock=sock, tok=tok,
                                                                  extra=extra))
    srv_conf("64M")
    mc_conf()
    ev.spawn("server", [ev.bin("hatchkv-server"), "--config", ev.path("server.conf")])
    ev.wait_log("server", r"server: ready")
    ev.spawn("mc", [ev.bin("hatchkv-memcached"), "--config", ev.path("mc.conf")])
    port = mc_port(ev, "mc")
    bad = sets_and_gets(port, "a", [10, 20])
    long_line(port)
    time.sleep(0.2)
    check(not bad and not debug_lines(ev.log("server")) and not debug_lines(ev.log("mc")),
          "without verbose: items stored and read, no DEBUG line from either program")

    # a. the server
    srv_conf("128M", "verbose")
    line, at = ev.hup("server")
    check("log level info -> debug" in line and "token file read again: unchanged" in line,
          "server SIGHUP: %s" % line.split(" INFO ", 1)[-1])
    restart = re.search(r"--memory changed in \S+ \(64M -> 128M\): needs a restart; "
                        r"keeping 64M", ev.log("server")[at:])
    check(restart, "server: --memory changed in the file needs a restart, and says so")
    bad = sets_and_gets(port, "b", [3000, 9000, 30000, 100000])
    bad += sets_and_gets(port, "a", [10, 20])
    dbg = debug_lines(ev.log("server")[at:])
    check(not bad and dbg, "server after SIGHUP: DEBUG lines (%d, e.g. %s), items of new "
          "sizes stored and every item read back" % (len(dbg), dbg[0].split(" DEBUG ")[-1]
                                                      if dbg else "none"))
    ev.write("server.conf", "memory = 64M\nno-such-option = 1\n")
    line, at = ev.hup("server", r"SIGHUP: \S+ has errors")
    check("nothing changed" in line and "no-such-option" in ev.log("server")[at:],
          "server: a file with an unknown option changes nothing: %s"
          % line.split(" ERROR ", 1)[-1])
    srv_conf("64M")
    line, at = ev.hup("server")
    check("log level debug -> info" in line and "needs a restart" not in ev.log("server")[at:],
          "server: verbose gone from the file, SIGHUP: back to info, nothing needs a restart")

    # b. hatchkv-memcached
    mc_conf("verbose\nthreads = 2")
    line, at = ev.hup("mc")
    check("log level info -> debug" in line,
          "memcached SIGHUP: %s" % line.split(" INFO ", 1)[-1])
    check(re.search(r"--threads changed in \S+ \(1 -> 2\): needs a restart; keeping 1",
                    ev.log("mc")[at:]),
          "memcached: --threads changed in the file needs a restart, and says so")
    long_line(port)
    ev.wait_log("mc", r"DEBUG worker \d+: request line too long", timeout=5, after=at)
    bad = sets_and_gets(port, "c", [10, 3000])
    check(not bad and ev.procs["mc"].poll() is None,
          "memcached after SIGHUP: a too long request line logs a DEBUG line; sets and gets "
          "work")
    ev.stop("mc")
    ev.stop("server")


# ---- c ----

class Certs:
    def __init__(self, ev):
        self.ev = ev

    def openssl(self, *args):
        r = subprocess.run(["openssl"] + list(args), cwd=self.ev.tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        if r.returncode:
            raise Failed("openssl %s: %s" % (" ".join(args), r.stdout.decode(errors="replace")))

    def ca(self, name, cn):
        self.openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                     "-nodes", "-keyout", name + ".key", "-out", name + ".pem", "-days", "2",
                     "-subj", "/CN=" + cn, "-addext", "basicConstraints=critical,CA:TRUE",
                     "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def cert(self, name, ca, cn, ext):
        self.ev.write(name + ".ext", "basicConstraints=CA:FALSE\n" + ext)
        self.openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                     "-nodes", "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn)
        self.openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey",
                     ca + ".key", "-CAcreateserial", "-out", name + ".pem", "-days", "2",
                     "-extfile", name + ".ext")

    def make(self):
        for n in ("1", "2"):
            self.ca("ca" + n, "hatchkv reload CA " + n)
            # (clientAuth too: etcd's JSON gateway dials its own gRPC port with it)
            self.cert("etcd" + n, "ca" + n, "etcd " + n, "subjectAltName=IP:127.0.0.1\n"
                      "extendedKeyUsage=serverAuth,clientAuth\n")
            self.cert("client" + n, "ca" + n, "hkv-reload-client-" + n,
                      "extendedKeyUsage=clientAuth\n")
        with open(self.ev.path("ca12.pem"), "w") as f:
            for n in ("1", "2"):
                with open(self.ev.path("ca%s.pem" % n)) as g:
                    f.write(g.read())


class Etcd:
    """One etcd on fixed loopback ports, restartable on its data dir."""

    def __init__(self, ev, binary):
        self.ev, self.bin = ev, binary
        self.cp, self.pp = free_port(), free_port()
        while self.pp == self.cp:
            self.pp = free_port()
        self.url = "https://127.0.0.1:%d" % self.cp

    def start(self, cert, trusted, ca, client, user=None):
        url, peer = self.url, "http://127.0.0.1:%d" % self.pp
        self.ev.spawn("etcd", [self.bin, "--name", "r", "--data-dir", self.ev.path("etcd-data"),
                               "--listen-client-urls", url, "--advertise-client-urls", url,
                               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                               "--initial-cluster", "r=" + peer, "--initial-cluster-state", "new",
                               "--logger", "zap", "--log-level", "error",
                               "--cert-file", self.ev.path(cert + ".pem"),
                               "--key-file", self.ev.path(cert + ".key"),
                               "--trusted-ca-file", self.ev.path(trusted),
                               "--client-cert-auth=false"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            rc, out = self.ctl(ca, client, user, "endpoint", "health")
            if rc == 0:
                return
            if self.ev.procs["etcd"].poll() is not None:
                break
            time.sleep(0.1)
        raise Failed("etcd did not come up:\n%s\n%s" % (out, self.ev.log("etcd")[-1500:]))

    def ctl(self, ca, client, user, *args, stdin=None):
        env = dict(os.environ, ETCDCTL_API="3")
        argv = ["etcdctl", "--endpoints", self.url, "--cacert", self.ev.path(ca),
                "--cert", self.ev.path(client + ".pem"), "--key", self.ev.path(client + ".key"),
                "--dial-timeout", "2s", "--command-timeout", "5s"]
        if user:
            argv += ["--user", user]
        r = subprocess.run(argv + list(args), env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=20,
                           input=(stdin or "").encode())
        return r.returncode, r.stdout.decode(errors="replace")

    def member_lease(self, prefix, ca, client, user, name):
        """The lease a member's key is under (None: no such key)."""
        rc, out = self.ctl(ca, client, user, "get", "%s/servers/%s" % (prefix, name),
                           "-w", "fields")
        m = re.search(r'"Lease" : (\d+)', out)
        return int(m.group(1)) if rc == 0 and m and int(m.group(1)) else None


MEMBER_CONF = """cluster = {uri}
id = m1
cache
lease-ttl = {ttl}
partitions = 8
transport = shm
socket = {sock}
token-file = {tok}
memory = 32M
segment-size = 256K
etcd-cacert = {ca}
etcd-cert = {cert}.pem
etcd-key = {cert}.key
etcd-user = root
etcd-password-file = {pw}
"""
MC_CLUSTER_CONF = """server = {uri}
token-file = {tok}
port = 0
threads = 1
etcd-cacert = {ca}
etcd-cert = {cert}.pem
etcd-key = {cert}.key
etcd-user = root
etcd-password-file = {pw}
"""


def part_c(ev):
    binary = find_etcd()
    if not binary or not shutil.which("etcdctl") or not shutil.which("openssl"):
        print("SKIP part c: needs etcd, etcdctl and openssl (scripts/install-deps)", flush=True)
        return
    Certs(ev).make()
    etcd = Etcd(ev, binary)
    etcd.start("etcd1", "ca12.pem", "ca1.pem", "client1")
    pw1, pw2 = "reload-pw-one", "reload-pw-two"
    for args in (("user", "add", "root", "--new-user-password", pw1, "--interactive=false"),
                 ("auth", "enable")):
        rc, out = etcd.ctl("ca1.pem", "client1", None, *args)
        check(rc == 0, "etcdctl %s%s" % (" ".join(args[:2]), "" if rc == 0 else ": " + out))
    ev.write("pw1", pw1 + "\n")
    ev.write("pw2", pw2 + "\n")
    prefix = "/hkvreload"
    uri = "etcd://127.0.0.1:%d%s" % (etcd.cp, prefix)
    sock, tok = ev.path("m1.sock"), ev.path("token")
    old = dict(uri=uri, ttl=LEASE_TTL, sock=sock, tok=tok, ca=ev.path("ca1.pem"),
               cert=ev.path("client1"), pw=ev.path("pw1"))
    new = dict(old, ca=ev.path("ca12.pem"), cert=ev.path("client2"), pw=ev.path("pw2"))
    ev.write("m1.conf", MEMBER_CONF.format(**old))
    ev.write("mc.conf", MC_CLUSTER_CONF.format(**old))
    ev.spawn("m1", [ev.bin("hatchkv-server"), "--config", ev.path("m1.conf")])
    ev.wait_log("m1", r"server: ready")
    root1 = "root:" + pw1
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not etcd.member_lease(prefix, "ca1.pem", "client1",
                                                                root1, "m1"):
        time.sleep(0.2)
    lease = etcd.member_lease(prefix, "ca1.pem", "client1", root1, "m1")
    check(lease, "member m1 registered under lease %x (TLS of CA 1, user root)" % (lease or 0))
    ev.spawn("mc", [ev.bin("hatchkv-memcached"), "--config", ev.path("mc.conf")])
    port = mc_port(ev, "mc")
    deadline = time.monotonic() + 15
    while True:
        try:
            bad = sets_and_gets(port, "x", [10, 100])
        except OSError as e:
            bad = [str(e)]
        if not bad or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    check(not bad, "hatchkv-memcached stores and reads through the cluster")

    # a file that does not load: the context in use stays
    ev.write("junk.pem", "this is no certificate\n")
    ev.write("m1.conf", MEMBER_CONF.format(**dict(old, ca=ev.path("junk.pem"))))
    line, at = ev.hup("m1")
    text = ev.log("m1")[at:]
    check("junk.pem is not a PEM CA certificate" in text and
          "keep the TLS context in use" in text and "etcd TLS files kept" in line,
          "m1: a CA file that is no PEM: a line names it, the TLS context in use stays "
          "(%s)" % line.split("; ", 1)[-1])

    # the new files; then etcd accepts only them
    ev.write("m1.conf", MEMBER_CONF.format(**new))
    ev.write("mc.conf", MC_CLUSTER_CONF.format(**new))
    for name in ("m1", "mc"):
        line, at = ev.hup(name)
        check("etcd TLS files changed, etcd password changed" in line,
              "%s SIGHUP with new files: %s" % (name, line.split("SIGHUP: ", 1)[-1]))
    rc, out = etcd.ctl("ca1.pem", "client1", root1, "user", "passwd", "root",
                       "--interactive=false", stdin=pw2 + "\n")
    check(rc == 0, "etcd's root password changed (every token it gave is refused now)%s"
          % ("" if rc == 0 else ": " + out))
    ev.stop("etcd")
    t0 = time.monotonic()
    root2 = "root:" + pw2
    etcd.start("etcd2", "ca2.pem", "ca2.pem", "client2", root2)
    rc, _ = etcd.ctl("ca1.pem", "client1", root2, "get", "/x")
    check(rc != 0, "etcd restarted (%.1f s) with a certificate of CA 2, trusting CA 2 alone: "
          "the old files are refused" % (time.monotonic() - t0))
    # past the lease TTL: a member on the old files would have fenced itself
    # and lost its lease by now
    time.sleep(LEASE_TTL + 2 - (time.monotonic() - t0))
    now_lease = etcd.member_lease(prefix, "ca2.pem", "client2", root2, "m1")
    log = ev.log("m1")
    check(now_lease == lease and "fenced" not in log and ev.procs["m1"].poll() is None,
          "m1 %.1f s after the restart: still a member under lease %x (now %s), never fenced"
          % (time.monotonic() - t0, lease, "%x" % now_lease if now_lease else "none"))
    check("authentication failed" not in log and "certificate verify failed" not in log,
          "m1 logged no authentication or certificate failure")
    bad = sets_and_gets(port, "y", [10, 100]) + sets_and_gets(port, "x", [10, 100])
    check(not bad and ev.procs["mc"].poll() is None,
          "hatchkv-memcached reads and writes through the cluster on the new files")
    ev.stop("mc")
    ev.stop("m1")


def main(bindir):
    ev = Env(bindir)
    t0 = time.monotonic()
    try:
        part_ab(ev)
        part_c(ev)
        print("# %.1f s" % (time.monotonic() - t0), flush=True)
        return 0
    except Failed as e:
        print("FAIL:", e, flush=True)
        for name in ("server", "mc", "m1", "etcd"):
            text = ev.log(name)
            if text:
                sys.stdout.write("---- %s.log ----\n%s\n" % (name, text[-2500:]))
        return 1
    finally:
        ev.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
