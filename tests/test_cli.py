"""The programs' command lines as an operator meets them (issue 30, the
"Programs" points):

  - every program answers --version (and -V where the short option is free)
    with its version, the region layout, the control protocol and the git
    revision, exit 0;
  - hatchkv-server's sizes are parsed strictly, each refusal saying what is
    wrong: a sign, zero, an unknown suffix, a number or a product too large
    for 64 bits (before: "-5G" became an 18-exabyte region, a 21-digit number
    became 2^64 silently, "1T" said only "bad --memory");
  - a region larger than the memory available (MemAvailable, or the cgroup's
    memory.max) is refused with the figure, unless --force (before: accepted,
    growing ~700 MB/s until killed);
  - a second server on a live --socket refuses to start and leaves the first
    one's sockets alone (before: it took them over, and deleted them on exit);
  - a client's missing token file is named as such (before: "authentication
    refused (is the hatchkv server ... running?)").

usage: test_cli.py BINDIR
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

PROGS = ("hatchkv-server", "hatchkv-memcached", "hatchkv-admin", "hatchkv-bench")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what, flush=True)


def run(argv, timeout=20):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def mem_total():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def main(bindir):
    pat = re.compile(r"^(\S+) \d+\.\d+\.\d+ \(region layout \d+, control protocol \d+, "
                     r"git \S+\)\n$")
    for prog in PROGS:
        rc, out, _ = run([os.path.join(bindir, prog), "--version"])
        m = pat.match(out)
        check(rc == 0 and m and m.group(1) == prog, "%s --version: %r" % (prog, out.strip()))
    for prog in ("hatchkv-server", "hatchkv-memcached", "hatchkv-admin"):
        rc, out, _ = run([os.path.join(bindir, prog), "-V"])
        check(rc == 0 and pat.match(out), "%s -V" % prog)

    srv = os.path.join(bindir, "hatchkv-server")
    tmp = tempfile.mkdtemp(prefix="hkv-cli-")
    os.chmod(tmp, 0o700)
    sock, tok = os.path.join(tmp, "ctl.sock"), os.path.join(tmp, "token")
    base = [srv, "-t", "shm", "-s", sock, "--token-file", tok]
    for value, why in (("-5G", "no sign"), ("+5G", "no sign"), ("0", "zero"),
                       ("12Q", "unknown suffix"), ("1.5G", "unknown suffix"),
                       ("G", "not a number"), ("99999999999999999999999", "too large a number"),
                       ("18446744073709551615G", "too large (over 16 EiB)")):
        rc, _, err = run(base + ["--memory", value])
        check(rc == 2 and ("bad --memory '%s': %s" % (value, why)) in err,
              "--memory %s refused: %r" % (value, err.strip()))
    big = (mem_total() * 2) >> 30
    rc, _, err = run(base + ["--memory", "%dG" % big])
    check(rc == 2 and "is more than this machine has" in err and "--force" in err,
          "--memory %dG (twice the machine) refused: %r" % (big, err.strip()))

    # a missing token file is named as such, not as a refusal by a server
    rc, _, err = run([os.path.join(bindir, "hatchkv-memcached"), "--server", "shm:" + sock,
                      "--token-file", os.path.join(tmp, "nosuch.token"), "-p", "0"])
    check(rc != 0 and "token file %s: No such file or directory" % os.path.join(tmp, "nosuch.token")
          in err and "authentication refused" not in err,
          "a missing token file: %r" % err.strip().split("\n")[0])

    # a second server on a live socket
    log = open(os.path.join(tmp, "a.log"), "w")
    a = subprocess.Popen(base + ["--memory", "16M"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        up = False
        while not up and time.monotonic() < deadline and a.poll() is None:
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                up = True
            except OSError:
                time.sleep(0.05)
        check(up, "the first server serves at its socket")
        ino = (os.stat(sock).st_ino, os.stat(sock + ".data").st_ino)
        rc, _, err = run(base + ["--memory", "16M"], timeout=20)
        check(rc != 0 and "another server is serving at" in err,
              "a second server on the same --socket refuses: %r" % err.strip().split("\n")[-1])
        check((os.stat(sock).st_ino, os.stat(sock + ".data").st_ino) == ino and a.poll() is None,
              "the first server's sockets are untouched and it still runs")
        s = socket.socket(socket.AF_UNIX)
        s.connect(sock)
        s.close()
        check(True, "the first server still accepts at its socket")
    finally:
        a.terminate()
        a.wait(10)
        log.close()
        subprocess.run(["rm", "-rf", tmp])
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
