"""A hatchkv cluster on a 3-member etcd loses an etcd member (issue 29).

    python3 test_etcd3.py BINDIR

etcd is run as 3 members so that losing one changes nothing; before, the
cluster URI named one endpoint ("etcd://h1:2379,h2:2379/x" was a bad URI),
so losing that member was losing etcd. Here: a 3-member etcd on loopback
(the etcd binary: Debian's etcd-server; $HKV_ETCD_BIN overrides), two
cache-mode hatchkv servers and hatchkv-memcached, all given the three
endpoints, the one to be killed first. 1000 items are stored; then that
member - a follower, so that no leader election stalls etcd meanwhile - is
SIGKILLed. For three lease TTLs afterwards the cluster must serve every item
(no server fenced or emptied its region: its keepalives went on through the
other endpoints), take new sets, and `hatchkv-admin members` (on the same
three endpoints) must list both servers.

Every process started here is killed at the end; the temp dir is removed.
Exit 0: passed, 1: failed, 77: no etcd binary (skipped).
"""
import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
from mc_harness import Mc, find_etcd, free_port  # noqa: E402

LEASE_TTL = 3
KEYS = 1000


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print("ok  ", what, flush=True)


def post(url, obj, timeout=2):
    req = urllib.request.Request(url, data=json.dumps(obj).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class Cluster:
    def __init__(self, bindir):
        self.bindir = bindir
        self.tmp = tempfile.mkdtemp(prefix="hkv-etcd3-")
        os.chmod(self.tmp, 0o700)
        self.procs = {}
        self.prefix = "/hkv3e%06d" % random.randrange(10 ** 6)

    def spawn(self, name, argv):
        f = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
        f.close()
        self.procs[name] = p
        return p

    def log(self, name):
        try:
            with open(os.path.join(self.tmp, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def start_etcd(self, etcd):
        names = ("e1", "e2", "e3")
        for attempt in range(3):
            ports = [(free_port(), free_port()) for _ in names]
            if len({p for pair in ports for p in pair}) != 6:
                continue
            cluster = ",".join("%s=http://127.0.0.1:%d" % (n, pp)
                               for n, (_, pp) in zip(names, ports))
            self.clients = ["http://127.0.0.1:%d" % cp for cp, _ in ports]
            for n, (cp, pp) in zip(names, ports):
                self.spawn(n, [etcd, "--name", n,
                               "--data-dir", os.path.join(self.tmp, "%s-%d" % (n, attempt)),
                               "--listen-client-urls", "http://127.0.0.1:%d" % cp,
                               "--advertise-client-urls", "http://127.0.0.1:%d" % cp,
                               "--listen-peer-urls", "http://127.0.0.1:%d" % pp,
                               "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % pp,
                               "--initial-cluster", cluster,
                               "--initial-cluster-state", "new",
                               "--logger", "zap", "--log-level", "error"])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and all(
                    self.procs[n].poll() is None for n in names):
                try:
                    if all(post(c + "/v3/kv/range",
                                {"key": base64.b64encode(b"/x").decode()})
                           is not None for c in self.clients):
                        self.names = names
                        return
                except OSError:
                    time.sleep(0.1)
            self.stop_all()
        raise Failed("a 3-member etcd did not come up:\n" + self.log("e1")[-1500:])

    def leader_status(self):
        """{name: (member_id, leader_id)} of the members that answer."""
        out = {}
        for n, c in zip(self.names, self.clients):
            if self.procs[n].poll() is not None:
                continue
            try:
                st = post(c + "/v3/maintenance/status", {})
                out[n] = (st["header"]["member_id"], st["leader"])
            except (OSError, KeyError, ValueError):
                pass
        return out

    def stop_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = {}


def run(bindir):
    etcd = find_etcd()
    if not etcd:
        print("SKIP: no etcd binary (install etcd-server; scripts/install-deps does)")
        return 77
    cl = Cluster(bindir)
    try:
        cl.start_etcd(etcd)
        st = cl.leader_status()
        leader = next(iter(st.values()))[1]
        victim = next(n for n, (mid, _) in st.items() if mid != leader)
        order = [victim] + [n for n in cl.names if n != victim]
        eps = ",".join(cl.clients[cl.names.index(n)][len("http://"):] for n in order)
        uri = "etcd://%s%s" % (eps, cl.prefix)
        print("# etcd members e1 e2 e3 (leader %s); the cluster URI %s names %s first, "
              "a follower" % (next(n for n, (mid, _) in st.items() if mid == leader), uri,
                              victim), flush=True)
        tok = os.path.join(cl.tmp, "token")
        fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (os.urandom(16).hex() + "\n").encode())
        os.close(fd)
        for sid in ("a", "b"):
            cl.spawn(sid, [os.path.join(bindir, "hatchkv-server"), "--cluster", uri, "--etcd-insecure", "--id",
                           sid, "--cache", "--lease-ttl", str(LEASE_TTL), "--partitions", "64",
                           "--token-file", tok, "-t", "shm", "-s",
                           os.path.join(cl.tmp, sid + ".sock"), "-m", "32M", "-S", "256K"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                "holds only its partitions: serves" in cl.log(s) or "map epoch" in cl.log(s)
                for s in ("a", "b")):
            time.sleep(0.1)
        time.sleep(0.5)
        cl.spawn("mc", [os.path.join(bindir, "hatchkv-memcached"), "--server", uri, "--etcd-insecure",
                        "--token-file", tok, "-p", "0", "-t", "2"])
        deadline = time.monotonic() + 30
        port = None
        while time.monotonic() < deadline and not port:
            for ln in cl.log("mc").splitlines():
                if "listening on" in ln:
                    port = int(ln.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
            time.sleep(0.1)
        check(port, "hatchkv-memcached serves the cluster")
        mc = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                mc = Mc(port, 5)
                if mc.set("warm", b"1"):
                    break
            except OSError:
                pass
            if mc:
                mc.close()
                mc = None
            time.sleep(0.2)
        check(mc is not None, "a first set through the cluster")
        refused = [i for i in range(KEYS) if not mc.set("k%d" % i, b"v%d" % i)]
        check(not refused, "%d sets stored (%d refused)" % (KEYS, len(refused)))
        check(all(mc.get("k%d" % i) == b"v%d" % i for i in range(KEYS)),
              "%d items stored and read back" % KEYS)

        cl.procs[victim].kill()
        cl.procs[victim].wait()
        t_kill = time.monotonic()
        print("# %s SIGKILLed" % victim, flush=True)
        missing, failed_sets, rounds = 0, 0, 0
        while time.monotonic() - t_kill < 3 * LEASE_TTL:
            rounds += 1
            for i in range(0, KEYS, 50):
                if mc.get("k%d" % i) != b"v%d" % i:
                    missing += 1
            failed_sets += not mc.set("after%d" % rounds, b"x")
            time.sleep(0.2)
        print("# %.1f s after the kill: %d rounds of reads, %d misses, %d failed sets"
              % (time.monotonic() - t_kill, rounds, missing, failed_sets), flush=True)
        check(missing == 0, "every item stays readable (no server fenced or emptied)")
        check(failed_sets == 0, "every set after the kill stored")
        check(all(mc.get("k%d" % i) == b"v%d" % i for i in range(KEYS)),
              "all %d items read back at the end" % KEYS)
        for sid in ("a", "b"):
            text = cl.log(sid)
            check(cl.procs[sid].poll() is None and "emptied" not in text and
                  "lease of" not in text, "server %s ran on, kept its lease and region" % sid)
        out = subprocess.run([os.path.join(bindir, "hatchkv-admin"), "--etcd-insecure", "--cluster", uri,
                              "members"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=30)
        text = out.stdout.decode()
        check(out.returncode == 0 and "\na " in text and "\nb " in text,
              "hatchkv-admin members on the three endpoints lists a and b")
        mc.close()
        return 0
    except Failed as e:
        print("FAIL:", e, flush=True)
        for n in ("a", "b", "mc"):
            sys.stdout.write("---- %s.log ----\n%s\n" % (n, cl.log(n)[-2000:]))
        return 1
    finally:
        cl.stop_all()
        shutil.rmtree(cl.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
