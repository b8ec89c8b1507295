"""A cluster member's metrics (issue 30, item 4), checked against etcd.

    python3 test_cluster_metrics.py HATCHKV_SERVER HATCHKV_ADMIN

A private etcd (the etcd binary: Debian's etcd-server; $HKV_ETCD_BIN
overrides) and a replicated store of two members on shm (--replicas 2,
--memory-file, --lease-ttl 3, 64 partitions, --metrics on a free port,
--etcd-insecure). Each page is parsed strictly (test_metrics.parse) and
read as an operator would:

1. Both serving: partitions by role sum to the map's partitions (primaries)
   and to partitions x (replicas - 1) (replicas), and each member's match
   the map in etcd; the map revision is PREFIX/map's mod_revision in etcd;
   the coordinator term PREFIX/coordinator's create_revision, one member
   coordinates (the one etcd names); the lease's time left is in (1 s, TTL]
   on every scrape for 2 s (a keepalive every TTL/3; it fences at 1 s);
   nothing under-replicated, unavailable or under way.
2. The coordinator a is SIGKILLed. On b: a on the map but no member
   (map_servers_down 1) until b, now coordinating (a new term), drops it;
   then every partition is under-replicated (64: two members, two
   replicas), none unavailable, b primary of all, the revision etcd's
   again, and `hatchkv-admin status --json` says the same.
3. a restarts on its memory file: a repair fills it (b's repair passes, a's
   intake), the repair's final move commits; under-replicated back to 0 on
   both; b's counters say 1 repair filled, 1 move committed.
4. b is SIGSTOPped past its lease, then continued: a drops it; b finds its
   lease gone: leases lost 1, registrations 2, lease time left back in
   (0, TTL] once registered; repaired again.

Every hatchkv_cluster_* metric docs/alerts.yml names is on the page; if
promtool is installed, `promtool check metrics` finds nothing to say about
the hatchkv_cluster_* families. Run with sanitizer builds (ctest
metrics_cluster_tsan), no server log may hold a report. Every process
started here dies with the test (PR_SET_PDEATHSIG). Exit 0: passed, 1:
failed, 77: no etcd binary.
"""
import base64
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "memcached"))
sys.path.insert(0, HERE)
from mc_harness import Procs, find_etcd, free_port  # noqa: E402
from mc_harness import wait_for as harness_wait_for  # noqa: E402
from test_metrics import check, metrics_url, scrape, val  # noqa: E402

TTL = 3
PARTS = 64
R = 2


def wait_for(pred, timeout, what, step=0.1):
    return harness_wait_for(pred, timeout, what, step, AssertionError)


class Env(Procs):
    log_mode = "a"  # a server started again: both runs in its log (url() takes the last)
    stop_wait_s = 5
    stop_in_turn = True

    def __init__(self, srv, admin):
        super().__init__("hkv-cmetrics-")
        self.srv, self.admin = srv, admin
        self.prefix = "/hkvmet%06d" % random.randrange(10 ** 6)

    def start_etcd(self, etcd):
        for attempt in range(4):
            cport, pport = free_port(), free_port()
            if cport == pport:
                continue
            client, peer = "http://127.0.0.1:%d" % cport, "http://127.0.0.1:%d" % pport
            self.spawn("etcd", [etcd, "--name", "t",
                                "--data-dir", os.path.join(self.tmp, "etcd%d" % attempt),
                                "--listen-client-urls", client, "--advertise-client-urls", client,
                                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                "--initial-cluster", "t=" + peer,
                                "--logger", "zap", "--log-level", "error"])
            self.etcd_url = client
            self.uri = "etcd://127.0.0.1:%d%s" % (cport, self.prefix)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.procs["etcd"].poll() is None:
                try:
                    self.get("/ready")
                    return
                except OSError:
                    time.sleep(0.05)
            self.kill("etcd")
        raise AssertionError("etcd did not come up:\n" + self.log("etcd")[-1500:])

    def get(self, key):
        """etcd's kv for key (value decoded, revisions as ints) or None."""
        req = urllib.request.Request(
            self.etcd_url + "/v3/kv/range",
            data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            kvs = json.loads(r.read()).get("kvs") or []
        if not kvs:
            return None
        kv = kvs[0]
        return {"value": base64.b64decode(kv.get("value", "")).decode(),
                "mod": int(kv.get("mod_revision", 0)), "create": int(kv.get("create_revision", 0))}

    def map(self):
        """(lists of names, mod_revision) of PREFIX/map, or (None, 0)."""
        kv = self.get(self.prefix + "/map")
        if not kv:
            return None, 0
        m = json.loads(kv["value"])
        names = m.get("names") or m.get("servers") or []
        lists = []
        for entry in m["map"]:
            entry = entry if isinstance(entry, list) else [entry]
            lists.append([names[e] if isinstance(e, int) else e for e in entry])
        return lists, kv["mod"]

    def start(self, name):
        d = os.path.join(self.tmp, name)
        os.makedirs(d, 0o700, exist_ok=True)
        self.spawn(name, [self.srv, "--cluster", self.uri, "--etcd-insecure", "--id", name,
                          "--lease-ttl", str(TTL), "--partitions", str(PARTS), "--replicas",
                          str(R), "--memory-file", os.path.join(d, "region"), "--token-file",
                          self.token, "-t", "shm", "-s", os.path.join(d, "ctl.sock"), "-m", "32M",
                          "-S", "256K", "--metrics", "127.0.0.1:0"])

    def url(self, name):
        # the last one logged: a restarted server logs a new port
        urls = [metrics_url(line) for line in self.log(name).splitlines() if "metrics at" in line]
        return urls[-1] if urls else None

    def page(self, name):
        return scrape(self.url(name))

    def write_token(self):
        self.token = os.path.join(self.tmp, "token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (os.urandom(16).hex() + "\n").encode())
        os.close(fd)


def roles(lists, name):
    return (sum(ls[0] == name for ls in lists), sum(name in ls[1:] for ls in lists))


def full_map(env, names):
    lists, rev = env.map()
    if lists and all(len(ls) == R for ls in lists) and {n for ls in lists for n in ls} == names:
        return lists, rev
    return None


def serving(env, name):
    try:
        s = env.page(name)
    except OSError:
        return None
    return s if val(s, "hatchkv_fenced") == 0 else None


def settled(env, names):
    """Pages of every member once each serves and shows the map etcd has now."""
    lists, rev = full_map(env, set(names)) or (None, 0)
    if not lists:
        return None
    pages = {}
    for n in names:
        s = serving(env, n)
        if not s or val(s, "hatchkv_cluster_map_revision") != rev or \
                val(s, "hatchkv_cluster_repairs_in_progress") or \
                val(s, "hatchkv_cluster_moves_in_progress"):
            return None
        pages[n] = s
    return lists, rev, pages


def part1(env):
    env.start("a")
    wait_for(lambda: "a coordinates" in env.log("a") or env.procs["a"].poll() is not None, 30,
             "a to coordinate")
    env.start("b")
    lists, rev, pages = wait_for(lambda: settled(env, ("a", "b")), 40,
                                 "the first map on a and b, both serving")
    coord = env.get(env.prefix + "/coordinator")
    check(coord["value"] == "a", "a coordinates (etcd's %s/coordinator)" % env.prefix)
    prim = repl = 0
    for n, s in pages.items():
        p, r = (val(s, "hatchkv_cluster_partitions", role=x) for x in ("primary", "replica"))
        check((p, r) == roles(lists, n), "%s: primary of %d, replica of %d partitions, as the "
              "map in etcd says" % (n, p, r))
        prim, repl = prim + p, repl + r
        check(val(s, "hatchkv_cluster_member") == 1 and
              val(s, "hatchkv_cluster_map_partitions") == PARTS and
              val(s, "hatchkv_cluster_map_replicas") == R, "%s: a member; the map: %d partitions "
              "x %d replicas" % (n, PARTS, R))
        check(val(s, "hatchkv_cluster_map_revision") == rev,
              "%s: map revision %d, PREFIX/map's mod_revision in etcd" % (n, rev))
        check(val(s, "hatchkv_cluster_coordinator_term") == coord["create"] and
              val(s, "hatchkv_cluster_coordinator") == (n == "a"),
              "%s: coordinator %d, term %d (PREFIX/coordinator's create_revision)"
              % (n, val(s, "hatchkv_cluster_coordinator"), coord["create"]))
        check(val(s, "hatchkv_cluster_members") == 2 and
              val(s, "hatchkv_cluster_map_servers") == 2 and
              val(s, "hatchkv_cluster_map_servers_down") == 0 and
              val(s, "hatchkv_cluster_partitions_under_replicated") == 0 and
              val(s, "hatchkv_cluster_partitions_unavailable") == 0,
              "%s: 2 members, both on the map; nothing under-replicated or unavailable" % n)
        check(val(s, "hatchkv_cluster_registrations_total") == 1 and
              val(s, "hatchkv_cluster_leases_lost_total") == 0 and
              val(s, "hatchkv_cluster_lease_ttl_seconds") == TTL,
              "%s: registered once, no lease lost, TTL %d s" % (n, TTL))
        check(0 <= val(s, "hatchkv_cluster_view_age_seconds") < 1.5,
              "%s: read etcd %.2f s ago" % (n, val(s, "hatchkv_cluster_view_age_seconds")))
        check(val(s, "hatchkv_cluster_jobs_total", kind="purge", result="done") >= 1,
              "%s: settled its region (a purge job done)" % n)
    check(prim == PARTS and repl == PARTS * (R - 1),
          "primaries sum to %d, replicas to %d x (%d - 1)" % (prim, PARTS, R))
    lefts, t_end = [], time.monotonic() + 2
    while time.monotonic() < t_end:
        for n in ("a", "b"):
            s = env.page(n)
            lefts.append(val(s, "hatchkv_cluster_lease_seconds_left"))
        time.sleep(0.1)
    check(all(1 < x <= TTL for x in lefts), "lease time left in (1, %d] s over 2 s (%d scrapes, "
          "%.2f-%.2f s)" % (TTL, len(lefts), min(lefts), max(lefts)))
    with open(os.path.join(HERE, "..", "..", "docs", "alerts.yml")) as f:
        alerted = set(re.findall(r"\bhatchkv_cluster_[a-z_]+", f.read()))
    shown = {k[0] for k in pages["a"]}
    check(alerted <= shown, "the %d hatchkv_cluster_* metrics docs/alerts.yml names are on the "
          "page (missing: %s)" % (len(alerted), sorted(alerted - shown) or "none"))
    lint(pages["a"], env)
    return lists


def lint(s, env):
    promtool = shutil.which("promtool")
    if not promtool:
        print("# promtool not installed: page not linted")
        return
    text = urllib.request.urlopen(env.url("a"), timeout=10).read()
    r = subprocess.run([promtool, "check", "metrics"], input=text, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    ours = [ln for ln in r.stdout.decode().splitlines() if "hatchkv_cluster" in ln]
    check(not ours, "promtool check metrics: nothing about hatchkv_cluster_* (%s)"
          % (ours or "clean"))


def part2(env):
    env.kill("a")
    t_kill = time.monotonic()
    seen_down = []

    def dropped():
        s = env.page("b")
        if val(s, "hatchkv_cluster_map_servers_down") == 1:
            seen_down.append(time.monotonic() - t_kill)
        return s if val(s, "hatchkv_cluster_partitions_under_replicated") > 0 else None
    s = wait_for(dropped, 30, "b to show under-replicated partitions", 0.05)
    t_drop = time.monotonic() - t_kill
    check(seen_down, "b: a on the map but no member (map_servers_down 1) from %.1f s to "
          "%.1f s after the kill" % (seen_down[0], seen_down[-1]) if seen_down else
          "b: a on the map but no member before the drop")
    lists, rev = env.map()
    check(all(ls == ["b"] for ls in lists), "etcd: every list is [b] %.1f s after the kill"
          % t_drop)
    s = wait_for(lambda: (lambda p: p if val(p, "hatchkv_cluster_map_revision") == rev else None)
                 (env.page("b")), 5, "b to show the map etcd has")
    coord = env.get(env.prefix + "/coordinator")
    check(val(s, "hatchkv_cluster_partitions_under_replicated") == PARTS and
          val(s, "hatchkv_cluster_partitions_unavailable") == 0,
          "b: %d partitions under-replicated, none unavailable"
          % val(s, "hatchkv_cluster_partitions_under_replicated"))
    check(val(s, "hatchkv_cluster_partitions", role="primary") == PARTS and
          val(s, "hatchkv_cluster_partitions", role="replica") == 0 and
          val(s, "hatchkv_cluster_map_servers") == 1 and
          val(s, "hatchkv_cluster_map_servers_down") == 0 and
          val(s, "hatchkv_cluster_members") == 1, "b: primary of all %d, the map names b only, "
          "1 member" % PARTS)
    check(val(s, "hatchkv_cluster_coordinator") == 1 and coord["value"] == "b" and
          val(s, "hatchkv_cluster_coordinator_term") == coord["create"],
          "b coordinates: a new term %d" % coord["create"])
    check(0 < val(s, "hatchkv_cluster_lease_seconds_left") <= TTL and
          val(s, "hatchkv_fenced") == 0, "b: lease %.2f s left, serving"
          % val(s, "hatchkv_cluster_lease_seconds_left"))
    r = subprocess.run([env.admin, "--cluster", env.uri, "--etcd-insecure", "--json", "status"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    st = json.loads(r.stdout)
    check(r.returncode == 1 and st["under_replicated"] ==
          val(s, "hatchkv_cluster_partitions_under_replicated") and st["unavailable"] == 0,
          "hatchkv-admin status: degraded (exit %d), %d under-replicated, as the metric says"
          % (r.returncode, st["under_replicated"]))


def part3(env):
    env.start("a")
    progress = set()

    def repaired():
        try:
            for n in ("a", "b"):
                s = env.page(n)
                if val(s, "hatchkv_cluster_repairs_in_progress"):
                    progress.add("repair %d partitions" %
                                 val(s, "hatchkv_cluster_repair_partitions"))
                if val(s, "hatchkv_cluster_moves_in_progress"):
                    progress.add("move %d partitions" % val(s, "hatchkv_cluster_move_partitions"))
        except (OSError, TypeError, AttributeError):
            return None
        return settled(env, ("a", "b"))
    t0 = time.monotonic()
    lists, rev, pages = wait_for(repaired, 40, "a repaired back onto every list")
    print("# seen under way: %s" % (sorted(progress) or "nothing (too quick)"))
    a, b = pages["a"], pages["b"]
    for n, s in pages.items():
        check(val(s, "hatchkv_cluster_partitions_under_replicated") == 0 and
              val(s, "hatchkv_cluster_map_revision") == rev,
              "%s: nothing under-replicated %.1f s after a's restart, map revision %d"
              % (n, time.monotonic() - t0, rev))
    check(roles(lists, "a") == (0, PARTS) and
          val(a, "hatchkv_cluster_partitions", role="replica") == PARTS,
          "a: replica of all %d (behind b)" % PARTS)
    check(val(b, "hatchkv_cluster_repairs_total", result="filled") == 1 and
          val(b, "hatchkv_cluster_moves_total", result="committed") == 1 and
          val(b, "hatchkv_cluster_repairs_total", result="dropped") == 0 and
          val(b, "hatchkv_cluster_moves_total", result="dropped") == 0,
          "b (coordinator): 1 repair filled, its final move committed, none dropped")
    check(val(b, "hatchkv_cluster_jobs_total", kind="repair_pass", result="done") >= 1 and
          val(b, "hatchkv_cluster_jobs_total", kind="copy", result="done") >= 1 and
          val(a, "hatchkv_cluster_jobs_total", kind="intake", result="done") >= 1,
          "b ran %d repair passes and the final copy; a its intake"
          % val(b, "hatchkv_cluster_jobs_total", kind="repair_pass", result="done"))


def part4(env):
    env.sigstop("b")
    wait_for(lambda: full_map(env, {"a"}) is None and
             all(ls == ["a"] for ls in env.map()[0]), 30, "a to drop b (b stopped)")
    env.sigcont("b")

    def back():
        s = env.page("b")
        return s if val(s, "hatchkv_cluster_registrations_total") == 2 else None
    s = wait_for(back, 20, "b to register again")
    check(val(s, "hatchkv_cluster_leases_lost_total") == 1,
          "b, stopped past its lease: 1 lease lost, registered twice")
    lists, rev, pages = wait_for(lambda: settled(env, ("a", "b")), 40, "b repaired back")
    s = pages["b"]
    check(0 < val(s, "hatchkv_cluster_lease_seconds_left") <= TTL and
          val(s, "hatchkv_cluster_partitions", role="replica") == PARTS and
          val(pages["a"], "hatchkv_cluster_coordinator") == 1,
          "b: lease %.2f s left again, replica of all (a coordinates)"
          % val(s, "hatchkv_cluster_lease_seconds_left"))


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    etcd = find_etcd()
    if not etcd:
        print("SKIP: no etcd binary (install etcd-server; scripts/install-deps does)")
        return 77
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    env = Env(sys.argv[1], sys.argv[2])
    t0 = time.monotonic()
    try:
        env.write_token()
        env.start_etcd(etcd)
        print("# etcd at %s, cluster %s" % (env.etcd_url, env.uri), flush=True)
        part1(env)
        part2(env)
        part3(env)
        part4(env)
        env.stop_all()
        reports = [n for n in ("a", "b") if re.search(r"Sanitizer|runtime error", env.log(n))]
        check(not reports, "no sanitizer report in the servers' logs (%s)" % (reports or "none"))
        print("PASS (%.1f s)" % (time.monotonic() - t0))
        return 0
    except BaseException:
        import traceback
        traceback.print_exc(file=sys.stdout)
        for n in ("a", "b"):
            sys.stdout.write("---- tail of %s.log ----\n%s\n" % (n, env.log(n)[-3000:]))
        print("FAIL")
        return 1
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(main())
