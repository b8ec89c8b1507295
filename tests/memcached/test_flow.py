"""Memory that flows, through hatchkv-memcached with a real client library
(python3-pymemcache), as a user of memcached lives (issue 13): one
long-running daemon in cache mode at the demo's size (256 MB, the server's
default segment size, 4 workers), used by program after program:

  1. one connection stores every size from 1 KB to 1 MB in 2 KB steps (the
     store turns over), then flush_all;
  2. 32 fresh connections each set a 4-byte value: none refused (the issue
     saw 24 of 32 answered "SERVER_ERROR out of memory" by a store holding
     nothing), all read back;
  3. every class boundary, both ways, in the emptied store: for key lengths
     1-250, set "9", incr 1 (-> 10, a byte longer), decr 1 (-> 9), and a
     value grown by append and prepend byte by byte across a 64 B boundary:
     never NOT_FOUND or NOT_STORED for a key that is there, never an error;
  4. 64 connections spread over the workers write values of random sizes
     with a 1 s TTL, wait for them to expire, write again, flush_all,
     write again: nothing refused, every live value reads back;
  5. the class-boundary walk once more, in a fresh daemon.

usage: test_flow.py HATCHKV_MEMCACHED HATCHKV_SERVER
"""
import random
import sys
import time

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError

from mc_harness import Daemons


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def client(d):
    return Client(("127.0.0.1", d.port), timeout=30, connect_timeout=10)


def fill_and_flush(d):
    c = client(d)
    n = refused = 0
    for size in range(1000, 1000 * 1000 + 1, 2000):
        try:
            c.set("fill-%d" % n, b"f" * size, noreply=False)
        except MemcacheServerError:
            refused += 1
        n += 1
    check(refused == 0, "program 1: %d sets of 1 KB-1 MB in 2 KB steps (%.0f MB), %d refused"
          % (n, n * 0.501, refused))
    check(c.flush_all(noreply=False), "program 1: flush_all")
    c.close()


def fresh_connections(d, n):
    conns = [client(d) for _ in range(n)]
    refused, slowest = 0, 0.0
    for i, c in enumerate(conns):
        t0 = time.time()
        try:
            if not c.set("fresh-%d" % i, b"four", noreply=False):
                refused += 1
        except MemcacheServerError as e:
            print("     set: %s" % e)
            refused += 1
        slowest = max(slowest, time.time() - t0)
    back = sum(conns[(i + 1) % n].get("fresh-%d" % i) == b"four" for i in range(n))
    check(refused == 0 and back == n,
          "program 2: %d fresh connections each set 4 B: %d refused, %d of %d read back "
          "(slowest set %.0f ms)" % (n, refused, back, n, slowest * 1000))
    for c in conns:
        c.close()


def boundary_walk(d, label):
    """incr/decr/append/prepend across every 64 B class boundary, by key length."""
    c = client(d)
    bad = []
    for klen in range(1, 251):
        key = ("b%d-" % klen + "x" * 250)[:klen]
        try:
            c.set(key, b"9", noreply=False)
            r1 = c.incr(key, 1)
            r2 = c.decr(key, 1)
            if r1 != 10 or r2 != 9:
                bad.append("%d: incr -> %r, decr -> %r" % (klen, r1, r2))
            c.set(key, b"a", noreply=False)
            for i in range(70):
                op = c.append if i % 2 else c.prepend
                if not op(key, b"z", noreply=False):
                    bad.append("%d: %s number %d: NOT_STORED" % (klen, op.__name__, i))
                    break
            v = c.get(key)
            if v is None or len(v) != 71:
                bad.append("%d: after 70 appends/prepends: %r" % (klen, v and len(v)))
        except MemcacheServerError as e:
            bad.append("%d: %s" % (klen, e))
    for b in bad[:10]:
        print("     key length " + b)
    check(not bad, "%s: incr/decr/append/prepend across class boundaries for key lengths "
          "1-250: %d wrong" % (label, len(bad)))
    c.close()


def many_connections(d, n):
    conns = [client(d) for _ in range(n)]
    rnd = random.Random(13)
    refused = 0
    for rnd_no, ttl in enumerate((1, 1, 0)):
        vals = {}
        for i, c in enumerate(conns):
            for j in range(8):
                size = int(2 ** rnd.uniform(3, 17))  # 8 B .. 128 KB
                key = "m%d-%d-%d" % (rnd_no, i, j)
                v = bytes([65 + (i + j) % 26]) * size
                try:
                    c.set(key, v, expire=ttl, noreply=False)
                    vals[key] = v
                except MemcacheServerError:
                    refused += 1
        if ttl:
            time.sleep(2.2)  # whole seconds of the clock: gone after 2 s
            gone = sum(conns[0].get(k) is None for k in vals)
            check(gone == len(vals), "program 4: %d values with a 1 s TTL gone after 2.2 s"
                  % gone)
        else:
            back = sum(conns[(hash(k) & 63) % n].get(k) == v for k, v in vals.items())
            check(back == len(vals), "program 4: %d of %d values read back"
                  % (back, len(vals)))
            conns[0].flush_all(noreply=False)
    check(refused == 0, "program 4: %d connections x 8 sets of 8 B-128 KB, 3 rounds (TTLs, "
          "then a flush): %d refused" % (n, refused))
    after = [c.set("after-%d" % i, b"x" * (i * 997 % 50000), noreply=False)
             for i, c in enumerate(conns)]
    check(all(after), "program 4: after the flush every connection stores again")
    for c in conns:
        c.close()


def main():
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    with Daemons(mc_bin, srv_bin, threads=4, cache=True, cache_segment=None) as d:
        fill_and_flush(d)
        fresh_connections(d, 32)
        boundary_walk(d, "program 3 (the store emptied after filling)")
        many_connections(d, 64)
    with Daemons(mc_bin, srv_bin, threads=4, cache=True, cache_segment=None) as d:
        boundary_walk(d, "program 5 (a fresh store)")


if __name__ == "__main__":
    main()
