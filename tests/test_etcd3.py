"""A hatchkv cluster on a 3-member etcd loses an etcd member (issue 29, item 1).

    python3 test_etcd3.py BINDIR [follower|leader]

etcd is run as 3 members so that losing one changes nothing; before, the
cluster URI named one endpoint ("etcd://h1:2379,h2:2379/x" was a bad URI),
so losing that member was losing etcd. Here: a 3-member etcd on loopback
(the etcd binary: Debian's etcd-server; $HKV_ETCD_BIN overrides; data dirs
on tmpfs - /dev/shm - so that no disk stall times an election;
--heartbeat-interval 100 --election-timeout 1000, etcd's defaults, stated),
two cache-mode hatchkv servers (lease TTL 3 s) and hatchkv-memcached, all
given the three endpoints. 1000 items are stored first.

follower (the default): the member named first in the URI - a follower, so
  that no leader election stalls etcd meanwhile - is SIGKILLed. For three
  lease TTLs afterwards the cluster must serve every item (no server fenced
  or emptied its region: its keepalives went on through the other
  endpoints) and take new sets: a follower's loss costs nothing at all.

leader: the member etcd names its leader (/v3/maintenance/status; it is
  named first in the URI, so every client's first call goes to it) is lost
  under a steady load - one connection setting new keys and reading the
  stored items back, ~2 ms apart:
  1. the leader is SIGKILLed; once a new leader is elected and the load has
     run for three lease TTLs, the killed member is started again on its
     data dir and rejoins;
  2. the leader (a new one) is SIGSTOPped for STOP_S (4 s: longer than any
     election, and than the hatchkv lease, so a keepalive or a read stuck
     on the stopped member would show as a lost lease or a long gap), then
     SIGCONTed; the load runs on for two lease TTLs.
  In each phase: the longest gap between two successful operations is at
  most etcd's election time + 1 s - election time: each follower waits a
  random time in [election timeout, 2 x election timeout) without a
  heartbeat before it stands, so 2 x 1000 ms bounds one round; a split vote
  takes another, so if etcd took longer (measured: until a member that
  answers names a new leader, polled every 50 ms), that time - and the
  failed operations are counted and printed with the election time. At the end every acknowledged set reads
  back, as do the 1000 items; no hatchkv server emptied its region, none
  lost its lease to the kill, and to the stop at most once (etcd 3.4's stale
  leader revokes leases when it runs again: etcd-io/etcd#12528), each time
  registering again with its items kept; `hatchkv-admin members` on the three endpoints lists both.

Every process started here is killed at the end (stopped ones continued
first; they die with the test too, PR_SET_PDEATHSIG); the temp dirs are
removed (HKV_KEEP=DIR copies the logs there first; HKV_ETCD_LOG=info sets
etcd's log level). Exit 0: passed, 1: failed, 77: no etcd binary (skipped).
"""
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
from mc_harness import Mc, Procs, find_etcd, free_port  # noqa: E402

LEASE_TTL = 3
KEYS = 1000
ETCD_HEARTBEAT_MS = 100
ETCD_ELECTION_MS = 1000
ELECTION_S = 2 * ETCD_ELECTION_MS / 1000.0  # the longest one round of an election takes
GAP_SLACK_S = 1.0                           # issue 29: fail at most for the election + 1 s
STOP_S = 4.0


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


def tmpfs_dir():
    """A directory on tmpfs for etcd's data (its fsyncs cost nothing there)."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None  # (the default temp dir; said in the output)


class Cluster(Procs):
    """A 3-member etcd and the hatchkv cluster on it; the temp dir on tmpfs."""

    def __init__(self, bindir):
        super().__init__("hkv-etcd3-", dir=tmpfs_dir())
        self.bindir = bindir
        self.phases = []
        self.prefix = "/hkv3e%06d" % random.randrange(10 ** 6)

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
                               "--heartbeat-interval", str(ETCD_HEARTBEAT_MS),
                               "--election-timeout", str(ETCD_ELECTION_MS),
                               "--logger", "zap", "--log-level", os.environ.get("HKV_ETCD_LOG", "error")])
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

    def restart_etcd(self, name):
        """Start a killed member again on its data dir (it rejoins as it was)."""
        self.spawn(name, self.argv[name], log=name + "-again")

    def leader_status(self, timeout=2):
        """{name: (member_id, leader_id)} of the members that answer."""
        out = {}
        for n, c in zip(self.names, self.clients):
            if self.procs[n].poll() is not None or n in self.stopped:
                continue
            try:
                st = post(c + "/v3/maintenance/status", {}, timeout)
                out[n] = (st["header"]["member_id"], st.get("leader", "0"))
            except (OSError, KeyError, ValueError):
                pass
        return out

    def leader(self):
        """The name of the member every answering member calls leader, or None."""
        st = self.leader_status()
        ids = {lead for _, lead in st.values()}
        if len(ids) != 1 or "0" in ids:
            return None
        return next((n for n, (mid, _) in st.items() if mid in ids), None)

    def uri(self, first):
        order = [first] + [n for n in self.names if n != first]
        eps = ",".join(self.clients[self.names.index(n)][len("http://"):] for n in order)
        return "etcd://%s%s" % (eps, self.prefix)

    def start_hatchkv(self, uri):
        """Servers a and b and hatchkv-memcached on uri; an Mc and its port."""
        tok = os.path.join(self.tmp, "token")
        fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (os.urandom(16).hex() + "\n").encode())
        os.close(fd)
        for sid in ("a", "b"):
            self.spawn(sid, [os.path.join(self.bindir, "hatchkv-server"), "--cluster", uri,
                             "--etcd-insecure", "--id", sid, "--cache", "--lease-ttl",
                             str(LEASE_TTL), "--partitions", "64", "--token-file", tok, "-t",
                             "shm", "-s", os.path.join(self.tmp, sid + ".sock"), "-m", "32M",
                             "-S", "256K"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                "holds only its partitions: serves" in self.log(s) or "map epoch" in self.log(s)
                for s in ("a", "b")):
            time.sleep(0.1)
        time.sleep(0.5)
        self.spawn("mc", [os.path.join(self.bindir, "hatchkv-memcached"), "--server", uri,
                          "--etcd-insecure", "--token-file", tok, "-p", "0", "-t", "2"])
        deadline = time.monotonic() + 30
        port = None
        while time.monotonic() < deadline and not port:
            for ln in self.log("mc").splitlines():
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
        return mc, port

    def check_servers(self, uri, lost_ok=0):
        """Both servers ran on and kept their regions; no lease was lost, or
        (lost_ok) at most that many per server, each followed by a
        registration that kept the items (the map had not changed)."""
        for sid in ("a", "b"):
            text = self.log(sid)
            fences = [ln for ln in text.splitlines() if "fenced" in ln]
            if fences:
                print("# server %s fenced %d time(s): %s" % (sid, len(fences), fences[0]),
                      flush=True)
            lost = text.count("lease of")
            kept = text.count("keeping its items")
            if lost:
                print("# server %s lost its lease %d time(s), kept its items %d time(s)"
                      % (sid, lost, kept), flush=True)
            check(self.procs[sid].poll() is None and "emptied" not in text,
                  "server %s ran on and kept its region" % sid)
            check(lost <= lost_ok and kept >= lost,
                  "server %s: %d lease(s) lost (at most %d, each re-registered keeping its "
                  "items: %d)" % (sid, lost, lost_ok, kept))
        out = subprocess.run([os.path.join(self.bindir, "hatchkv-admin"), "--etcd-insecure",
                              "--cluster", uri, "members"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=30)
        text = out.stdout.decode()
        check(out.returncode == 0 and "\na " in text and "\nb " in text,
              "hatchkv-admin members on the three endpoints lists a and b")


def run_follower(cl):
    st = cl.leader_status()
    leader = next(iter(st.values()))[1]
    victim = next(n for n, (mid, _) in st.items() if mid != leader)
    uri = cl.uri(victim)
    print("# etcd members e1 e2 e3 (leader %s); the cluster URI %s names %s first, "
          "a follower" % (next(n for n, (mid, _) in st.items() if mid == leader), uri,
                          victim), flush=True)
    mc, _ = cl.start_hatchkv(uri)
    cl.kill(victim)
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
    cl.check_servers(uri)
    mc.close()


class Load(threading.Thread):
    """One connection: set L:<seq> (a new key each time), then get one of the
    stored items; every operation recorded as (end time, ok). Acknowledged
    sets are kept for the final read-back; a wrong value read is kept."""

    def __init__(self, port):
        super().__init__(name="load", daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.ops = []
        self.acked = []
        self.wrong = []
        self.crash = None
        self.seq = 0

    def op(self, c, fn):
        try:
            if c[0] is None:
                c[0] = Mc(self.port, 10)
            return fn(c[0])
        except OSError:
            if c[0]:
                c[0].close()
            c[0] = None
            return OSError

    def run(self):
        c = [None]
        try:
            while not self.stop.is_set():
                self.seq += 1
                k = "L:%d" % self.seq
                ok = self.op(c, lambda m: m.set(k, b"l%d" % self.seq)) is True
                self.ops.append((time.monotonic(), ok))
                if ok:
                    self.acked.append(self.seq)
                i = random.randrange(KEYS)
                got = self.op(c, lambda m: m.get("k%d" % i))
                if got is not OSError and got is not None and got != b"v%d" % i:
                    self.wrong.append(("k%d" % i, got))
                self.ops.append((time.monotonic(), got == b"v%d" % i))
                time.sleep(0.002)
        except BaseException as e:  # noqa: B902 (reported by the main thread)
            self.crash = repr(e)
        finally:
            if c[0]:
                c[0].close()

    def window(self, t0, t1):
        """(longest gap between successes in [t0, t1] from t0, its start - t0,
        failed ops, all ops)."""
        ops = [(t, ok) for t, ok in list(self.ops) if t0 <= t <= t1] + [(t1, True)]
        last, gap, at, failed = t0, 0.0, 0.0, 0
        for t, ok in ops:
            if ok:
                if t - last > gap:
                    gap, at = t - last, last - t0
                last = t
            else:
                failed += 1
        return gap, at, failed, len(ops) - 1


def wait_new_leader(cl, old, t_sig, limit=30):
    """Poll the others until one names a leader other than old: seconds after t_sig."""
    old_id = cl.status_ids[old]
    while time.monotonic() - t_sig < limit:
        st = cl.leader_status(timeout=0.5)
        if any(lead not in ("0", old_id) for n, (_, lead) in st.items() if n != old):
            return time.monotonic() - t_sig
        time.sleep(0.05)
    raise Failed("no new etcd leader within %d s" % limit)


def phase(cl, load, what, act, settle_s, cont_after=None):
    """Lose the leader by act(name) (and SIGCONT it cont_after s later, if
    given); measure the load over settle_s from the loss."""
    leader = None
    deadline = time.monotonic() + 20
    while not leader and time.monotonic() < deadline:
        leader = cl.leader()
        time.sleep(0.1)
    check(leader, "etcd has one leader before the %s" % what)
    cl.status_ids = {n: mid for n, (mid, _) in cl.leader_status().items()}
    time.sleep(1.0)  # (the load runs before the loss too)
    t_sig = time.monotonic()
    act(leader)
    print("# %s: the leader %s" % (what, leader), flush=True)
    elected = wait_new_leader(cl, leader, t_sig)
    if cont_after is not None:
        time.sleep(max(0.0, cont_after - (time.monotonic() - t_sig)))
        cl.sigcont(leader)
        print("# %s SIGCONTed %.1f s after its stop" % (leader, time.monotonic() - t_sig),
              flush=True)
    time.sleep(max(0.0, settle_s - (time.monotonic() - t_sig)))
    gap, at, failed, n = load.window(t_sig, time.monotonic())
    bound = max(ELECTION_S, elected) + GAP_SLACK_S
    print("# %s: a new leader %.2f s after; over %.1f s: %d ops, %d failed, longest gap "
          "between successes %.3f s from %.2f s (bound %.2f s: election %.2f s + 1 s; etcd "
          "--heartbeat-interval %d --election-timeout %d)"
          % (what, elected, settle_s, n, failed, gap, at, bound, max(ELECTION_S, elected),
             ETCD_HEARTBEAT_MS, ETCD_ELECTION_MS), flush=True)
    cl.phases.append((what, elected, n, failed, gap))
    check(load.crash is None and load.is_alive(), "the load runs on (%s)" % load.crash)
    check(not load.wrong, "no wrong value read (%s)" % load.wrong[:3])
    check(gap <= bound, "%s: operations failed for at most %.2f s (%.3f s)"
          % (what, bound, gap))
    return leader


def run_leader(cl):
    leader = None
    deadline = time.monotonic() + 20
    while not leader and time.monotonic() < deadline:
        leader = cl.leader()
        time.sleep(0.1)
    check(leader, "etcd has one leader")
    uri = cl.uri(leader)
    print("# etcd members e1 e2 e3 (leader %s, named first in the cluster URI %s)"
          % (leader, uri), flush=True)
    mc, port = cl.start_hatchkv(uri)
    load = Load(port)
    load.start()

    killed = phase(cl, load, "SIGKILL", cl.kill, 3 * LEASE_TTL)
    cl.check_servers(uri)  # (a killed leader costs no lease)
    cl.restart_etcd(killed)
    deadline = time.monotonic() + 30
    while len(cl.leader_status()) < 3 or not cl.leader():
        if time.monotonic() > deadline:
            raise Failed("%s did not rejoin:\n%s" % (killed, cl.log(killed + "-again")[-1500:]))
        time.sleep(0.1)
    print("# %s started again and rejoined" % killed, flush=True)
    phase(cl, load, "SIGSTOP %.0f s" % STOP_S, cl.sigstop, STOP_S + 2 * LEASE_TTL,
          cont_after=STOP_S)
    load.stop.set()
    load.join(30)
    lost = [s for s in load.acked if mc.get("L:%d" % s) != b"l%d" % s]
    check(not lost, "all %d acknowledged sets read back (%d lost, e.g. %s)"
          % (len(load.acked), len(lost), lost[:5]))
    check(all(mc.get("k%d" % i) == b"v%d" % i for i in range(KEYS)),
          "all %d items read back at the end" % KEYS)
    # etcd 3.4 (Debian 12: 3.4.23) lets a leader that was stopped revoke the
    # leases it thinks expired once it runs again, after a new leader has
    # renewed them (etcd-io/etcd#12528, #15247; fixed in 3.4.28, #16822): a
    # server may then lose its lease once. It must register again and keep
    # its items, the map being the one it served under.
    cl.check_servers(uri, lost_ok=1)
    mc.close()


def run(bindir, mode):
    etcd = find_etcd()
    if not etcd:
        print("SKIP: no etcd binary (install etcd-server; scripts/install-deps does)")
        return 77
    cl = Cluster(bindir)
    try:
        print("# etcd --heartbeat-interval %d --election-timeout %d, data in %s%s"
              % (ETCD_HEARTBEAT_MS, ETCD_ELECTION_MS, cl.tmp,
                 "" if tmpfs_dir() else " (no /dev/shm: maybe not tmpfs)"), flush=True)
        cl.start_etcd(etcd)
        (run_leader if mode == "leader" else run_follower)(cl)
        return 0
    except Failed as e:
        print("FAIL:", e, flush=True)
        for n in ("a", "b", "mc"):
            sys.stdout.write("---- %s.log ----\n%s\n" % (n, cl.log(n)[-2000:]))
        return 1
    finally:
        cl.stop_all()
        if os.environ.get("HKV_KEEP"):
            shutil.copytree(cl.tmp, os.environ["HKV_KEEP"], dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("e?-[0-9]", "*.sock"))
        shutil.rmtree(cl.tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "follower"))
