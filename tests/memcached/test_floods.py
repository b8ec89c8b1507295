"""hatchkv-memcached under connection floods, at a descriptor limit of 256
(issue 28, item 6). Before: --conn-limit defaulted to 1024 whatever the limit,
so idle connections took every descriptor, accept() failed in a busy loop
(4.3 M log lines in 5 s) and a new client got no answer; the metrics port
(evhttp) kept a connection open as long as it sent a byte every few seconds.

  1. --conn-limit is sized below the limit (the log says how many); a client
     connected before the flood is served throughout;
  2. 400 idle connections to the memcached port: those past the limit are
     refused at once ("ERROR Too many open connections", as memcached says
     it), counted in rejected_connections; the log grows by a few lines a
     second; once they close, a new client is served at once;
  3. 300 connections to --metrics sending one header byte a second for 6 s:
     new clients (a connection each) are served every 250 ms within their
     timeout, the log stays quiet, and a scrape answers 200 afterwards.

usage: test_floods.py HATCHKV_MEMCACHED HATCHKV_SERVER
"""
import re
import socket
import sys
import time

from pymemcache.client.base import Client

from mc_harness import Daemons

NOFILE = 256


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what, flush=True)


def log_lines(d):
    """The daemon's log lines, but for its per-connection debug (none at info)."""
    return len(d.log("memcached.log").splitlines())


def start_conns(port, n):
    """n non-blocking TCP connections to 127.0.0.1:port (some may fail)."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def refused_lines(conns, wait_s):
    """How many of conns were answered with memcached's 'Too many' line and closed."""
    n = 0
    deadline = time.monotonic() + wait_s
    for s in conns:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if s.recv(100).startswith(b"ERROR Too many open connections"):
                n += 1
        except OSError:
            pass
    return n


def served(port, key, timeout=5):
    """A new client: set key, read it back. (ok, seconds)."""
    t0 = time.monotonic()
    c = Client(("127.0.0.1", port), connect_timeout=timeout, timeout=timeout)
    try:
        ok = c.set(key, key.encode(), noreply=False) and c.get(key) == key.encode()
    except (OSError, Exception) as e:  # pymemcache raises its own and socket errors
        print("#   a new client: %r" % e)
        ok = False
    finally:
        c.close()
    return ok, time.monotonic() - t0


def scrape(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), 2)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head = s.recv(64)
        s.close()
        return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else -1
    except (OSError, ValueError, IndexError):
        return -1


def main(mc_bin, srv_bin):
    with Daemons(mc_bin, srv_bin, threads=2, mc_nofile=NOFILE,
                 mc_extra=["--metrics", "127.0.0.1:0"]) as d:
        deadline = time.monotonic() + 20  # (metrics start after "listening on")
        while time.monotonic() < deadline and "metrics at" not in d.log("memcached.log"):
            time.sleep(0.05)
        text = d.log("memcached.log")
        m = re.search(r"connections max (\d+)", text)
        limit = int(m.group(1)) if m else 0
        check(0 < limit < NOFILE, "--conn-limit sized below the descriptor limit: %d of %d"
              % (limit, NOFILE))
        mp = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", text)
        check(mp is not None, "the metrics endpoint is up")
        mport = int(mp.group(1))

        # 2. idle connections past the limit
        early = Client(("127.0.0.1", d.port), connect_timeout=5, timeout=5)
        early.set("early", b"1", noreply=False)
        lines0 = log_lines(d)
        flood = start_conns(d.port, 400)
        time.sleep(0.5)
        slow, fails = 0.0, 0
        for i in range(30):
            t0 = time.monotonic()
            try:
                ok = early.set("early", str(i).encode(), noreply=False) and \
                    early.get("early") == str(i).encode()
            except Exception as e:  # noqa: BLE001 - any failure counts
                print("#   the early client: %r" % e)
                ok = False
            fails += not ok
            slow = max(slow, time.monotonic() - t0)
            time.sleep(0.1)
        refused = refused_lines(flood, 2.0)
        stats = early.stats()
        rejected = int(stats.get(b"rejected_connections", 0))
        lines = log_lines(d) - lines0
        print("# 400 idle connections (limit %d): %d answered 'Too many open connections', "
              "rejected_connections %d; early client %d failed of 30, slowest %.3f s; %d log "
              "lines" % (limit, refused, rejected, fails, slow, lines))
        check(fails == 0 and slow < 1.0, "a client connected before the flood is served "
              "throughout (slowest %.3f s)" % slow)
        check(refused >= 400 - limit - 10 and rejected >= refused,
              "connections past the limit refused at once with memcached's line (%d)" % refused)
        check(lines <= 10, "the log grew by %d lines" % lines)
        for s in flood:
            s.close()
        early.close()
        ok, took = False, 0.0
        deadline = time.monotonic() + 3
        while not ok and time.monotonic() < deadline:
            ok, took = served(d.port, "after-idle")
            time.sleep(0.05 if not ok else 0)
        check(ok, "once they close, a new client is served (%.3f s)" % took)

        # 3. slow connections to the metrics port
        lines0 = log_lines(d)
        slowconns = start_conns(mport, 300)
        t0 = time.monotonic()
        nok, nfail, worst, tick = 0, 0, 0.0, 0
        while time.monotonic() - t0 < 6:
            if tick % 4 == 0:
                for s in slowconns:
                    try:
                        s.send(b"G")
                    except OSError:
                        pass
            ok, took = served(d.port, "m%d" % tick)
            nok += ok
            nfail += not ok
            worst = max(worst, took)
            tick += 1
            time.sleep(0.25)
        for s in slowconns:
            s.close()
        lines = log_lines(d) - lines0
        st = -1
        for _ in range(20):
            st = scrape(mport)
            if st == 200:
                break
            time.sleep(0.1)
        print("# 300 slow connections to --metrics for 6 s: %d new clients served, %d failed, "
              "slowest %.3f s; %d log lines; a scrape after: %d" % (nok, nfail, worst, lines, st))
        check(nfail == 0 and nok >= 10 and worst < 5,
              "new clients served throughout the metrics flood")
        check(lines <= 6 * 2 + 10, "the log grew by %d lines" % lines)
        check(st == 200, "a scrape answers 200 after the flood")
        check(d.mc.poll() is None, "hatchkv-memcached still runs")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
