"""memccapable -a (libmemcached-tools) against hatchkv-memcached: every ascii test must pass."""
import subprocess
import sys

from mc_harness import Daemons


def main():
    mc_bin, srv_bin = sys.argv[1], sys.argv[2]
    with Daemons(mc_bin, srv_bin) as d:
        r = subprocess.run(["memccapable", "-a", "-t", "10", "-h", "127.0.0.1", "-p", str(d.port)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=110)
        out = r.stdout
        print(out)
        fails = [l for l in out.splitlines() if "[FAIL]" in l]
        passes = [l for l in out.splitlines() if "[pass]" in l]
        if r.returncode != 0 or fails or "All tests passed" not in out:
            print("memccapable: %d passed, %d failed (rc %d)" % (len(passes), len(fails), r.returncode))
            print(d.log("memcached.log")[-3000:])
            return 1
        print("memccapable: all %d ascii tests passed" % len(passes))
        return 0


if __name__ == "__main__":
    sys.exit(main())
