"""hatchkv-hitratio --memcached (issue 32, item 2): one generated trace replayed
look-aside (get; on a miss, set) through the memcached text protocol against
Debian's memcached and hatchkv-memcached (over a cache-mode hatchkv-server) in
one run, beside the LRU simulator.

Every cache here holds the whole trace (2000 keys of at most 1000 B in 64 MB),
so each one's hits must be exactly the simulator's: every get but each key's
first. Exit 77 (skipped) if Debian's memcached is not installed.

Then a small cache as users start one (16 MB, the server's default segment
size): values of 100 B - 8 KB need about 20 size classes, each a segment of
its own, so 1 MiB segments (15 of them) starved most classes - 63 % against
exact LRU's 82 %. Its hit ratio must be within 2 points of exact LRU's.

usage: test_hitratio_memcached.py BINDIR
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
import mc_harness  # noqa: E402


def main():
    bindir = sys.argv[1]
    if not shutil.which("memcached"):
        print("SKIP: Debian's memcached is not installed (apt-get install memcached)")
        return 77
    with mc_harness.RealMemcached(extra=["-m", "64"]) as real, \
            mc_harness.Daemons(os.path.join(bindir, "hatchkv-memcached"),
                               os.path.join(bindir, "hatchkv-server"),
                               memory="64M", cache=True) as hkv:
        addrs = ["127.0.0.1:%d" % real.port, "127.0.0.1:%d" % hkv.port]
        argv = [os.path.join(bindir, "hatchkv-hitratio"), "--family", "zipf", "--keys", "2000",
                "--requests", "20000", "--value", "100", "--value-max", "1000", "--seed", "7",
                "--policy", "lru", "--cache-bytes", "64M", "--memcached", ",".join(addrs)]
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=240)
        print(out.stdout)
        if out.returncode:
            print("FAIL: hatchkv-hitratio exited %d" % out.returncode)
            return 1
        rows = {}
        for line in out.stdout.splitlines():
            m = re.match(r"^(\S+)\s+(\d+)\s+([\d.]+)%$", line)
            if m:
                rows[m.group(1)] = (int(m.group(2)), m.group(3))
        for name in ["lru"] + addrs:
            if name not in rows:
                print("FAIL: no line for %s" % name)
                return 1
            if rows[name] != rows["lru"]:
                print("FAIL: %s %r, the simulator %r" % (name, rows[name], rows["lru"]))
                return 1
        if rows["lru"][0] != 20000 or float(rows["lru"][1]) < 80:
            print("FAIL: the simulator's line %r" % (rows["lru"],))
            return 1
        if not re.search(r"# 127\.0\.0\.1:%d: .*0 error replies" % real.port, out.stdout):
            print("FAIL: memcached answered with errors")
            return 1
    with mc_harness.Daemons(os.path.join(bindir, "hatchkv-memcached"),
                            os.path.join(bindir, "hatchkv-server"),
                            memory="16M", cache=True, cache_segment=None) as small:
        addr = "127.0.0.1:%d" % small.port
        argv = [os.path.join(bindir, "hatchkv-hitratio"), "--family", "zipf", "--keys", "40000",
                "--requests", "200000", "--value", "100", "--value-max", "8192", "--seed", "42",
                "--policy", "lru", "--cache-bytes", "16M", "--memcached", addr]
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, timeout=240)
        print(out.stdout)
        print([ln for ln in small.log("server.log").splitlines() if "store:" in ln])
        rows = dict(re.findall(r"^(\S+)\s+\d+\s+([\d.]+)%$", out.stdout, re.M))
        if out.returncode or "lru" not in rows or addr not in rows:
            print("FAIL: hatchkv-hitratio exited %d or gave no lines" % out.returncode)
            return 1
        if float(rows[addr]) < float(rows["lru"]) - 2:
            print("FAIL: a 16 MB cache's hit ratio %s %%, exact LRU's %s %%" %
                  (rows[addr], rows["lru"]))
            return 1
    print("ok: memcached, hatchkv-memcached and the simulator agree; 16 MB holds its own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
