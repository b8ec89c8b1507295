"""A real client library (python3-pymemcache) through hatchkv-memcached:
set/get, TTL expiry, get_many, incr/decr, gets+cas, delete, add/replace,
append/prepend, binary values, many connections."""
import sys
import time

from pymemcache.client.base import Client

from mc_harness import Daemons


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def main():
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    with Daemons(mc_bin, srv_bin, threads=4) as d:
        c = Client(("127.0.0.1", d.port), timeout=10, connect_timeout=10)
        check(c.set("user:1", b"alice"), "set")
        check(c.get("user:1") == b"alice", "get reads back the value")
        blob = bytes(range(256)) * 40 + b"\r\nEND\r\n"
        c.set("bin", blob)
        check(c.get("bin") == blob, "binary value with \\r\\n inside (10 KiB)")
        big = b"B" * (1000 * 1000)
        c.set("big", big)
        check(c.get("big") == big, "1 MB value")
        # TTLs count whole seconds of the clock (as memcached's do): a TTL of 1 set
        # just before a second ticks over is gone a moment later, so look with 2.
        c.set("ttl", b"short", expire=2)
        check(c.get("ttl") == b"short", "value with expire=2 is there at once")
        time.sleep(3.2)
        check(c.get("ttl") is None, "value with expire=2 is gone after 3.2 s")
        c.set_many({"m1": b"1", "m2": b"2", "m3": b"3"})
        got = c.get_many(["m1", "m2", "m3", "missing"])
        check(got == {"m1": b"1", "m2": b"2", "m3": b"3"}, "get_many")
        # a multi-key get is one hkv_mget per 128 keys: one round trip for keys
        # this worker's handle knows, two for others (one by one it was 100 to
        # 200; 32 keys per hkv_mget, 4 to 8)
        many = {"many:%d" % i: b"v%d" % i for i in range(100)}
        c.set_many(many)
        rt0 = int(c.stats()[b"hkv_read_round_trips"])
        got = c.get_many(list(many))
        rt = int(c.stats()[b"hkv_read_round_trips"]) - rt0
        check(got == many and rt <= 2,
              "get_many of 100 keys: %d read round trips (<= 2)" % rt)
        c.set("ctr", b"10")
        check(c.incr("ctr", 5) == 15, "incr")
        check(c.decr("ctr", 20) == 0, "decr stops at 0")
        check(c.incr("nope", 1) is None, "incr of a missing key")
        val, cas = c.gets("user:1")
        check(val == b"alice" and cas is not None, "gets returns a cas unique")
        check(c.cas("user:1", b"bob", cas) is True, "cas with the current unique stores")
        check(c.cas("user:1", b"carol", cas) is False, "cas with a stale unique: EXISTS")
        check(c.get("user:1") == b"bob", "value after cas")
        check(c.add("user:1", b"x", noreply=False) is False, "add of an existing key")
        check(c.replace("nobody", b"x", noreply=False) is False, "replace of a missing key")
        c.append("user:1", b"!")
        c.prepend("user:1", b"<")
        check(c.get("user:1") == b"<bob!", "append / prepend")
        check(c.touch("user:1", 100, noreply=False) is True, "touch")
        check(c.delete("user:1", noreply=False) is True, "delete")
        check(c.get("user:1") is None, "deleted key is gone")
        check(c.delete("user:1", noreply=False) is False, "delete of a missing key")
        clients = [Client(("127.0.0.1", d.port), timeout=10) for _ in range(40)]
        for i, cl in enumerate(clients):
            cl.set("conn%d" % i, str(i).encode(), noreply=False)  # visible before the reads
        check(all(clients[(i + 7) % 40].get("conn%d" % i) == str(i).encode()
                  for i in range(40)), "40 connections across 4 workers")
        stats = c.stats()
        check(int(stats[b"curr_connections"]) >= 41 and b"hkv_rt_get" in stats,
              "stats: curr_connections %s, hkv_rt_get %s" % (stats[b"curr_connections"],
                                                             stats[b"hkv_rt_get"]))
        c.flush_all()
        check(c.get("m1") is None and c.get("ctr") is None, "flush_all")
        for cl in clients:
            cl.close()
        c.close()
    # A caching tier: a full store evicts like memcached instead of failing.
    with Daemons(mc_bin, srv_bin, threads=2, memory="8M", cache=True) as d:
        c = Client(("127.0.0.1", d.port), timeout=10, connect_timeout=10)
        val = b"v" * 1000
        n = 20000  # ~20 MB of values into an 8 MB store
        failed = sum(1 for i in range(n) if not c.set("k%d" % i, val, noreply=False))
        stats = c.stats()
        recent = sum(1 for i in range(n - 100, n) if c.get("k%d" % i) == val)
        wrong = sum(1 for i in range(0, n, 97) if c.get("k%d" % i) not in (None, val))
        check(failed == 0 and int(stats[b"evictions"]) > 0 and recent == 100 and wrong == 0,
              "cache mode: %d sets of 1000 B into 8 MB, %d refused, %d evictions, "
              "%d of the last 100 present, %d wrong values" % (n, failed, stats[b"evictions"],
                                                               recent, wrong))
        c.close()
    print("pymemcache: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
