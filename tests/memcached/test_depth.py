"""hatchkv-memcached with --depth: one worker serves many connections' requests
at once, each connection's own requests still in order.

One worker (-t 1) at --depth 8, 24 connections from threads at once: each
connection sets and reads back its own keys (values of many sizes), bumps
shared counters with incr and sends pipelined batches whose replies must come
back in request order; the counters end at the number of incrs acknowledged.
A connection that closes with requests in flight on lanes loses nothing for
the others. Then the same load at depth 1 and depth 8 side by side (printed,
not gated: on shm a round trip is a memory access, so overlap gains little).
"""
import socket
import sys
import threading
import time

from pymemcache.client.base import Client

from mc_harness import Daemons

CONNS = 24
ROUNDS = 60


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def pipelined(port, tag, n):
    """n set+get pairs in one write; the replies, in order."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    req = b"".join(b"set %s:%d 0 0 %d\r\n%s\r\nget %s:%d\r\n" %
                   (tag, i, len(b"v%d" % i), b"v%d" % i, tag, i) for i in range(n))
    s.sendall(req)
    want = b"".join(b"STORED\r\nVALUE %s:%d 0 %d\r\nv%d\r\nEND\r\n" %
                    (tag, i, len(b"v%d" % i), i) for i in range(n))
    got = b""
    while len(got) < len(want):
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    return got == want


def load(port, errors, acked, t):
    c = Client(("127.0.0.1", port), timeout=20, connect_timeout=20)
    try:
        for r in range(ROUNDS):
            size = (t * 131 + r * 977) % 20000 + 1
            key = "c%d:k%d" % (t, r % 7)
            val = bytes([65 + (t + r) % 26]) * size
            if not c.set(key, val, noreply=False):
                errors.append("set %s refused" % key)
            got = c.get(key)
            if got != val:
                errors.append("%s: read %r... (%d B), wrote %d B" %
                              (key, (got or b"")[:8], len(got or b""), size))
            if c.incr("ctr:%d" % (r % 3), 1) is not None:
                acked[r % 3] += 1
            if r % 20 == 0:
                many = c.get_many(["c%d:k%d" % (t, i) for i in range(7)])
                if any(k not in many for k in ("c%d:k%d" % (t, i) for i in range(min(r + 1, 7)))):
                    errors.append("get_many lost a key of c%d" % t)
                if not pipelined(port, b"p%d-%d" % (t, r), 50):
                    errors.append("pipelined replies of c%d out of order" % t)
    except Exception as e:  # noqa: BLE001 - a failed connection is the finding
        errors.append("connection %d: %r" % (t, e))
    finally:
        c.close()


def run_load(port):
    c = Client(("127.0.0.1", port), timeout=20)
    for i in range(3):
        c.set("ctr:%d" % i, b"0")
    errors, threads = [], []
    acked = [[0, 0, 0] for _ in range(CONNS)]
    t0 = time.monotonic()
    for t in range(CONNS):
        th = threading.Thread(target=load, args=(port, errors, acked[t], t))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    secs = time.monotonic() - t0
    counters = [int(c.get("ctr:%d" % i) or b"-1") for i in range(3)]
    want = [sum(a[i] for a in acked) for i in range(3)]
    stats = c.stats()
    c.close()
    return errors, counters, want, secs, stats


def main():
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    rates = {}
    for depth in (8, 1):
        with Daemons(mc_bin, srv_bin, threads=1, mc_extra=["--depth", str(depth)]) as d:
            errors, counters, want, secs, stats = run_load(d.port)
            ops = CONNS * ROUNDS * 3
            rates[depth] = ops / secs
            print("# depth %d, 1 worker, %d connections at once: %d requests (+ pipelined "
                  "batches) in %.2f s, %.0f req/s; %s" %
                  (depth, CONNS, ops, secs, rates[depth],
                   "; ".join(errors[:5]) if errors else "no error"))
            check(not errors, "depth %d: every value read back, every pipelined batch in "
                  "order, no connection failed" % depth)
            check(counters == want, "depth %d: shared counters %s = incrs acknowledged %s" %
                  (depth, counters, want))
            peak = int(stats[b"hkv_in_flight_peak"])
            print("# depth %d: at most %d requests in flight at once on the worker" % (depth, peak))
            check(peak > 1 if depth > 1 else peak == 1,
                  "depth %d: connections' requests ran on %d lanes at once" % (depth, peak))
            if depth > 1:
                # ms with the c flag returns the version of its own write, even with
                # another connection writing the key at the same time on another lane
                # (it used to be read back by a get: another write's version)
                got = {}

                def ms_loop(tag):
                    sk = socket.create_connection(("127.0.0.1", d.port), timeout=20)
                    req = b"".join(b"ms mk 3 c\r\n%s\r\n" % (tag * 3) for _ in range(300))
                    sk.sendall(req)
                    buf = b""
                    while buf.count(b"\r\n") < 300:
                        chunk = sk.recv(65536)
                        if not chunk:
                            break
                        buf += chunk
                    sk.close()
                    got[tag] = [ln.split(b" c")[1] for ln in buf.split(b"\r\n") if ln.startswith(b"HD c")]
                ta = threading.Thread(target=ms_loop, args=(b"a",))
                tb = threading.Thread(target=ms_loop, args=(b"b",))
                ta.start(), tb.start(), ta.join(), tb.join()
                sa, sb = set(got.get(b"a", [])), set(got.get(b"b", []))
                check(len(sa) == 300 and len(sb) == 300 and not sa & sb,
                      "ms c from two connections at once: 300 + 300 distinct versions, "
                      "none reported to both (%d shared)" % len(sa & sb))
                # a connection that goes away with its requests in flight: the others go on
                s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
                s.sendall(b"".join(b"set gone:%d 0 0 5\r\nvalue\r\n" % i for i in range(200)))
                s.close()
                c = Client(("127.0.0.1", d.port), timeout=10)
                check(c.set("after", b"ok", noreply=False) and c.get("after") == b"ok",
                      "a connection closed with 200 requests in flight: the daemon serves on")
                check(b"curr_connections" in c.stats(), "stats through a lane")
                c.close()
                check(d.mc.poll() is None, "hatchkv-memcached still running")
    print("# depth 8 / depth 1, one run: %.2fx" % (rates[8] / rates[1]))
    print("depth: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
