"""hatchkv-memcached's bounds against a client that tries to make it use
unbounded memory or work (issue 12, item 5), each compared with Debian's
memcached where memcached defines the answer:

  - a 4 KB line naming one 1 MB item 1000 times, read slowly: the daemon's
    RSS stays within a few MiB of output per connection (the reply is
    streamed), and the reply, read in full, is exactly right;
  - a multi-get of 12 x 1 MB keys answers byte for byte as memcached does;
  - 300000 "flush_all <delay>" requests arm one pending flush, not 300000
    timers (RSS), and a later flush_all replaces or cancels a pending one as
    memcached's does;
  - 200 "stats" walk the index at most once per 5 s (hkv_index_walks);
  - -F: flush_all refused, as memcached -F answers it;
  - HTTP request lines ("GET / HTTP/1.0", ...): the connection closed without
    a reply, first line or later, exactly where memcached closes it
    (issue 13, item 3).

usage: test_limits.py HATCHKV_MEMCACHED HATCHKV_SERVER
"""
import socket
import sys
import time

from mc_harness import Daemons, RealMemcached

MB = 1000 * 1000


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def sanitized(pid):
    """Is the daemon an ASan build? (Its allocator keeps freed memory in
    quarantine, so its RSS says nothing about what the daemon holds.)"""
    with open("/proc/%d/maps" % pid) as f:
        return "libasan" in f.read()


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), 30)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(1 << 20)
            if not d:
                raise RuntimeError("closed")
            self.buf += d
        l, self.buf = self.buf.split(b"\r\n", 1)
        return l

    def exactly(self, n):
        while len(self.buf) < n:
            d = self.s.recv(1 << 20)
            if not d:
                raise RuntimeError("closed")
            self.buf += d
        d, self.buf = self.buf[:n], self.buf[n:]
        return d

    def until_end(self, end=b"END\r\n"):
        """Everything up to and including the line `end` (values included)."""
        out = b""
        while True:
            l = self.line()
            out += l + b"\r\n"
            if l.startswith(b"VALUE "):
                n = int(l.split(b" ")[3])
                out += self.exactly(n + 2)
            elif l + b"\r\n" == end or l.startswith(b"SERVER_ERROR") or l.startswith(b"CLIENT_ERROR"):
                return out

    def cmd(self, c):
        self.send(c + b"\r\n")
        return self.line()


def big_multiget(d):
    c = Conn(d.port)
    value = bytes((i * 7) & 0xff for i in range(MB))
    check(c.cmd(b"set big 0 0 %d\r\n" % MB + value) == b"STORED", "a 1 MB item stored")
    rss0 = rss_kb(d.mc.pid)
    c.send(b"get" + b" big" * 1000 + b"\r\n")  # a 4 KB line, 1000 x 1 MB of reply
    time.sleep(2.0)  # read nothing for a while
    rss1 = rss_kb(d.mc.pid)
    print("     daemon RSS %d KiB before, %d KiB with 1000 x 1 MB asked and unread" %
          (rss0, rss1))
    if sanitized(d.mc.pid):
        print("     (an ASan build: RSS not judged)")
    else:
        check(rss1 - rss0 < 64 * 1024, "RSS grows by < 64 MiB (was ~980 MiB when the reply "
              "was built whole)")
    got = 0
    for _ in range(1000):
        l = c.line()
        if l != b"VALUE big 0 %d" % MB:
            raise AssertionError("unexpected line %r" % l[:80])
        if c.exactly(MB + 2) != value + b"\r\n":
            raise AssertionError("value %d differs" % got)
        got += 1
    check(c.line() == b"END", "then all 1000 values arrive, exact, and END (%d)" % got)
    check(c.cmd(b"mn") == b"MN", "the connection goes on")


def compare_multiget(d, ref):
    a, b = Conn(ref.port), Conn(d.port)
    cmd = b"get" + b"".join(b" m%d" % i for i in range(12)) + b" missing\r\n"
    for c in (a, b):
        for i in range(12):
            v = bytes(((i + j) * 13) & 0xff for j in range(MB - 100 * i))
            if c.cmd(b"set m%d %d 0 %d\r\n" % (i, i, len(v)) + v) != b"STORED":
                raise AssertionError("set")
        c.send(cmd)
    ra, rb = a.until_end(), b.until_end()
    check(ra == rb and len(ra) > 11 * MB,
          "a multi-get of 12 x ~1 MB answers as memcached does (%d bytes)" % len(rb))


def flush_timers(d, ref):
    c = Conn(d.port)
    rss0 = rss_kb(d.mc.pid)
    burst = b"flush_all 100000 noreply\r\n" * 10000
    for _ in range(30):  # 300000 delayed flushes
        c.send(burst)
    check(c.cmd(b"mn") == b"MN", "300000 flush_all <delay> taken")
    rss1 = rss_kb(d.mc.pid)
    print("     daemon RSS %d KiB before, %d KiB after" % (rss0, rss1))
    if sanitized(d.mc.pid):
        print("     (an ASan build: RSS not judged)")
    else:
        check(rss1 - rss0 < 16 * 1024, "RSS grows by < 16 MiB (was +40 MiB, 300000 timers)")
    # one pending flush: a later one replaces it, an immediate one cancels it
    a, b = Conn(ref.port), Conn(d.port)
    # (memcached's flush time is delay-1..delay s away, by its 1 s clock: look
    # well clear of both)
    script = [b"set f1 0 0 1\r\nx", b"flush_all 2", b"flush_all 6", b"set f2 0 0 1\r\ny"]
    for c in (a, b):
        c.cmd(b"flush_all")
        for s in script:
            c.cmd(s)
    time.sleep(3.2)
    for c in (a, b):
        c.send(b"get f1 f2\r\n")
    ra, rb = a.until_end(), b.until_end()
    check(ra == rb and b"VALUE f1" in rb, "after 3.2 s a flush_all 2 replaced by flush_all 6 "
          "has not run (as memcached)")
    time.sleep(4.0)
    for c in (a, b):
        c.send(b"get f1 f2\r\n")
    ra, rb = a.until_end(), b.until_end()
    check(ra == rb == b"END\r\n", "after 7.2 s it has (as memcached)")
    for c in (a, b):
        c.cmd(b"set f3 0 0 1\r\nz")
        c.cmd(b"flush_all 2")
        c.cmd(b"flush_all")
        c.cmd(b"set f4 0 0 1\r\nw")
    time.sleep(3.0)
    for c in (a, b):
        c.send(b"get f3 f4\r\n")
    ra, rb = a.until_end(), b.until_end()
    check(ra == rb and b"VALUE f4" in rb and b"f3" not in rb,
          "an immediate flush_all cancels the pending one (as memcached)")


def cheap_stats(d):
    c = Conn(d.port)

    def walks():
        c.send(b"stats\r\n")
        for l in c.until_end().split(b"\r\n"):
            if l.startswith(b"STAT hkv_index_walks "):
                return int(l.split(b" ")[2])
        raise AssertionError("no hkv_index_walks")
    w0 = walks()
    t0 = time.time()
    for _ in range(200):
        w1 = walks()
    check(w1 - w0 <= 2 + int(time.time() - t0) // 5,
          "200 stats walked the index %d times in %.1f s (at most once per 5 s)" %
          (w1 - w0, time.time() - t0))


def no_flush(mc_bin, srv_bin):
    with RealMemcached(extra=["-F"]) as ref, Daemons(mc_bin, srv_bin, mc_extra=["-F"]) as d:
        a, b = Conn(ref.port), Conn(d.port)
        for cmd in (b"set k 0 0 1\r\nv", b"flush_all", b"flush_all 10", b"flush_all noreply",
                    b"mn", b"get k"):
            a.send(cmd + b"\r\n")
            b.send(cmd + b"\r\n")
            if cmd == b"get k":
                ra, rb = a.until_end(), b.until_end()
            elif cmd.endswith(b"noreply"):
                continue
            else:
                ra, rb = a.line(), b.line()
            if ra != rb:
                raise AssertionError("-F: %r: memcached %r, hatchkv %r" % (cmd, ra, rb))
        check(True, "-F: flush_all refused, the item kept, as memcached -F answers")


HTTP_PROBES = [b"GET / HTTP/1.0", b"PUT /x HTTP/1.1", b"DELETE HTTP/1.1", b"HEAD / HTTP/1.1",
               b"POST /a HTTP/1.1", b"HTTP/1.1", b"FOO HTTP/", b"GET / HTTP/2",
               b"get a HTTP/1.1", b"GET foo", b"G HTTP/1.1", b"GE HTTP/1.1", b"xHTTP/1.1",
               b"GET / http/1.0", b"GET / HTTP", b"GET /x HTTP/1.1 extra", b"incr HTTP/1.1",
               b"mg HTTP/1.1", b"FOO  HTTP/1.1"]


def answer(port, lines):
    """What a fresh connection gets for lines: the bytes, and whether it closed."""
    s = socket.create_connection(("127.0.0.1", port), 5)
    s.settimeout(0.5)
    s.sendall(b"".join(l + b"\r\n" for l in lines))
    got = b""
    try:
        while True:
            d = s.recv(4096)
            if not d:
                return got, "closed"
            got += d
    except socket.timeout:
        return got, "open"
    finally:
        s.close()


def http_lines(d, ref):
    for probe in HTTP_PROBES:
        for lines in ([probe], [b"version", probe]):
            ra, rb = answer(ref.port, lines), answer(d.port, lines)
            ra = (ra[0].replace(b"VERSION 1.6.18", b"VERSION"), ra[1])
            rb = (re_version(rb[0]), rb[1])
            if ra != rb:
                raise AssertionError("%r: memcached %r, hatchkv %r" % (lines, ra, rb))
    check(True, "%d HTTP-looking lines, first and second: closed (or answered) exactly as "
          "memcached" % len(HTTP_PROBES))


def re_version(b):
    i = b.find(b"VERSION 1.6.18-hatchkv-")
    if i < 0:
        return b
    j = b.find(b"\r\n", i)
    return b[:i] + b"VERSION" + b[j:]


def largest_value(port, key):
    """The largest value a server stores under key (binary search over set)."""
    c = Conn(port)
    lo, hi = 1000 * 1000, 1 << 20  # stored / refused (memcached -I 1m refuses 1 MiB)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c.send(b"set %s 0 0 %d noreply\r\n" % (key, mid) + b"v" * mid + b"\r\n")
        reply = c.cmd(b"mg %s s" % key)
        if reply.startswith(b"VA ") or reply.startswith(b"HD s%d" % mid):
            lo = mid
        else:
            hi = mid
        c.cmd(b"mn")
        c.send(b"delete %s noreply\r\n" % key)
    c.s.close()
    return lo


def item_boundary(d, ref):
    """-I bounds an item, not a value (issue 30): at the same -I (1m), a
    short key's largest value on hatchkv is at least memcached's, and a
    250-byte key's too; past it the answer is memcached's own."""
    for key in (b"k", b"K" * 250):
        m = largest_value(ref.port, key)
        h = largest_value(d.port, key)
        check(h >= m, "a %d-byte key: hatchkv-memcached stores values up to %d bytes, "
              "memcached (-I 1m) up to %d" % (len(key), h, m))
    c = Conn(d.port)
    over = (1 << 20) - 56  # block header 56 + key 1 + value: one byte past the segment
    c.send(b"set k 0 0 %d\r\n" % over + b"v" * over + b"\r\n")
    r = c.line()
    check(r == b"SERVER_ERROR object too large for cache",
          "one byte past the largest item: %r, as memcached says it" % r)
    c.s.close()


def refused_set_drops_old(mc_bin, srv_bin, ref):
    """A set whose item the server cannot hold - larger than a small
    region's segment (8 MB: 256 KiB), though under -I - is refused as
    memcached refuses one over -I, and like memcached's it drops the old
    value (no stale read after a failed set); ms too. memcached itself is
    asked the same with a value over its -I 1m."""
    cases = (("set", lambda k, n: b"set %s 0 0 %d\r\n" % (k, n)),
             ("ms", lambda k, n: b"ms %s %d\r\n" % (k, n)))
    with Daemons(mc_bin, srv_bin, threads=1, memory="8M", cache=True,
                 cache_segment=None) as small:
        for port, big in ((small.port, 300000), (ref.port, 2 << 20)):
            c = Conn(port)
            for name, head in cases:
                key = b"old-" + name.encode()
                c.send(b"set %s 0 0 3\r\nold\r\n" % key)
                check(c.line() == b"STORED", "%d: the old value stored" % port)
                c.send(head(key, big) + b"v" * big + b"\r\n")
                r = c.line()
                check(r == b"SERVER_ERROR object too large for cache",
                      "%d: %s of %d bytes refused: %r" % (port, name, big, r))
                c.send(b"get %s\r\n" % key)
                r = c.line()
                check(r == b"END", "%d: after the refused %s, get says %r (memcached: END)"
                      % (port, name, r))
            c.s.close()


def main():
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    with RealMemcached() as ref, Daemons(mc_bin, srv_bin, threads=2) as d:
        item_boundary(d, ref)
        big_multiget(d)
        compare_multiget(d, ref)
        flush_timers(d, ref)
        cheap_stats(d)
        http_lines(d, ref)
        refused_set_drops_old(mc_bin, srv_bin, ref)
    no_flush(mc_bin, srv_bin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
