"""A stall is not a loss; every timing rule holds across terms (issue 29, items 2, 3).

    python3 test_etcd_stall.py BINDIR

One private etcd (a single member, the etcd binary: Debian's etcd-server;
$HKV_ETCD_BIN overrides; --heartbeat-interval 100 --election-timeout 1000,
etcd's defaults, stated: a single member never holds an election), two
clusters on it under different prefixes, one after the other:

A. Cache mode: members a and b (--lease-ttl 3, shm), hatchkv-memcached on
   the cluster, 2000 items set. A background connection sets and reads back
   keys of its own all along and records each operation's time and outcome.
   1. etcd is SIGSTOPped for 8 s, then continued. Every member's lease
      lapses; each fences, registers again, finds the map at the revision it
      last read while its lease was alive and keeps its items ("the map is
      the one it served under ... keeping its items"; never "region
      emptied"). A new coordinator measures absences afresh, so no map
      change. Checks: both serve again, `hatchkv-admin members` lists both,
      all 2000 items read back, no wrong value read by the background
      connection; prints when sets failed and the longest gap between two
      acknowledged sets, and bounds it (STALL + GAP_SLACK).
   2. The other branch, with a real map change: only b is SIGSTOPped until
      the map no longer names b (its lease ended, the coordinator a waited
      the route lease + 0.5 s and moved b's partitions to itself). All 2000
      keys are set to new values (on a), b is continued: its lease is gone,
      the map is "not the one it served under", b empties its region, the
      partitions move back to it. Every key then reads its new value or
      misses (cache: a gave the partitions up by purging them) - never the
      value from before b stopped.

B. A replicated store (--replicas 2, store mode on --memory-file, lease TTL
   3 s, default route lease 1.5 s): servers x, y, s; x starts first and
   coordinates.
   1. s is SIGSTOPped until its member key is gone from etcd; x (leading)
      records "s gone since"; 0.15 s later x is SIGSTOPped until its key is
      gone, y coordinates; s and x are continued at once and register again
      within y's wait: nothing is dropped (checked: the map is unchanged).
   2. s is SIGSTOPped again until its key is gone (t_S); at once y is
      SIGSTOPped and its lease revoked through etcd's gateway (its lease
      ends at a known moment, right after s's: the ordering in the issue,
      without waiting on a lease's TTL), so x coordinates again (t_X); y is
      continued. The map is polled until no list names s (t_drop). Before
      the fix x kept "s gone since" from its first term and dropped s at
      its first round (0.04-0.095 s after t_S); now it must wait at least
      the route lease after t_S (checked: t_drop - t_S >= route lease, and
      t_drop - t_X too; printed against route lease + 0.5 s).
   Then s is continued: it registers again and logs that the map is not
   the one it served under.

Every process started here is killed at the end (also on failure: they die
with the test, PR_SET_PDEATHSIG); stopped ones are continued first. The temp
dir is removed. Exit 0: passed, 1: failed, 77: no etcd binary (skipped).
"""
import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
from mc_harness import Mc, Procs, find_etcd, free_port  # noqa: E402
from mc_harness import wait_for as harness_wait_for  # noqa: E402

LEASE_TTL = 3
KEYS = 2000
STALL = 8.0
GAP_SLACK = 2.0        # the longest gap between acknowledged sets <= STALL + this
ROUTE_LEASE = 1.5      # the default (HKV_CLUSTER_ROUTE_LEASE_MS); read from the map if set
ETCD_HEARTBEAT_MS = 100
ETCD_ELECTION_MS = 1000


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print("ok  ", what, flush=True)


def wait_for(pred, timeout, what, step=0.05):
    return harness_wait_for(pred, timeout, what, step, Failed)


class Client:
    """A reconnecting Mc: set/get that answer None on any failure."""

    def __init__(self, port):
        self.port, self.c = port, None

    def _do(self, fn):
        try:
            if self.c is None:
                self.c = Mc(self.port)
            return fn(self.c)
        except OSError:
            if self.c:
                self.c.close()
            self.c = None
            raise

    def set(self, k, v):
        try:
            return self._do(lambda c: c.set(k, v))
        except OSError:
            return False

    def get(self, k):
        """(ok, value)"""
        try:
            return True, self._do(lambda c: c.get(k))
        except OSError:
            return False, None

    def close(self):
        if self.c:
            self.c.close()
            self.c = None


class Env(Procs):
    stop_wait_s = 5

    def __init__(self, bindir):
        super().__init__("hkv-stall-")
        self.bindir = bindir

    def tails(self, names, n=2500):
        for name in names:
            text = self.log(name)
            if text:
                sys.stdout.write("---- tail of %s.log ----\n%s\n" % (name, text[-n:]))

    # -- etcd -------------------------------------------------------------
    def start_etcd(self, etcd):
        for attempt in range(4):
            cport, pport = free_port(), free_port()
            if cport == pport:
                continue
            client, peer = "http://127.0.0.1:%d" % cport, "http://127.0.0.1:%d" % pport
            p = self.spawn("etcd", [etcd, "--name", "t",
                                    "--data-dir", os.path.join(self.tmp, "etcd%d" % attempt),
                                    "--listen-client-urls", client,
                                    "--advertise-client-urls", client,
                                    "--listen-peer-urls", peer,
                                    "--initial-advertise-peer-urls", peer,
                                    "--initial-cluster", "t=" + peer,
                                    "--heartbeat-interval", str(ETCD_HEARTBEAT_MS),
                                    "--election-timeout", str(ETCD_ELECTION_MS),
                                    "--logger", "zap", "--log-level", "error"])
            self.etcd_url, self.etcd_hostport = client, "127.0.0.1:%d" % cport
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    self.range("/ready")
                    return
                except OSError:
                    time.sleep(0.05)
            self.stop(["etcd"])
        raise Failed("etcd did not come up:\n" + self.log("etcd")[-1500:])

    def post(self, path, obj, timeout=2):
        req = urllib.request.Request(self.etcd_url + path, data=json.dumps(obj).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def range(self, key):
        """(value bytes, lease id str, mod_revision int) or None."""
        kvs = self.post("/v3/kv/range",
                        {"key": base64.b64encode(key.encode()).decode()}).get("kvs") or []
        if not kvs:
            return None
        kv = kvs[0]
        return (base64.b64decode(kv.get("value", "")), kv.get("lease", "0"),
                int(kv.get("mod_revision", 0)))

    def revoke(self, lease):
        try:
            self.post("/v3/lease/revoke", {"ID": lease})
        except urllib.error.HTTPError:
            self.post("/v3/kv/lease/revoke", {"ID": lease})

    def write_token(self):
        self.token = os.path.join(self.tmp, "token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (os.urandom(16).hex() + "\n").encode())
        os.close(fd)


def map_lists(m):
    names = m.get("names") or m.get("servers") or []
    out = []
    for entry in m.get("map") or []:
        entry = entry if isinstance(entry, list) else [entry]
        out.append([names[e] if isinstance(e, int) and e < len(names) else e for e in entry])
    return out


def read_map(env, prefix):
    r = env.range(prefix + "/map")
    return (json.loads(r[0]), r[2]) if r else (None, 0)


def gaps(times):
    times = sorted(times)
    best, at = 0.0, None
    for a, b in zip(times, times[1:]):
        if b - a > best:
            best, at = b - a, a
    return best, at


# -- A: cache mode -----------------------------------------------------------
class Load(threading.Thread):
    """set bg:<i> then get it back, continuously; records each pair as (start, the set's
    end, the get's end, set ok, get ok); keeps any wrong value read."""

    def __init__(self, port):
        super().__init__(name="load", daemon=True)
        self.c = Client(port)
        self.stop = threading.Event()
        self.ops = []
        self.wrong = []
        self.crash = None

    def run(self):
        try:
            seq = 0
            while not self.stop.is_set():
                seq += 1
                k, v = "bg:%d" % (seq % 50), b"%d" % seq
                t0 = time.monotonic()
                ok = self.c.set(k, v)
                t1 = time.monotonic()
                gok = False
                if ok:
                    gok, got = self.c.get(k)
                    if gok and got is not None and got != v:
                        self.wrong.append((k, v, got))
                    gok = gok and got == v
                self.ops.append((t0, t1, time.monotonic(), ok, gok))
                if not ok:
                    time.sleep(0.02)
            self.c.close()
        except BaseException as e:
            self.crash = repr(e)


def part_a(env):
    prefix = "/hkvstallA%06d" % random.randrange(10 ** 6)
    uri = "etcd://%s%s" % (env.etcd_hostport, prefix)
    srv, names = os.path.join(env.bindir, "hatchkv-server"), ("a", "b")
    print("# A: cache cluster %s, members a b, lease TTL %d s" % (uri, LEASE_TTL), flush=True)
    for sid in names:
        env.spawn(sid, [srv, "--cluster", uri, "--etcd-insecure", "--id", sid, "--cache",
                        "--lease-ttl", str(LEASE_TTL), "--partitions", "64",
                        "--token-file", env.token, "-t", "shm",
                        "-s", os.path.join(env.tmp, sid + ".sock"), "-m", "32M", "-S", "256K"])
    wait_for(lambda: all("server: ready" in env.log(s) or not env.alive(s) for s in names), 30,
             "a and b to be ready")
    check(all(env.alive(s) for s in names), "a and b run")

    def both_on_map():
        try:
            m, _ = read_map(env, prefix)
        except (OSError, ValueError):
            return False
        return m and {x for ls in map_lists(m) for x in ls} == set(names)
    wait_for(both_on_map, 30, "a map placing partitions on a and b")
    wait_for(lambda: not any("fenced" in env.log(s) and "serving again" not in env.log(s)
                             for s in names), 10, "a and b to serve the map")
    time.sleep(0.5)
    env.spawn("mc", [os.path.join(env.bindir, "hatchkv-memcached"), "--server", uri,
                     "--etcd-insecure", "--token-file", env.token, "-p", "0", "-t", "2"])
    port = None

    def listening():
        for ln in env.log("mc").splitlines():
            if "listening on" in ln:
                return int(ln.split("listening on ")[1].split()[0].rsplit(":", 1)[1])
        return None
    port = wait_for(listening, 30, "hatchkv-memcached to listen")
    c = Client(port)
    wait_for(lambda: c.set("warm", b"1"), 30, "a first set through the cluster", 0.2)
    refused = [i for i in range(KEYS) if not c.set("k%d" % i, b"v%d" % i)]
    check(not refused, "%d items set (%d refused)" % (KEYS, len(refused)))
    check(all(c.get("k%d" % i) == (True, b"v%d" % i) for i in range(KEYS)),
          "%d items read back" % KEYS)
    m0, rev0 = read_map(env, prefix)

    load = Load(port)
    load.start()
    time.sleep(1.5)
    serving0 = {s: env.log(s).count("serving again") for s in names}
    # 1. etcd stalls
    t_stop = time.monotonic()
    env.sigstop("etcd")
    print("# A1: etcd SIGSTOPped for %.0f s" % STALL, flush=True)
    time.sleep(STALL)
    env.sigcont("etcd")
    t_cont = time.monotonic()
    wait_for(lambda: all(env.log(s).count("serving again") > serving0[s] for s in names), 30,
             "a and b to serve again after the stall")
    t_serving = time.monotonic()
    out = subprocess.run([os.path.join(env.bindir, "hatchkv-admin"), "--etcd-insecure",
                          "--cluster", uri, "members"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=30)
    text = out.stdout.decode(errors="replace")
    check(out.returncode == 0 and all(any(ln.split()[:1] == [s] and "serving" in ln
                                          for ln in text.splitlines()) for s in names),
          "a and b serve again %.1f s after the SIGCONT; hatchkv-admin members lists both "
          "serving" % (t_serving - t_cont))
    # the load runs on until a set and a get succeed after both serve, then 2 s more
    wait_for(lambda: any(o[0] > t_serving and o[4] for o in list(load.ops)), 20,
             "a set+get of the load after the stall")
    time.sleep(2.0)
    t_end1 = time.monotonic()
    ops = [o for o in list(load.ops) if o[0] < t_end1]
    acks = [o[1] for o in ops if o[3]]
    fails = [o for o in ops if not o[3] or not o[4]]
    in_win = [o for o in fails if o[0] >= t_stop - 0.5]
    gap, gap_at = gaps([t_stop - 1.0] + [a for a in acks if a >= t_stop - 1.0] + [t_end1])
    first_ack_after = min((a for a in acks if a > t_cont), default=None)
    print("# A1: load: %d set+get pairs, %d failed (sets %d, gets %d); failures from %s to %s "
          "after the SIGSTOP (SIGCONT at +%.2f s); first acknowledged set %s after the "
          "SIGCONT; longest gap between two acknowledged sets %.3f s (from %+.2f s)" % (
              len(ops), len(fails), sum(not o[3] for o in ops),
              sum(o[3] and not o[4] for o in ops),
              "%+.2f s" % (in_win[0][0] - t_stop) if in_win else "-",
              "%+.2f s" % (in_win[-1][2] - t_stop) if in_win else "-", t_cont - t_stop,
              "%.2f s" % (first_ack_after - t_cont) if first_ack_after else "never",
              gap, (gap_at - t_stop) if gap_at else 0), flush=True)
    print("# A1: the failed pairs: %s; the slowest good set+get %.3f s" % (
        ", ".join("%s %.2f s (from %+.2f s)" % ("set" if not o[3] else "get",
                                                o[2] - o[0] if not o[3] else o[2] - o[1],
                                                (o[0] if not o[3] else o[1]) - t_stop)
                  for o in in_win[:6]) or "-",
        max((o[2] - o[0] for o in ops if o[4]), default=0)), flush=True)
    check(not load.crash, "the load thread ran (%s)" % load.crash)
    check(not load.wrong, "the load read no wrong value %s" % load.wrong[:5])
    check(not [o for o in fails if o[0] < t_stop - 0.5],
          "no operation failed before the stall")
    check(gap <= STALL + GAP_SLACK, "sets failed for at most the stall + %.1f s: the longest gap "
          "between acknowledged sets %.2f s (stall %.0f s)" % (GAP_SLACK, gap, STALL))
    for s in names:
        text = env.log(s)
        check("registered again" in text and
              "the map is the one it served under" in text and "keeping its items" in text,
              "%s registered again, found the map it served under and kept its items" % s)
        check("region emptied" not in text and "not the one" not in text,
              "%s never emptied its region" % s)
    m1, rev1 = read_map(env, prefix)
    check(rev1 == rev0, "the map did not change over the stall (revision %d)" % rev1)
    missing = []
    for i in range(KEYS):
        ok, got = c.get("k%d" % i)
        if not ok:
            ok, got = wait_for(lambda: (lambda r: r if r[0] else None)(c.get("k%d" % i)), 10,
                               "a get of k%d" % i, 0.2)
        if got != b"v%d" % i:
            missing.append((i, got))
    check(not missing, "all %d items read back after the stall (%d missing or wrong: %s)"
          % (KEYS, len(missing), missing[:5]))

    # 2. the other branch: b stopped until the map moves its partitions to a
    gone0 = env.log("b").count("not the one")
    t_b = time.monotonic()
    env.sigstop("b")

    def b_off_map():
        try:
            m, rev = read_map(env, prefix)
        except (OSError, ValueError):
            return None
        return (m, rev) if m and rev != rev0 and not any("b" in ls for ls in map_lists(m)) \
            else None
    m2, rev2 = wait_for(b_off_map, 20, "the map to move b's partitions (b stopped)")
    t_moved = time.monotonic()
    print("# A2: b SIGSTOPped; the map (revision %d) names b no more %.2f s later"
          % (rev2, t_moved - t_b), flush=True)
    refused = []
    for i in range(KEYS):
        if not c.set("k%d" % i, b"new%d" % i):
            if not wait_for(lambda: c.set("k%d" % i, b"new%d" % i), 10, "a set of k%d" % i, 0.1):
                refused.append(i)
    check(not refused, "while b is away all %d keys set to new values on a" % KEYS)
    serving_b = env.log("b").count("serving again")
    env.sigcont("b")
    t_bc = time.monotonic()
    wait_for(lambda: env.log("b").count("serving again") > serving_b, 30,
             "b to serve again after its SIGCONT")
    print("# A2: b serves again %.2f s after its SIGCONT" % (time.monotonic() - t_bc),
          flush=True)
    text = env.log("b")
    check(text.count("not the one") > gone0 and "region emptied" in text,
          "b found the map is not the one it served under and emptied its region")
    wait_for(lambda: c.set("probe", b"1"), 15, "a set after b returned", 0.1)
    newest = miss = 0
    stale, other = [], []
    for i in range(KEYS):
        ok, got = wait_for(lambda: (lambda r: r if r[0] else None)(c.get("k%d" % i)), 10,
                           "a get of k%d" % i, 0.1)
        if got == b"new%d" % i:
            newest += 1
        elif got is None:
            miss += 1
        elif got == b"v%d" % i:
            stale.append(i)
        else:
            other.append((i, got))
    m3, _ = read_map(env, prefix)
    print("# A2: after b returned (b on %d of %d lists again): %d keys read their new value, "
          "%d miss (moved back to b, purged by a), %d stale, %d other" % (
              sum("b" in ls for ls in map_lists(m3)), len(map_lists(m3)), newest, miss,
              len(stale), len(other)), flush=True)
    check(not stale and not other, "no key reads the value from before b stopped (stale %s)"
          % stale[:5])
    check(newest > 0, "keys a kept read their new values")
    load.stop.set()
    load.join(15)
    c.close()
    env.stop(["mc", "a", "b"])


# -- B: replicated store across terms ---------------------------------------
def part_b(env):
    prefix = "/hkvstallB%06d" % random.randrange(10 ** 6)
    uri = "etcd://%s%s" % (env.etcd_hostport, prefix)
    srv = os.path.join(env.bindir, "hatchkv-server")
    names = ("x", "y", "s")
    print("# B: replicated store %s, servers x y s, --replicas 2, lease TTL %d s"
          % (uri, LEASE_TTL), flush=True)

    def start(sid):
        d = os.path.join(env.tmp, sid)
        os.mkdir(d, 0o700)
        env.spawn(sid, [srv, "--cluster", uri, "--etcd-insecure", "--id", sid,
                        "--lease-ttl", str(LEASE_TTL), "--partitions", "64", "--replicas", "2",
                        "--memory-file", os.path.join(d, "region"), "--token-file", env.token,
                        "-t", "shm", "-s", os.path.join(d, "ctl.sock"), "-m", "32M",
                        "-S", "256K"])
    start("x")
    wait_for(lambda: "x coordinates" in env.log("x") or not env.alive("x"), 30,
             "x to coordinate")
    check(env.alive("x"), "x coordinates")
    start("y")
    start("s")
    wait_for(lambda: all("server: ready" in env.log(s) or not env.alive(s) for s in names), 30,
             "x, y, s to be ready")
    check(all(env.alive(s) for s in names), "x, y, s run")

    def full_map():
        try:
            m, rev = read_map(env, prefix)
        except (OSError, ValueError):
            return None
        if not m:
            return None
        ls = map_lists(m)
        return (m, rev) if all(len(x) == 2 for x in ls) and \
            {n for x in ls for n in x} == set(names) else None
    m0, rev0 = wait_for(full_map, 30, "the first map on x, y, s")
    route = (m0.get("route_lease_ms") or ROUTE_LEASE * 1000) / 1000.0
    on_s = sum("s" in ls for ls in map_lists(m0))
    check(on_s > 0, "the first map (revision %d): s on %d of %d lists, route lease %.1f s"
          % (rev0, on_s, len(map_lists(m0)), route))

    def key(sid):
        return env.range("%s/servers/%s" % (prefix, sid))

    def coord():
        r = env.range(prefix + "/coordinator")
        return r[0].decode() if r else None

    def key_gone(sid):
        return lambda: key(sid) is None

    # 1. x's first term records s gone; x loses its term; y coordinates
    env.sigstop("s")
    wait_for(key_gone("s"), 10, "s's member key to go (s stopped)", 0.02)
    check(coord() == "x", "s's lease ended while x coordinates")
    time.sleep(0.15)
    env.sigstop("x")
    t0 = time.monotonic()
    wait_for(key_gone("x"), 10, "x's member key to go (x stopped)", 0.02)
    wait_for(lambda: coord() == "y", 10, "y to coordinate", 0.02)
    t_y = time.monotonic()
    env.sigcont("s")
    env.sigcont("x")
    wait_for(lambda: key("s") and key("x"), 10, "s and x to register again", 0.02)
    t_back = time.monotonic()
    print("# B1: x's key went %.2f s after its SIGSTOP; y coordinates; s and x registered "
          "again %.2f s after that" % (t_y - t0, t_back - t_y), flush=True)
    time.sleep(route + 0.5 + 1.0)  # past y's wait: a drop would have happened by now
    m1, rev1 = read_map(env, prefix)
    check(rev1 == rev0 and coord() == "y",
          "nothing dropped while y coordinates (map revision %d), y still coordinates" % rev1)
    wait_for(lambda: all(env.log(s).count("serving again") >= 1 for s in ("s", "x")), 15,
             "s and x to serve again")

    # 2. s's lease ends again; y's lease ends right after; x coordinates again
    x_terms = env.log("x").count("x coordinates")
    env.sigstop("s")
    wait_for(key_gone("s"), 10, "s's member key to go again", 0.01)
    t_s = time.monotonic()
    env.sigstop("y")
    ylease = key("y")[1]
    env.revoke(ylease)
    wait_for(lambda: coord() == "x", 10, "x to coordinate again", 0.01)
    t_x = time.monotonic()
    env.sigcont("y")
    t_drop, polls = None, 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        polls += 1
        try:
            m, rev = read_map(env, prefix)
        except (OSError, ValueError):
            m = None
        if m and not any("s" in ls for ls in map_lists(m)):
            t_drop = time.monotonic()
            break
        time.sleep(0.01)
    check(t_drop is not None, "x dropped s from the replica lists (%d polls)" % polls)
    check(env.log("x").count("x coordinates") > x_terms, "x logged a second term")
    print("# B2: s's key gone at t_S; y's lease revoked, x coordinates at t_S+%.3f s; s dropped "
          "at t_S+%.3f s (t_X+%.3f s; route lease %.1f s, the wait route lease + 0.5 s = "
          "%.1f s)" % (t_x - t_s, t_drop - t_s, t_drop - t_x, route, route + 0.5), flush=True)
    check(t_drop - t_s >= route, "s dropped %.3f s after its lease ended: >= the route lease "
          "%.1f s" % (t_drop - t_s, route))
    check(t_drop - t_x >= route, "... and %.3f s after x coordinated again: >= the route lease"
          % (t_drop - t_x))
    n_before = env.log("s").count("not the one")
    env.sigcont("s")
    wait_for(lambda: env.log("s").count("not the one") > n_before or not env.alive("s"), 15,
             "s to register again and read the map")
    check(env.alive("s"), "s, continued, registered again: the map is not the one it served "
          "under")
    env.stop(["x", "y", "s"])


def main():
    if len(sys.argv) < 2:
        print("usage: test_etcd_stall.py BINDIR")
        return 1
    etcd = find_etcd()
    if not etcd:
        print("SKIP: no etcd binary (install etcd-server; scripts/install-deps does)")
        return 77
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    env = Env(sys.argv[1])
    t0 = time.monotonic()
    logs = ("etcd",)
    try:
        env.write_token()
        env.start_etcd(etcd)
        print("# etcd %s at %s: one member, --heartbeat-interval %d --election-timeout %d"
              % (etcd, env.etcd_url, ETCD_HEARTBEAT_MS, ETCD_ELECTION_MS), flush=True)
        logs = ("a", "b", "mc")
        part_a(env)
        logs = ("x", "y", "s")
        part_b(env)
        print("etcd_stall: all checks passed (%.1f s)" % (time.monotonic() - t0), flush=True)
        return 0
    except Failed as e:
        print("FAIL:", e, flush=True)
        env.tails(logs)
        return 1
    except BaseException:
        import traceback
        traceback.print_exc(file=sys.stdout)
        print("FAIL: the test raised", flush=True)
        env.tails(("a", "b", "mc", "x", "y", "s"))
        return 1
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(main())
