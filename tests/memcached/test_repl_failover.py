"""A replicated hatchkv cluster (issue 15) behind hatchkv-memcached loses a server
under pymemcache traffic: no acknowledged write is lost.

    python3 test_repl_failover.py <hatchkv-memcached> <hatchkv-server>

A private etcd (the etcd binary: Debian's etcd-server; $HKV_ETCD_BIN overrides)
on free ports, 3 store-mode servers (ra, rb, rc; --replicas 2, lease TTL 3 s, each
on its own --memory-file) and hatchkv-memcached on the cluster. 3 client threads
set their own keys ("f:<thread>:<i>", value "<thread>:<i>:<seq>", overwriting
earlier keys at random) and now and then read one back; for each key the test
keeps the last value whose set was acknowledged (STORED) and the values tried
after it whose sets failed (SERVER_ERROR, a closed connection, a timeout: the
write may or may not have happened). 2 s in, rb is SIGKILLed; the traffic goes
on for at least the lease TTL + 5 s and until the cluster has settled (the
coordinator drops rb from every replica list ~2 s after its lease ends, then a
repair gives every short list a second server again, its final pass fenced;
meanwhile writes to those partitions may fail), then SETTLE_GRACE + QUIET_TAIL
more. The settling is read from etcd, not assumed from a time: on a loaded
machine the repair commits later.

A 4th connection only reads the writers' keys meanwhile. Every operation is
sorted by what rb was in its key's list of the first map (primary, backup, or
not holding it: the partition computed as hkv_cmap_partition does, SipHash-2-4
of the key under the map's hash_key), so the output shows which keys stalled.

Checks: every read (during the traffic and at the end, through hatchkv-memcached)
is the key's last acknowledged value or one tried after it - never an older one,
never one nobody wrote, never a miss for a key with an acknowledged value; the
failover ends within the traffic (no set fails in its last 1.5 s, rb is gone
from the map, every key can be set again); the survivors and hatchkv-memcached
still run, and hatchkv-memcached exits 0 on SIGTERM. Prints the counts and the
longest gap between two acknowledged sets (all threads together, and per
thread: the failover stall), the slowest operations by key class.

Every process started here (etcd, the servers, hatchkv-memcached) is killed at
the end, also on failure (and dies with the test: PR_SET_PDEATHSIG); the temp
dir is removed. Exit 0: passed, 1: failed.
"""
import base64
import json
import os
import random
import re
import struct
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

from mc_harness import Procs, find_etcd, free_port
from mc_harness import wait_for as harness_wait_for

LEASE_TTL = 3
IDS = ("ra", "rb", "rc")
VICTIM = "rb"
THREADS = 3
KEYS_PER_THREAD = 300
BEFORE_KILL = 2.0              # seconds of traffic before the SIGKILL
AFTER_KILL = LEASE_TTL + 5.0   # ... and after it
QUIET_TAIL = 1.5               # no set may fail in the traffic's last seconds
SETTLE_GRACE = 1.5             # after the settled map: clients reconnect (a retry lasts 1 s)
SETTLE_CAP = 45.0              # the cluster must settle this long after the kill
CLIENT_TIMEOUT = 15            # > the library's 5 s op timeout (a write may be retried)


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print("ok  ", what, flush=True)


def wait_for(pred, timeout, what):
    harness_wait_for(pred, timeout, what, 0.05, Failed)


class Cluster(Procs):
    """etcd + 3 replicated store servers + hatchkv-memcached, in a temp dir."""

    stop_wait_s = 5
    stop_in_turn = True

    def __init__(self, mc_bin, srv_bin):
        super().__init__("hkv-mc-repl-")
        self.mc_bin, self.srv_bin = mc_bin, srv_bin
        self.prefix = "/hkvmc%06d" % random.randrange(10 ** 6)

    # -- processes ----------------------------------------------------------
    def stop_order(self):
        """Clients first, etcd last."""
        return ["memcached"] + list(IDS) + ["etcd"]

    def tails(self, n=1500):
        for name in ["etcd"] + list(IDS) + ["memcached"]:
            text = self.log(name)
            if text:
                sys.stdout.write("---- tail of %s.log ----\n%s\n" % (name, text[-n:]))

    # -- etcd ---------------------------------------------------------------
    def start_etcd(self):
        etcd = find_etcd()
        if not etcd:
            raise Failed("no etcd binary (on PATH, /usr/bin/etcd or $HKV_ETCD_BIN): install "
                         "the package etcd-server (scripts/install-deps does)")
        for attempt in range(4):  # a port taken meanwhile: etcd exits, try others
            cport, pport = free_port(), free_port()
            if cport == pport:
                continue
            client, peer = "http://127.0.0.1:%d" % cport, "http://127.0.0.1:%d" % pport
            data = os.path.join(self.tmp, "etcd-data%d" % attempt)
            p = self.spawn("etcd", [etcd, "--name", "t", "--data-dir", data,
                                    "--listen-client-urls", client,
                                    "--advertise-client-urls", client,
                                    "--listen-peer-urls", peer,
                                    "--initial-advertise-peer-urls", peer,
                                    "--initial-cluster", "t=" + peer,
                                    "--logger", "zap", "--log-level", "error"])
            self.etcd_url = client
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    self.etcd_range("/hkvtest-ready")
                    self.uri = "etcd://127.0.0.1:%d%s" % (cport, self.prefix)
                    return
                except OSError:
                    time.sleep(0.05)
            if p.poll() is None:
                p.kill()
                p.wait()
        raise Failed("etcd (%s) did not come up:\n%s" % (etcd, self.log("etcd")[-1500:]))

    def etcd_range(self, key):
        """The value of key in etcd (bytes), or None: etcd's JSON gateway."""
        body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
        req = urllib.request.Request(self.etcd_url + "/v3/kv/range", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=2) as r:
            kvs = json.loads(r.read()).get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def read_map(self):
        raw = self.etcd_range(self.prefix + "/map")
        return json.loads(raw) if raw else None

    def settled(self, victim):
        """The map has victim on no list, every list full (--replicas 2), and no
        move (PREFIX/next) or repair (PREFIX/fill) is pending."""
        try:
            m = self.read_map()
            if not m or self.etcd_range(self.prefix + "/next") is not None or \
                    self.etcd_range(self.prefix + "/fill") is not None:
                return False
        except (OSError, ValueError):
            return False
        lists = map_lists(m)
        return bool(lists) and all(len(ls) == 2 and victim not in ls for ls in lists)

    # -- hatchkv ------------------------------------------------------------
    def write_token(self):
        self.token = os.path.join(self.tmp, "cluster.token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(16).hex() + "\n")

    def start_server(self, sid):
        d = os.path.join(self.tmp, sid)
        os.mkdir(d, 0o700)
        p = self.spawn(sid, [self.srv_bin, "--cluster", self.uri, "--etcd-insecure", "--id", sid,
                             "--lease-ttl", str(LEASE_TTL), "--partitions", "1024",
                             "--replicas", "2", "--memory-file", os.path.join(d, "region"),
                             "--token-file", self.token, "-t", "shm",
                             "-s", os.path.join(d, "ctl.sock"), "-m", "32M", "-S", "256K"])
        return p

    def start_memcached(self):
        p = self.spawn("memcached", [self.mc_bin, "--server", self.uri, "--etcd-insecure", "--token-file",
                                     self.token, "--port", "0", "--threads", "2"])
        pat = re.compile(r"listening on \S+:(\d+)")
        wait_for(lambda: pat.search(self.log("memcached")) or p.poll() is not None, 30,
                 "hatchkv-memcached to listen")
        if p.poll() is not None:
            raise Failed("hatchkv-memcached exited (%s):\n%s" % (p.returncode,
                                                                 self.log("memcached")))
        self.port = int(pat.search(self.log("memcached")).group(1))

    def role(self, key):
        """What the victim is in key's list of the first map."""
        ls = self.first_map["map"][partition_of(self.first_map, key)]
        return "primary" if ls[0] == VICTIM else "backup" if VICTIM in ls else "none"

    def client(self):
        return Client(("127.0.0.1", self.port), timeout=CLIENT_TIMEOUT,
                      connect_timeout=CLIENT_TIMEOUT)


_M64 = 0xffffffffffffffff


def _rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & _M64


def _sipround(v0, v1, v2, v3):
    v0 = (v0 + v1) & _M64
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _M64
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key, msg):
    """SipHash-2-4 (libsodium's crypto_shorthash, which hkv_cmap_hash uses)."""
    k0, k1 = struct.unpack("<QQ", key)
    v = [k0 ^ 0x736f6d6570736575, k1 ^ 0x646f72616e646f6d,
         k0 ^ 0x6c7967656e657261, k1 ^ 0x7465646279746573]
    n = len(msg)
    words = [struct.unpack_from("<Q", msg, i)[0] for i in range(0, n - n % 8, 8)]
    words.append(struct.unpack("<Q", msg[n - n % 8:] + b"\0" * (7 - n % 8) +
                               bytes([n & 0xff]))[0])
    for m in words:
        v[3] ^= m
        v = list(_sipround(*_sipround(*v)))
        v[0] ^= m
    v[2] ^= 0xff
    for _ in range(4):
        v = list(_sipround(*v))
    return v[0] ^ v[1] ^ v[2] ^ v[3]


assert siphash24(bytes(range(16)), bytes(range(15))) == 0xa129ca6149be45e5  # the paper's


def partition_of(m, key):
    """hkv_cmap_partition (common/cluster_map.c) of key under map m."""
    h = siphash24(bytes.fromhex(m["hash_key"]), key.encode())
    return (((h >> 22) & 0xffffffff) * m["partitions"]) >> 32


ROLES = ("primary", "backup", "none")  # what the victim was in a key's first list


def map_lists(m):
    """The replica lists of a map as parsed JSON, as lists of names (best effort:
    entries may be names or indexes into m["names"])."""
    names = m.get("names") or m.get("servers") or []
    out = []
    for entry in m.get("map") or []:
        entry = entry if isinstance(entry, list) else [entry]
        out.append([names[e] if isinstance(e, int) and e < len(names) else e for e in entry])
    return out


# -- the traffic --------------------------------------------------------------
class RoleStats:
    """Operations on keys by what the victim was in their list: count, failed,
    slowest, how many took over SLOW seconds."""
    SLOW = 0.25

    def __init__(self):
        self.s = {r: [0, 0, 0.0, 0] for r in ROLES}

    def add(self, role, ok, took):
        e = self.s[role]
        e[0] += 1
        e[1] += not ok
        e[2] = max(e[2], took)
        e[3] += took > self.SLOW

    def merge(self, other):
        for r in ROLES:
            a, b = self.s[r], other.s[r]
            a[0] += b[0]
            a[1] += b[1]
            a[2] = max(a[2], b[2])
            a[3] += b[3]
        return self

    def text(self):
        return "; ".join("%s %s: %d, %d failed, slowest %.3f s, %d over %g s" % (
            VICTIM, "primary" if r == "primary" else "backup" if r == "backup" else
            "not holding", *self.s[r], self.SLOW) for r in ROLES)


class KeyState:
    __slots__ = ("acked", "pending", "history")

    def __init__(self):
        self.acked = None    # the last value a set of this key got STORED for
        self.pending = []    # values whose sets failed after it (may have happened)
        self.history = []    # every value ever tried (to tell "older" from "never written")

    def allowed(self, v):
        return v == self.acked or v in self.pending


class Writer(threading.Thread):
    def __init__(self, cl, t, stop):
        super().__init__(name="writer%d" % t, daemon=True)
        self.cl, self.t, self.stop = cl, t, stop
        self.keys = {"f:%d:%d" % (t, i): KeyState() for i in range(KEYS_PER_THREAD)}
        self.names = list(self.keys)
        self.acked = self.failed = self.reads = self.read_errors = 0
        self.errors = {}
        self.ack_times, self.fail_times = [], []
        self.slowest = 0.0       # the longest set (acknowledged or not)
        self.sets_by_role, self.gets_by_role = RoleStats(), RoleStats()
        self.fail_latency = []   # how long each failed set took
        self.bad_reads = []
        self.crash = None

    def note_error(self, e):
        kind = type(e).__name__
        if isinstance(e, MemcacheError) and str(e):  # SERVER_ERROR's text
            kind += " (%s)" % str(e)[:60]
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def run(self):
        try:
            self.loop()
        except BaseException as e:  # a bug here must fail the test, not hang it
            self.crash = repr(e)

    def loop(self):
        rnd = random.Random(self.t)
        c = self.cl.client()
        seq = 0
        while not self.stop.is_set():
            i = seq if seq < KEYS_PER_THREAD else rnd.randrange(KEYS_PER_THREAD)
            key = self.names[i]
            st = self.keys[key]
            val = "%d:%d:%d" % (self.t, i, seq)
            st.history.append(val)
            seq += 1
            t_op = time.monotonic()
            try:
                ok = c.set(key, val.encode(), noreply=False)
            except (MemcacheError, OSError) as e:  # socket.timeout is an OSError
                ok = False
                self.note_error(e)
                if not isinstance(e, MemcacheError) or "Close" in type(e).__name__:
                    c.close()  # reconnects on the next command
            now = time.monotonic()
            self.slowest = max(self.slowest, now - t_op)
            self.sets_by_role.add(self.cl.role(key), ok, now - t_op)
            if ok:
                st.acked, st.pending = val, []
                self.acked += 1
                self.ack_times.append(now)
            else:
                st.pending.append(val)
                self.failed += 1
                self.fail_times.append(now)
                self.fail_latency.append(now - t_op)
            if seq % 4 == 0 and seq > KEYS_PER_THREAD:  # read one of ours back
                key = self.names[rnd.randrange(KEYS_PER_THREAD)]
                st = self.keys[key]
                t_op = time.monotonic()
                try:
                    got = c.get(key)
                except (MemcacheError, OSError) as e:
                    self.gets_by_role.add(self.cl.role(key), False, time.monotonic() - t_op)
                    self.read_errors += 1
                    self.note_error(e)
                    c.close()
                    continue
                self.gets_by_role.add(self.cl.role(key), True, time.monotonic() - t_op)
                self.reads += 1
                got = got.decode() if got is not None else None
                if not (got is None and st.acked is None) and not st.allowed(got):
                    self.bad_reads.append((key, got, st.acked, list(st.pending),
                                           now - t_kill[0] if t_kill[0] else None))
        c.close()


t_kill = [None]


class Reader(threading.Thread):
    """A connection of its own that only reads the writers' keys: does the daemon
    keep answering reads while the writers' sets wait on the lost server? Each
    value read must be one some writer tried for that key (or a miss)."""

    def __init__(self, cl, writers, stop):
        super().__init__(name="reader", daemon=True)
        self.cl, self.writers, self.stop = cl, writers, stop
        self.ok_times, self.errors, self.reads, self.slowest = [], 0, 0, 0.0
        self.unknown = []
        self.by_role = RoleStats()
        self.crash = None

    def run(self):
        try:
            rnd = random.Random(99)
            c = self.cl.client()
            while not self.stop.is_set():
                w = self.writers[rnd.randrange(len(self.writers))]
                key = w.names[rnd.randrange(KEYS_PER_THREAD)]
                t_op = time.monotonic()
                try:
                    got = c.get(key)
                except (MemcacheError, OSError):
                    self.by_role.add(self.cl.role(key), False, time.monotonic() - t_op)
                    self.errors += 1
                    c.close()
                    continue
                now = time.monotonic()
                self.by_role.add(self.cl.role(key), True, now - t_op)
                self.slowest = max(self.slowest, now - t_op)
                self.reads += 1
                self.ok_times.append(now)
                if got is not None and got.decode() not in w.keys[key].history:
                    self.unknown.append((key, got))
                time.sleep(0.001)
            c.close()
        except BaseException as e:
            self.crash = repr(e)


def classify(st, got):
    """None if got is fine for a key with state st, else what is wrong."""
    if got is None:
        return None if st.acked is None else "missing (acknowledged %r)" % st.acked
    if got == st.acked or got in st.pending:
        return None
    if got in st.history:
        return "older value %r (acknowledged %r, tried after it %r)" % (got, st.acked,
                                                                        st.pending)
    return "a value nobody wrote: %r (acknowledged %r)" % (got, st.acked)


def get_retry(c, key, tries=20):
    for _ in range(tries):
        try:
            v = c.get(key)
            return v.decode() if v is not None else None
        except (MemcacheError, OSError):
            c.close()
            time.sleep(0.25)
    raise Failed("get %s kept failing" % key)


def gaps(times):
    times = sorted(times)
    best, at = 0.0, None
    for a, b in zip(times, times[1:]):
        if b - a > best:
            best, at = b - a, a
    return best, at


def run(cl):
    cl.start_etcd()
    print("# etcd at %s, cluster %s" % (cl.etcd_url, cl.uri), flush=True)
    cl.write_token()
    for sid in IDS:
        cl.start_server(sid)
    for sid in IDS:
        wait_for(lambda: "server: ready" in cl.log(sid) or not cl.alive(sid), 30,
                 "hatchkv-server %s to be ready" % sid)
        if not cl.alive(sid):
            raise Failed("hatchkv-server %s exited:\n%s" % (sid, cl.log(sid)[-1500:]))
    t0 = time.monotonic()
    wait_for(lambda: cl.read_map() is not None, 30, "the first map in etcd")
    m = cl.read_map()
    lists = map_lists(m)
    on = {sid: sum(1 for ls in lists if sid in ls) for sid in IDS}
    check(m.get("replicas", 2) == 2 and lists and all(len(ls) == 2 for ls in lists),
          "the first map (%.1f s): %d partitions, each on 2 servers (lists holding ra %d, "
          "rb %d, rc %d)" % (time.monotonic() - t0, len(lists), on["ra"], on["rb"], on["rc"]))
    # A server refuses clients until it has settled on the first map (it logs
    # "serving again"); hatchkv-memcached started before that learns a largest
    # value of 0 bytes and refuses every set (a bug of its own), so wait for them.
    try:
        wait_for(lambda: all("server: serving again" in cl.log(sid) for sid in IDS), 10,
                 "the servers to serve the first map")
    except Failed as e:
        print("# %s: starting hatchkv-memcached anyway" % e)
    cl.first_map = m
    cl.start_memcached()
    c = cl.client()
    t0 = time.monotonic()
    last = None
    while True:  # the daemon's handles may still be reading the map
        try:
            if c.set("warmup", b"1", noreply=False):
                break
        except (MemcacheError, OSError) as e:
            last = e
            c.close()
        if time.monotonic() - t0 > 30:
            raise Failed("hatchkv-memcached never stored a first set in 30 s (last: %r):\n%s"
                         % (last, cl.log("memcached")[-1500:]))
        time.sleep(0.1)
    check(c.get("warmup") == b"1", "hatchkv-memcached on port %d serves the cluster (%.1f s)"
          % (cl.port, time.monotonic() - t0))

    stop = threading.Event()
    writers = [Writer(cl, t, stop) for t in range(THREADS)]
    reader = Reader(cl, writers, stop)
    t_start = time.monotonic()
    for w in writers:
        w.start()
    reader.start()
    time.sleep(BEFORE_KILL)
    coord = [sid for sid in IDS if "%s coordinates" % sid in cl.log(sid)]
    t_kill[0] = time.monotonic()
    cl.kill(VICTIM)
    print("# %s SIGKILLed %.1f s into the traffic (the coordinator: %s)" % (
        VICTIM, t_kill[0] - t_start, ", ".join(coord) or "?"), flush=True)
    time.sleep(AFTER_KILL)
    while not cl.settled(VICTIM) and time.monotonic() - t_kill[0] < SETTLE_CAP:
        time.sleep(0.1)
    t_settled = time.monotonic()
    check(cl.settled(VICTIM), "the cluster settled %.1f s after the kill: %s on no list, "
          "every list on 2 servers, no move or repair pending" % (t_settled - t_kill[0], VICTIM))
    time.sleep(SETTLE_GRACE + QUIET_TAIL)
    stop.set()
    t_end = time.monotonic()
    for w in writers + [reader]:
        w.join(CLIENT_TIMEOUT + 5)
    check(not any(w.is_alive() for w in writers + [reader]), "the client threads stopped")
    crashed = [w.crash for w in writers + [reader] if w.crash]
    check(not crashed, "no client thread crashed %s" % crashed)

    acked = sum(w.acked for w in writers)
    failed = sum(w.failed for w in writers)
    errors = {}
    for w in writers:
        for k, n in w.errors.items():
            errors[k] = errors.get(k, 0) + n
    all_acks = [x for w in writers for x in w.ack_times]
    all_fails = sorted(x for w in writers for x in w.fail_times)
    gap, gap_at = gaps([t_start] + all_acks + [t_end])
    per_thread = [gaps([t_start] + w.ack_times + [t_end])[0] for w in writers]
    print("# sets: %d acknowledged, %d failed (%s); in-traffic reads: %d, %d failed"
          % (acked, failed, ", ".join("%s %d" % kv for kv in sorted(errors.items())) or "-",
             sum(w.reads for w in writers), sum(w.read_errors for w in writers)))
    print("# longest gap between two acknowledged sets: %.3f s (all threads, from %+.2f s "
          "after the kill), per thread %s" % (
              gap, (gap_at - t_kill[0]) if gap_at else 0,
              ", ".join("%.3f s" % g for g in per_thread)))
    lat = sorted(x for w in writers for x in w.fail_latency)
    print("# slowest set: %.3f s; a failed set took %s" % (
        max(w.slowest for w in writers),
        "%.3f-%.3f s (median %.3f s)" % (lat[0], lat[-1], lat[len(lat) // 2]) if lat else "-"))
    rgap, rgap_at = gaps([t_start] + reader.ok_times + [t_end])
    print("# reader connection: %d reads, %d failed, slowest %.3f s, longest gap between "
          "two answered reads %.3f s (from %+.2f s after the kill)" % (
              reader.reads, reader.errors, reader.slowest, rgap,
              (rgap_at - t_kill[0]) if rgap_at else 0))
    sets = RoleStats()
    gets = RoleStats().merge(reader.by_role)
    for w in writers:
        sets.merge(w.sets_by_role)
        gets.merge(w.gets_by_role)
    print("# sets by key: " + sets.text())
    print("# gets by key: " + gets.text())
    if all_fails:
        print("# failed sets from %+.2f s to %+.2f s after the kill (traffic ended %+.2f s)"
              % (all_fails[0] - t_kill[0], all_fails[-1] - t_kill[0], t_end - t_kill[0]))
    else:
        print("# no set failed (the killed server held no partition written meanwhile?)")
    sys.stdout.flush()

    bad = [b for w in writers for b in w.bad_reads]
    for b in bad[:10]:
        print("#   bad read during the traffic: %s = %r (acknowledged %r, tried after %r), "
              "%s s after the kill" % b)
    check(not bad, "every read during the traffic: the last acknowledged value or one tried "
          "after it (%d reads)" % sum(w.reads for w in writers))
    check(not reader.unknown, "the reader connection read no value nobody wrote %s"
          % reader.unknown[:5])
    check(all(w.acked > 0 for w in writers) and failed < acked,
          "traffic: %d sets acknowledged, %d failed" % (acked, failed))

    # the final read-back, through hatchkv-memcached
    c = cl.client()
    wrong, checked, with_ack, pend = [], 0, 0, 0
    for w in writers:
        for key, st in w.keys.items():
            got = get_retry(c, key)
            checked += 1
            with_ack += st.acked is not None
            pend += got is not None and got != st.acked
            why = classify(st, got)
            if why:
                wrong.append("%s: %s" % (key, why))
    for x in wrong[:20]:
        print("#   " + x)
    check(not wrong, "%d keys read back (%d with an acknowledged value): each its last "
          "acknowledged value or one tried after it (%d of those), none older, none unknown, "
          "none missing; %d wrong" % (checked, with_ack, pend, len(wrong)))

    # the failover ended within the traffic
    late = [x for x in all_fails if x > t_end - QUIET_TAIL]
    check(not late, "no set failed in the traffic's last %.1f s (%d did)" % (QUIET_TAIL,
                                                                          len(late)))
    m = cl.read_map()
    lists = map_lists(m) if m else []
    check(lists and not any(VICTIM in ls for ls in lists),
          "%s is gone from every replica list (%d partitions now on one server)"
          % (VICTIM, sum(1 for ls in lists if len(ls) == 1)))
    check(cl.alive("memcached") and cl.alive("ra") and cl.alive("rc"),
          "hatchkv-memcached and the survivors ra, rc still run")
    refused = 0
    for w in writers:  # every partition has a live server: every key takes a write
        for key in w.names:
            for _ in range(3):
                try:
                    if c.set(key, b"final:" + key.encode(), noreply=False):
                        break
                except (MemcacheError, OSError):
                    c.close()
                time.sleep(0.1)
            else:
                refused += 1
    check(refused == 0, "every key set again after the failover (%d refused)" % refused)
    final = sum(1 for w in writers for key in w.names
                if get_retry(c, key) != "final:" + key)
    check(final == 0, "... and read back (%d wrong)" % final)
    c.close()
    # a clean stop (each of its cluster handles joins its etcd watcher: seconds)
    p = cl.procs["memcached"]
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        pass
    check(p.returncode == 0, "hatchkv-memcached stops on SIGTERM: exit %s after %.1f s"
          % (p.returncode, time.monotonic() - t0))
    return 0


def main():
    if len(sys.argv) < 3:
        print("usage: test_repl_failover.py <hatchkv-memcached> <hatchkv-server>")
        return 1
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))  # clean up on a ctest kill too
    cl = Cluster(mc_bin, srv_bin)
    t0 = time.monotonic()
    try:
        run(cl)
        print("repl_failover: all checks passed (%.1f s)" % (time.monotonic() - t0))
        return 0
    except Failed as e:
        print("FAIL:", e)
        cl.tails()
        return 1
    except BaseException:
        import traceback
        traceback.print_exc(file=sys.stdout)
        print("FAIL: the test raised")
        cl.tails()
        return 1
    finally:
        cl.close()


if __name__ == "__main__":
    sys.exit(main())
