"""A store move's copy, watched while it runs (issue 30: "moves and repairs
in progress with bytes done").

    python3 test_move_progress.py HATCHKV_SERVER HATCHKV_ADMIN HATCHKV_BENCH

A private etcd and a store-mode cluster on shm (--memory-file in /dev/shm,
--lease-ttl 3, 64 partitions, --metrics on a free port, --etcd-insecure).
Server a alone is loaded by hatchkv-bench with RECORDS values of 4000 B
(about 60 MB); then b joins and takes about half of the partitions: a,
fenced, copies its items of them into b (server/mover.c, in slices of its
event loop). While it copies:

1. a's metrics page is answered (the copy no longer holds the loop), and
   some scrape shows hatchkv_cluster_move_bytes{state="done"} > 0 and below
   {state="total"} (counted before the copy: > 0), items likewise;
2. `hatchkv-admin status --json` lists a's copy under "progress" (of
   "move", kind "copy"; PREFIX/progress/a in etcd), done <= total.

After the move committed: PREFIX/progress/a is gone, a's page shows done
and total 0, `hatchkv-admin status --json` lists no progress, and a's log
says "copied N items (B bytes)" with N and B the totals the page showed
(done reached total); the largest gap between answered scrapes during the
copy is printed with the copy's time. Every process started here dies with
the test. Exit 0: passed, 1: failed, 77: no etcd binary.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_cluster_metrics import Env, check, wait_for  # noqa: E402
from mc_harness import find_etcd  # noqa: E402
from test_metrics import val  # noqa: E402

RECORDS = 15000
VLEN = 4000
PARTS = 64


class StoreEnv(Env):
    def __init__(self, srv, admin, bench):
        super().__init__(srv, admin)
        self.bench = bench
        self.shm = tempfile.mkdtemp(prefix="hkv-mprog-", dir="/dev/shm"
                                    if os.path.isdir("/dev/shm") else None)

    def start(self, name, replicas=1):
        d = os.path.join(self.tmp, name)
        os.makedirs(d, 0o700, exist_ok=True)
        self.spawn(name, [self.srv, "--cluster", self.uri, "--etcd-insecure", "--id", name,
                          "--lease-ttl", "3", "--partitions", str(PARTS), "--memory-file",
                          os.path.join(self.shm, name + ".region"), "--token-file", self.token,
                          "-t", "shm", "-s", os.path.join(d, "ctl.sock"), "-m", "160M",
                          "--metrics", "127.0.0.1:0", "--replicas", str(replicas)])

    def new_cluster(self):
        """Another cluster in the same etcd, under a prefix of its own."""
        old = self.prefix
        self.prefix = old + "r"
        self.uri = self.uri[:-len(old)] + self.prefix

    def load(self, name):
        t = time.monotonic()
        r = subprocess.run([self.bench, "--system", "hatchkv", "--server", self.uri,
                            "--etcd-insecure", "--token-file", self.token, "--records",
                            str(RECORDS), "--fieldcount", "1", "--fieldlength", str(VLEN), "-w",
                            "C", "--operations", "100", "--threads", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        check(r.returncode == 0, "hatchkv-bench loaded %d records of %d B into %s (%.1f s)%s"
              % (RECORDS, VLEN, name, time.monotonic() - t,
                 "" if r.returncode == 0 else ":\n" + r.stdout.decode()[-2000:]))

    def admin_json(self):
        r = subprocess.run([self.admin, "--cluster", self.uri, "--etcd-insecure", "--json",
                            "status"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           timeout=30)
        return json.loads(r.stdout)


def _stop_all_but_etcd(self):
    for name in [n for n in self.procs if n != "etcd"]:
        p = self.procs.pop(name)
        p.terminate()
        p.wait(10)


StoreEnv.stop_all_but_etcd = _stop_all_but_etcd


def serving(env, name):
    try:
        s = env.page(name)
    except (OSError, TypeError, AttributeError):
        return None
    return s if s and val(s, "hatchkv_fenced") == 0 else None


class Watcher(threading.Thread):
    """Scrapes a's page as fast as it answers, and runs hatchkv-admin status
    --json beside it, until told to stop."""

    def __init__(self, env, fn):
        super().__init__(daemon=True)
        self.env, self.fn, self.seen, self.stop = env, fn, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.seen.append((time.monotonic(), self.fn()))
            except Exception as e:  # noqa: BLE001 (a refused scrape: recorded)
                self.seen.append((time.monotonic(), e))
            time.sleep(0.005)


def scrape_a(env, name="a", what="move"):
    s = env.page(name)
    return {k: val(s, "hatchkv_cluster_%s_%s" % (what, k.split(":")[0]), state=k.split(":")[1])
            for k in ("bytes:done", "bytes:total", "items:done", "items:total")}


def copy_lines(log):
    return re.findall(r"copied (\d+) items \((\d+) bytes\)[^\n]*? in (\d+) ms", log)


def run(env):
    env.start("a")
    wait_for(lambda: serving(env, "a"), 30, "a to serve")
    env.load("a")
    pages = Watcher(env, lambda: scrape_a(env))
    admins = Watcher(env, env.admin_json)
    pages.start()
    admins.start()
    env.start("b")
    t_join = time.monotonic()
    try:
        wait_for(lambda: copy_lines(env.log("a")) or "copy for move" in env.log("a"), 60,
                 "a to copy its items into b")
        wait_for(lambda: (lambda ls: ls and {n for x in ls for n in x} == {"a", "b"})
                 (env.map()[0]) and serving(env, "a") and serving(env, "b"), 30,
                 "the move to commit and both to serve")
    finally:
        pages.stop.set()
        admins.stop.set()
        pages.join()
        admins.join()
    print("".join("# a: " + ln + "\n" for ln in env.log("a").splitlines()
                  if "copying" in ln or "copied" in ln), end="")
    lines = copy_lines(env.log("a"))
    check(len(lines) == 1, "a copied once: %s" % lines)
    items, nbytes, ms = (int(x) for x in lines[0])
    print("# a: copied %d items (%d bytes) in %d ms; the move took %.1f s from b's start"
          % (items, nbytes, ms, time.monotonic() - t_join))
    check(nbytes > 20e6, "a copied tens of MB (%.1f MB)" % (nbytes / 1e6))

    # 1. scrapes answered while the copy ran, done between 0 and total
    during = [(t, s) for t, s in pages.seen if isinstance(s, dict) and s["bytes:total"]]
    mid = [s for _, s in during if 0 < s["bytes:done"] < s["bytes:total"] and
           0 < s["items:done"] < s["items:total"]]
    refused = [s for _, s in pages.seen if not isinstance(s, dict)]
    gaps = [b[0] - a[0] for a, b in zip(pages.seen, pages.seen[1:])]
    print("# %d scrapes (%d failed), %d while a copied, %d mid-copy; longest gap %.0f ms"
          % (len(pages.seen), len(refused), len(during), len(mid), 1e3 * max(gaps or [0])))
    check(mid, "a scrape during the copy shows 0 < done < total (bytes and items): %s"
          % (mid[len(mid) // 2] if mid else sorted({str(s) for _, s in during})[:5]))
    totals = {(s["bytes:total"], s["items:total"]) for s in mid}
    check(totals == {(nbytes, items)}, "the total the page showed (%s) is what the log says "
          "was copied (%d bytes, %d items): done reached total" % (totals, nbytes, items))
    check(not refused, "every scrape was answered (%d refused: %s)"
          % (len(refused), refused[:2]))

    # 2. hatchkv-admin status --json showed a's copy
    shown = [g for _, st in admins.seen if isinstance(st, dict)
             for g in st.get("progress", []) if g.get("server") == "a"]
    check(shown and all(g["of"] == "move" and g["kind"] == "copy" for g in shown) and
          all(g["bytes_total"] is None or g["bytes"] <= g["bytes_total"] for g in shown),
          "hatchkv-admin status --json listed a's copy of the move (%d times; last %s)"
          % (len(shown), shown[-1] if shown else None))
    r = subprocess.run([env.admin, "--cluster", env.uri, "--etcd-insecure", "status"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30)
    print("# hatchkv-admin status after the move:\n" + r.stdout.decode().rstrip())

    # after: the progress is gone
    wait_for(lambda: env.get(env.prefix + "/progress/a") is None, 5,
             "PREFIX/progress/a deleted after the copy")
    s = scrape_a(env)
    check(all(v == 0 for v in s.values()), "a's page after the move: %s (all 0)" % s)
    st = env.admin_json()
    check(st.get("progress") == [], "hatchkv-admin status --json after the move: no progress "
          "(%s)" % st.get("progress"))


def run_repair(env):
    """A replicated store (r = 2) of c and d, loaded; d SIGKILLed, dropped,
    restarted: c's online repair passes (on its fill thread) fill d."""
    env.stop_all_but_etcd()
    env.new_cluster()
    env.start("c", 2)
    env.start("d", 2)
    wait_for(lambda: env.map()[0] and serving(env, "c") and serving(env, "d"), 40,
             "the first map of c and d (replicated), both serving")
    env.load("c and d")
    env.kill("d")
    wait_for(lambda: (lambda ls: ls and all(x == ["c"] for x in ls))(env.map()[0]), 30,
             "c to drop d (killed)")
    pages = Watcher(env, lambda: dict(scrape_a(env, "c", "repair"),
                                      pass_=val(env.page("c"), "hatchkv_cluster_repair_pass")))
    admins = Watcher(env, env.admin_json)
    pages.start()
    admins.start()
    env.start("d", 2)
    try:
        wait_for(lambda: (lambda ls: ls and all(len(x) == 2 for x in ls))(env.map()[0]) and
                 serving(env, "c") and serving(env, "d"), 60, "d repaired back onto every list")
    finally:
        pages.stop.set()
        admins.stop.set()
        pages.join()
        admins.join()
    passes = re.findall(r"repair pass: (\d+) items \((\d+) bytes", env.log("c"))
    print("".join("# c: " + ln + "\n" for ln in env.log("c").splitlines() if "repair " in ln),
          end="")
    passes = [x for x in passes if int(x[1]) > 20e6]
    check(passes, "a repair pass of c copied tens of MB (%s)" % passes)
    mid = [s for _, s in pages.seen if isinstance(s, dict) and s["pass_"] > 0 and
           0 < s["bytes:done"] < s["bytes:total"] and 0 < s["items:done"] < s["items:total"]]
    print("# %d scrapes of c, %d mid-pass" % (len(pages.seen), len(mid)))
    check(mid, "a scrape of c during its big pass shows 0 < done < total (bytes, items): %s"
          % (mid[len(mid) // 2] if mid else None))
    total = {s["bytes:total"] for s in mid}
    check(int(passes[0][1]) in total, "that pass's total (%s) is what it copied (%s bytes: "
          "nobody wrote meanwhile)" % (total, passes[0][1]))
    shown = [g for _, st in admins.seen if isinstance(st, dict)
             for g in st.get("progress", []) if g.get("server") == "c"]
    check(shown and any(g["of"] == "repair" and g["kind"] == "pass" for g in shown),
          "hatchkv-admin status --json listed c's repair pass (%d times; %s)"
          % (len(shown), sorted({(g["of"], g["kind"], g["pass"]) for g in shown})))
    wait_for(lambda: env.get(env.prefix + "/progress/c") is None, 5,
             "PREFIX/progress/c deleted after the repair")
    s = scrape_a(env, "c", "repair")
    check(all(v == 0 for v in s.values()), "c's page after the repair: %s (all 0)" % s)


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        return 2
    etcd = find_etcd()
    if not etcd:
        print("SKIP: no etcd binary (install etcd-server; scripts/install-deps does)")
        return 77
    env = StoreEnv(*sys.argv[1:4])
    t0 = time.monotonic()
    try:
        env.write_token()
        env.start_etcd(etcd)
        print("# etcd at %s, cluster %s" % (env.etcd_url, env.uri), flush=True)
        run(env)
        run_repair(env)
        env.stop_all()
        reports = [n for n in ("a", "b", "c", "d") if re.search(r"Sanitizer|runtime error", env.log(n))]
        check(not reports, "no sanitizer report in the servers' logs (%s)" % (reports or "none"))
        print("PASS (%.1f s)" % (time.monotonic() - t0))
        return 0
    except BaseException:
        import traceback
        traceback.print_exc(file=sys.stdout)
        for n in ("a", "b", "c", "d"):
            sys.stdout.write("---- tail of %s.log ----\n%s\n" % (n, env.log(n)[-3000:]))
        print("FAIL")
        return 1
    finally:
        env.stop_all()
        shutil.rmtree(env.tmp, ignore_errors=True)
        shutil.rmtree(env.shm, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
