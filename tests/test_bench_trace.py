"""hatchkv-bench replays traces (issue 32, item 2): workload T, a CSV trace
file or a generated family, against hatchkv (the library), Debian's
memcached and hatchkv-memcached, each answer checked against the exact LRU
simulator of hatchkv-hitratio on the same trace.

Every cache here holds the whole trace, so a replay in trace order (one
thread) must hit exactly where the simulator hits: the same gets, the same
hit ratio to the hundredth. Then the family split over 2 processes x 2
threads: every request replayed once (gets counted across the processes),
hits within a point of the simulator's (two workers may miss one key
together). Exit 77 (skipped) if Debian's memcached is not installed.

usage: test_bench_trace.py BINDIR TRACE_CSV
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
import mc_harness  # noqa: E402

FAMILY = ["--family", "zipf", "--value", "100", "--value-max", "1000", "--seed", "7"]


def bench(bindir, system_args, trace_args, threads=1, processes=1):
    argv = [os.path.join(bindir, "hatchkv-bench")] + system_args + trace_args + \
        ["-t", str(threads), "-p", str(processes)]
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=240)
    print("$ " + " ".join(argv))
    print(out.stdout)
    if out.returncode:
        raise AssertionError("hatchkv-bench exited %d" % out.returncode)
    got = {}
    for key in ("Gets", "HitRatio(%)", "Skipped"):
        m = re.search(r"^\[TRACE\], %s, ([\d.]+)$" % re.escape(key), out.stdout, re.M)
        got[key] = float(m.group(1)) if m else None
    if got["Gets"] is None or got["HitRatio(%)"] is None:
        raise AssertionError("no [TRACE] lines in its report")
    if re.search(r"Return=ERROR", out.stdout):
        raise AssertionError("errors in its report")
    return got


def flush(ports):
    """flush_all on each memcached-protocol port: the next replay starts empty."""
    for port in ports:
        c = mc_harness.Mc(port)
        c.s.sendall(b"flush_all\r\n")
        ok = c.line()
        c.close()
        if ok != b"OK":
            raise AssertionError("flush_all on port %d: %r" % (port, ok))


def simulated(bindir, trace_args):
    argv = [os.path.join(bindir, "hatchkv-hitratio")] + trace_args + \
        ["--policy", "lru", "--cache-bytes", "256M"]
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=240, check=True)
    m = re.search(r"^lru\s+(\d+)\s+([\d.]+)%$", out.stdout, re.M)
    if not m:
        raise AssertionError("no lru line from hatchkv-hitratio:\n" + out.stdout)
    return int(m.group(1)), float(m.group(2))


def main():
    bindir, csv = sys.argv[1], sys.argv[2]
    if not shutil.which("memcached"):
        print("SKIP: Debian's memcached is not installed (apt-get install memcached)")
        return 77
    fam_keys, fam_reqs = 2000, 20000
    family = FAMILY + ["--records", str(fam_keys), "--operations", str(fam_reqs)]
    sim_csv = simulated(bindir, ["--trace", csv])
    sim_fam = simulated(bindir, FAMILY + ["--keys", str(fam_keys), "--requests",
                                          str(fam_reqs)])
    print("simulated LRU: csv %r, family %r" % (sim_csv, sim_fam))
    failures = []
    with mc_harness.RealMemcached(extra=["-m", "256"]) as real, \
            mc_harness.Daemons(os.path.join(bindir, "hatchkv-memcached"),
                               os.path.join(bindir, "hatchkv-server"),
                               memory="256M", cache=True) as hkv:
        systems = {
            "hatchkv": ["--system", "hatchkv", "--server",
                        "shm:" + os.path.join(hkv.tmp, "ctl.sock"),
                        "--token-file", os.path.join(hkv.tmp, "token")],
            "memcached": ["--system", "memcached", "--memcached", "127.0.0.1:%d" % real.port],
            "hkv-memcached": ["--system", "hkv-memcached", "--hkv-memcached",
                              "127.0.0.1:%d" % hkv.port],
        }
        for name, args in systems.items():
            try:
                # each run starts from an empty cache, as the simulator does
                flush((real.port, hkv.port))
                got = bench(bindir, args, ["--trace", csv])
                if (got["Gets"], got["HitRatio(%)"]) != sim_csv or got["Skipped"]:
                    failures.append("%s, csv: %r, the simulator %r" % (name, got, sim_csv))
                flush((real.port, hkv.port))
                got = bench(bindir, args, family)
                if (got["Gets"], got["HitRatio(%)"]) != sim_fam:
                    failures.append("%s, family: %r, the simulator %r" % (name, got, sim_fam))
            except AssertionError as e:
                failures.append("%s: %s" % (name, e))
        try:
            flush((hkv.port,))
            got = bench(bindir, systems["hatchkv"], family, threads=2, processes=2)
            if got["Gets"] != fam_reqs or abs(got["HitRatio(%)"] - sim_fam[1]) > 1.0:
                failures.append("hatchkv, 2 x 2 workers: %r, the simulator %r" % (got, sim_fam))
        except AssertionError as e:
            failures.append("hatchkv, 2 x 2 workers: %s" % e)
    for f in failures:
        print("FAIL: " + f)
    if failures:
        return 1
    print("ok: hatchkv-bench's replays agree with the simulator on every system")
    return 0


if __name__ == "__main__":
    sys.exit(main())
