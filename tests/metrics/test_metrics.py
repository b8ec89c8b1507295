"""--metrics (issue 17, "Observe"): hatchkv-server's and hatchkv-memcached's
Prometheus pages, scraped over HTTP while pymemcache drives traffic.

Each page is parsed strictly (text format 0.0.4: every sample's metric has a
# TYPE, names and labels well formed, counters end in _total, no series
twice), then checked for what an operator would look at: clients connected
and refused (a wrong token, one over --max-clients), the region's fill with
its sample time, exact get hits/misses and command counts for the traffic
sent, bytes growing. Also: the port is off by default (no TCP listener), and
a scrape of a 1 GiB region of 64 KiB segments stays cheap.

usage: test_metrics.py HATCHKV_MEMCACHED HATCHKV_SERVER
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import shutil
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "memcached"))
from mc_harness import Daemons, ctl_auth as auth, free_port, stop, wait_for  # noqa: E402

from pymemcache.client.base import Client  # noqa: E402

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def parse_labels(text, line):
    labels, pos = {}, 0
    while pos < len(text):
        m = LABEL.match(text, pos)
        if not m:
            raise AssertionError("bad labels in %r" % line)
        if m.group(1) in labels:
            raise AssertionError("label twice in %r" % line)
        labels[m.group(1)] = m.group(2)
        pos = m.end()
        if pos < len(text):
            if text[pos] != ",":
                raise AssertionError("bad labels in %r" % line)
            pos += 1
    return labels


def parse(text):
    """{(name, ((label, value), ...)): float}; raises on anything off-format."""
    if not text.endswith("\n"):
        raise AssertionError("the page does not end with a newline")
    types, helps, samples = {}, set(), {}
    for line in text.split("\n")[:-1]:
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.match(name):
                    raise AssertionError("bad metric name in %r" % line)
                if parts[1] == "TYPE":
                    if name in types or len(parts) != 4 or parts[3] not in TYPES:
                        raise AssertionError("bad or second TYPE: %r" % line)
                    if any(k[0] == name for k in samples):
                        raise AssertionError("TYPE after its samples: %r" % line)
                    types[name] = parts[3]
                else:
                    if name in helps or len(parts) != 4 or not parts[3]:
                        raise AssertionError("bad or second HELP: %r" % line)
                    helps.add(name)
            continue
        if not line:
            raise AssertionError("empty line in the page")
        m = re.match(r"([^{ ]+)(?:\{(.*)\})? (\S+)$", line)
        if not m:
            raise AssertionError("bad sample line %r" % line)
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if not NAME.match(name):
            raise AssertionError("bad metric name in %r" % line)
        if name not in types:
            raise AssertionError("sample without a # TYPE: %r" % line)
        if name not in helps:
            raise AssertionError("sample without a # HELP: %r" % line)
        if types[name] == "counter" and not name.endswith("_total"):
            raise AssertionError("counter not named *_total: %r" % line)
        v = float(value)  # accepts NaN, +Inf, -Inf as the format spells them
        if types[name] == "counter" and not v >= 0:
            raise AssertionError("negative counter: %r" % line)
        key = (name, tuple(sorted(parse_labels(labels or "", line).items())))
        if key in samples:
            raise AssertionError("series twice: %r" % line)
        samples[key] = v
    if not samples:
        raise AssertionError("an empty page")
    return samples


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        ctype = r.headers.get("Content-Type", "")
        if r.status != 200 or not ctype.startswith("text/plain; version=0.0.4"):
            raise AssertionError("scrape of %s: %d %s" % (url, r.status, ctype))
        return parse(r.read().decode("utf-8"))


def val(samples, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    if key not in samples:
        raise AssertionError("no %s%s on the page" % (name, labels or ""))
    return samples[key]


def metrics_url(log):
    m = re.search(r"metrics at (http://\S+)", log)
    return m.group(1) if m else None


def listening_tcp_ports(pid):
    """TCP ports process pid listens on (its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


class MetricsDaemons(Daemons):
    """mc_harness's daemons, with more arguments for hatchkv-server."""

    def __init__(self, *args, srv_extra=(), **kw):
        self.srv_extra = list(srv_extra)
        super().__init__(*args, **kw)

    def _spawn(self, argv, log, nofile=None):
        if log.startswith("server"):
            argv = list(argv) + self.srv_extra
        return super()._spawn(argv, log, nofile)


def test_off_by_default(mc_bin, srv_bin):
    for b in (srv_bin, mc_bin):
        out = subprocess.run([b, "--help"], stdout=subprocess.PIPE, check=True).stdout
        check(b"--metrics ADDR:PORT" in out, "%s --help documents --metrics"
              % os.path.basename(b))
    with Daemons(mc_bin, srv_bin, memory="64M") as d:
        srv, mc = d.procs[0], d.mc
        check(metrics_url(d.log("server.log")) is None and
              metrics_url(d.log("memcached.log")) is None, "no metrics line in either log")
        check(listening_tcp_ports(srv.pid) == set(),
              "hatchkv-server (shm) listens on no TCP port without --metrics")
        check(listening_tcp_ports(mc.pid) == {d.port},
              "hatchkv-memcached listens on its memcached port only without --metrics")
    r = subprocess.run([srv_bin, "--metrics", "9740"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    check(r.returncode == 2 and b"bad --metrics" in r.stderr, "--metrics without ADDR: refused")


def traffic(port):
    """Known traffic; returns what the counters must say."""
    c = Client(("127.0.0.1", port), timeout=10, connect_timeout=10)
    for i in range(20):
        c.set("k%d" % i, b"v" * 100, noreply=False)
    for i in range(20):
        assert c.get("k%d" % i) == b"v" * 100
    for i in range(7):
        assert c.get("missing%d" % i) is None
    got = c.get_many(["k0", "k1", "k2", "k3", "k4", "nope1", "nope2", "nope3"])
    assert len(got) == 5
    for i in range(3):
        assert c.delete("k1%d" % i, noreply=False)
    for i in range(2):
        assert not c.delete("gone%d" % i, noreply=False)
    c.set("n", b"10", noreply=False)
    assert c.incr("n", 5) == 15
    assert c.incr("nothere", 1) is None
    assert c.touch("k5", 100, noreply=False)
    assert not c.touch("nothere", 100, noreply=False)
    return c, {
        "set": 21, "get": 20 + 7 + 1, "delete": 5, "incr": 2, "touch": 2,
        "get_hits": 20 + 5, "get_misses": 7 + 3, "get_keys": 35,
        "delete_hits": 3, "delete_misses": 2, "incr_hits": 1, "incr_misses": 1,
        "touch_hits": 1, "touch_misses": 1,
    }


def raw(port, data):
    s = socket.create_connection(("127.0.0.1", port), 10)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def test_pages(mc_bin, srv_bin):
    t_start = time.time()
    srv_port = free_port()
    with MetricsDaemons(mc_bin, srv_bin, memory="64M", threads=2,
                        srv_extra=["--metrics", "127.0.0.1:%d" % srv_port, "--max-clients", "4"],
                        mc_extra=["--metrics", "127.0.0.1:0"]) as d:
        # (the daemon logs "listening on" before it starts its metrics endpoint)
        deadline = time.time() + 20
        while time.time() < deadline and not (metrics_url(d.log("server.log")) and
                                               metrics_url(d.log("memcached.log"))):
            time.sleep(0.05)
        srv_url = metrics_url(d.log("server.log"))
        mc_url = metrics_url(d.log("memcached.log"))
        check(srv_url == "http://127.0.0.1:%d/metrics" % srv_port,
              "hatchkv-server serves metrics on the port asked for (%s)" % srv_url)
        check(mc_url is not None, "hatchkv-memcached logs its metrics URL (%s)" % mc_url)
        try:
            urllib.request.urlopen(srv_url.replace("/metrics", "/"), timeout=10)
            check(False, "GET / is 404")
        except urllib.error.HTTPError as e:
            check(e.code == 404, "GET / is 404 (only /metrics is served)")

        s0, m0 = scrape(srv_url), scrape(mc_url)
        info = [(dict(k[1]), v) for k, v in s0.items() if k[0] == "hatchkv_build_info"]
        check(len(info) == 1 and info[0][1] == 1 and info[0][0]["transport"] == "shm" and
              info[0][0]["version"], "server build_info %s" % info)
        check(val(s0, "hatchkv_fenced") == 0 and val(s0, "hatchkv_cluster_member") == 0,
              "server: not fenced, not a cluster member")
        up = val(s0, "hatchkv_uptime_seconds")
        start = val(s0, "hatchkv_start_time_seconds")
        check(0 < up < 120 and t_start - 5 < start <= time.time(), "server uptime %.1f s" % up)
        check(val(m0, "hatchkv_memcached_uptime_seconds") >= 0, "memcached uptime")
        check(val(s0, "hatchkv_clients_max") == 4, "clients_max is --max-clients")

        # scrapes on the side while the workers count (for the TSan tier)
        stop, scrapes = threading.Event(), []

        def scraper():
            while not stop.is_set():
                scrapes.append((scrape(srv_url), scrape(mc_url)))
        side = threading.Thread(target=scraper)
        side.start()
        try:
            c, want = traffic(d.port)
        finally:
            stop.set()
            side.join()
        check(len(scrapes) >= 1, "%d scrapes of both pages during the traffic" % len(scrapes))
        bogus = raw(d.port, b"bogus\r\nget " + b"x" * 300 + b"\r\n")
        check(bogus.startswith(b"ERROR\r\nCLIENT_ERROR"), "a bad command and a bad key")
        t_traffic = time.time()

        token = open(os.path.join(d.tmp, "token"), "rb").read().strip()
        sock = os.path.join(d.tmp, "ctl.sock")
        check(auth(sock, b"not-the-token-at-all")[0] == 3, "AUTH with a wrong token: ERROR")
        # two workers and the items counter (--metrics) connected: one more
        # is admitted (a ticket, pending) and the next is over --max-clients 4
        check(auth(sock, token)[0] == 2, "AUTH with the token: WELCOME")
        check(auth(sock, token)[0] == 3, "AUTH over --max-clients: ERROR")

        s1 = scrape(srv_url)
        m1 = scrape(mc_url)  # the pymemcache client is still connected
        check(val(s1, "hatchkv_clients_connected") >= 1,
              "server: clients connected %d (>= 1)" % val(s1, "hatchkv_clients_connected"))
        check(val(s1, "hatchkv_clients_connected") == 3 and
              val(s1, "hatchkv_clients_pending") == 1,
              "server: the 2 workers and the items counter connected, 1 admitted and pending")
        check(val(s1, "hatchkv_clients_refused_total", reason="wrong_token") == 1,
              "server: the wrong token counted")
        check(val(s1, "hatchkv_clients_refused_total", reason="max_clients") == 1,
              "server: the client over --max-clients counted")
        check(val(s1, "hatchkv_clients_admitted_total") >= 4,
              "server: admitted %d (learn handle, 2 workers, counter, 1 raw)"
              % val(s1, "hatchkv_clients_admitted_total"))
        check(val(s1, "hatchkv_rate_limited_total") == 0 and
              val(s1, "hatchkv_keepalive_drops_total") == 0, "server: nothing rate limited, "
              "no keepalive drops (shm)")
        carved = val(s1, "hatchkv_carves_total", result="carved")
        segs = {st: val(s1, "hatchkv_segments", state=st) for st in ("free", "shared", "draining")}
        check(carved >= 1 and segs["shared"] >= 1, "server: %d carves, segments %s"
              % (carved, segs))
        total = val(s1, "hatchkv_region_data_bytes") / val(s1, "hatchkv_segment_bytes")
        check(sum(segs.values()) == total, "server: segments by state add up to %d" % total)

        # the region's fill: a sample whose whole pass came after the traffic
        def fresh():
            s = scrape(srv_url)
            return (val(s, "hatchkv_region_fill_sampled_timestamp_seconds") -
                    val(s, "hatchkv_region_fill_sample_seconds") > t_traffic)
        wait_for(fresh, 30, "a fill sample after the traffic")
        s2 = scrape(srv_url)
        used = val(s2, "hatchkv_region_used_bytes")
        ratio = val(s2, "hatchkv_region_fill_ratio")
        ts = val(s2, "hatchkv_region_fill_sampled_timestamp_seconds")
        span = val(s2, "hatchkv_region_fill_sample_seconds")
        check(used >= 18 * 100 and 0 < ratio <= 1 and t_traffic < ts <= time.time() and
              0 < span < 5, "server: region fill %d bytes (%.5f), sampled %.1f s ago over "
              "%.2f s" % (used, ratio, time.time() - ts, span))

        def cmd(m, name):
            return val(m, "hatchkv_memcached_commands_total", command=name)
        for name in ("set", "get", "delete", "incr", "touch"):
            check(cmd(m1, name) - cmd(m0, name) == want[name],
                  "memcached: %d %s commands" % (want[name], name))
        for what in ("get", "delete", "incr", "touch"):
            h = val(m1, "hatchkv_memcached_hits_total", command=what)
            m = val(m1, "hatchkv_memcached_misses_total", command=what)
            check((h, m) == (want[what + "_hits"], want[what + "_misses"]),
                  "memcached: %s hits %d misses %d, as sent" % (what, h, m))
        check(val(m1, "hatchkv_memcached_get_keys_total") == want["get_keys"],
              "memcached: %d keys looked up (cmd_get)" % want["get_keys"])
        check(val(m1, "hatchkv_memcached_errors_total", kind="error") == 1 and
              val(m1, "hatchkv_memcached_errors_total", kind="client_error") == 1,
              "memcached: the bad command and the bad key counted as errors")
        for name in ("read", "written"):
            b0 = val(m0, "hatchkv_memcached_%s_bytes_total" % name)
            b1 = val(m1, "hatchkv_memcached_%s_bytes_total" % name)
            check(b1 - b0 >= 20 * 100, "memcached: %s bytes grew by %d" % (name, b1 - b0))
        check(val(m1, "hatchkv_memcached_connections") >= 1 and
              val(m1, "hatchkv_memcached_connections_total") >= 2,
              "memcached: connections open %d, total %d"
              % (val(m1, "hatchkv_memcached_connections"),
                 val(m1, "hatchkv_memcached_connections_total")))
        sets = val(m1, "hatchkv_client_ops_total", op="set")
        check(sets >= 21 and val(m1, "hatchkv_client_round_trips_total", op="set") >= sets,
              "library: %d set operations summed over the workers" % sets)
        # the items gauge is kept current without any `stats` (issue 30): a
        # walk every 10 s on a thread of its own; wait for one after the sets
        t_sets = time.time()
        wait_for(lambda: val(scrape(mc_url),
                             "hatchkv_memcached_items_sampled_timestamp_seconds") > t_sets + 1,
                 25, "a walk of the index after the sets, without `stats`")
        m2 = scrape(mc_url)
        st = c.stats()
        check(val(m2, "hatchkv_memcached_items") == int(st[b"curr_items"]) and
              int(st[b"curr_items"]) > 0,
              "memcached: items %d counted without a `stats` command, as `stats` counts"
              % val(m2, "hatchkv_memcached_items"))
        c.close()
        wait_for(lambda: val(scrape(mc_url), "hatchkv_memcached_connections") == 0, 10,
                 "the connection count to fall")
        check(True, "memcached: 0 connections once the client left")


def test_cheap_big_region(srv_bin):
    tmp = tempfile.mkdtemp(prefix="hkv-metrics-")
    log = open(os.path.join(tmp, "server.log"), "w")
    p = subprocess.Popen([srv_bin, "-t", "shm", "-s", os.path.join(tmp, "ctl.sock"), "-k",
                          os.path.join(tmp, "token"), "-m", "1G", "-S", "64K", "--metrics",
                          "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        def logged():
            with open(os.path.join(tmp, "server.log")) as f:
                return f.read()
        wait_for(lambda: "server: ready" in logged() or p.poll() is not None, 60,
                 "hatchkv-server (1 GiB)")
        url = metrics_url(logged())
        check(url is not None, "1 GiB region of 64 KiB segments up")
        walls = []
        for _ in range(20):
            t0 = time.monotonic()
            s = scrape(url)
            walls.append(time.monotonic() - t0)
        segs = sum(val(s, "hatchkv_segments", state=st) for st in ("free", "shared", "draining"))
        walls.sort()
        page = val(s, "hatchkv_metrics_page_seconds")
        check(segs > 15000, "%d segments" % segs)
        check(walls[len(walls) // 2] < 0.1 and page < 0.02,
              "a scrape of it is cheap: median %.2f ms over HTTP, page built in %.3f ms"
              % (walls[len(walls) // 2] * 1e3, page * 1e3))
    finally:
        stop(p)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_bench_file(srv_bin, bench_bin):
    """hatchkv-bench --metrics-file: the runs' library counters, strictly parsed,
    counting exactly the operations run (YCSB ops + each thread's warm-up)."""
    tmp = tempfile.mkdtemp(prefix="hkv-metrics-")
    log = open(os.path.join(tmp, "server.log"), "w")
    sock, tok, out = (os.path.join(tmp, n) for n in ("ctl.sock", "token", "bench.prom"))
    p = subprocess.Popen([srv_bin, "-t", "shm", "-s", sock, "-k", tok, "-m", "64M"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        def logged():
            with open(os.path.join(tmp, "server.log")) as f:
                return f.read()
        wait_for(lambda: "server: ready" in logged() or p.poll() is not None, 60,
                 "hatchkv-server")
        for depth in ("1", "4"):  # (4: the operations go through each thread's pipe)
            r = subprocess.run([bench_bin, "-s", "hatchkv", "--server", "shm:" + sock,
                                "--token-file", tok, "-w", "A", "-r", "1000", "-n", "4000",
                                "-t", "2", "--warmup", "100", "--depth", depth,
                                "--metrics-file", out],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
            check(r.returncode == 0, "hatchkv-bench --depth %s --metrics-file ran (%s)"
                  % (depth, r.stderr.decode()[-200:].strip()))
            with open(out) as f:
                s = parse(f.read())
            lab = {"system": "hatchkv", "workload": "A", "transport": "shm"}
            ops = sum(val(s, "hatchkv_client_ops_total", op=o, **lab) for o in ("get", "set"))
            check(ops == 4000 + 2 * 100,
                  "bench depth %s: %d gets and sets counted, as run (4000 + 2 x 100 warm-up)"
                  % (depth, ops))
            check(val(s, "hatchkv_bench_throughput_ops_per_second", **lab) > 0 and
                  val(s, "hatchkv_client_round_trips_total", op="get", **lab) >= 1,
                  "bench depth %s: throughput and round trips there" % depth)
    finally:
        stop(p)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    test_off_by_default(mc_bin, srv_bin)
    test_pages(mc_bin, srv_bin)
    test_cheap_big_region(srv_bin)
    if len(sys.argv) > 3:
        test_bench_file(srv_bin, sys.argv[3])
    print("PASS")


if __name__ == "__main__":
    main()
