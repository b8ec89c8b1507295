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
  - SIGHUP makes hatchkv-server read its token files again (new clients
    authenticate with the new token, the old one is refused); SIGUSR1/2 are
    logged and ignored, by hatchkv-memcached too (before: exit 129 / 138);
  - log lines carry the UTC date; under journald a syslog priority ("<3>"
    error .. "<7>" debug) instead of a time of their own;
  - a --socket in a missing directory is named, and a token the server
    makes is said with its full path (before: neither);
  - a client's missing token file is named as such (before: "authentication
    refused (is the hatchkv server ... running?)");
  - --config FILE gives every program its options from a file (the command
    line wins), and a bad line is named by file and line;
  - under systemd's NOTIFY_SOCKET (Type=notify units) the server says how far
    the region's first touch is (STATUS), READY=1 once it serves, STOPPING=1
    on SIGTERM; hatchkv-memcached READY=1 once it listens.

usage: test_cli.py BINDIR
"""
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "memcached"))
from mc_harness import ctl_auth  # noqa: E402

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


def auth(sock_path, token):
    """The reply's type to an authentication by hand (2 WELCOME, 3 ERROR)."""
    return ctl_auth(sock_path, token)[0]


def write_token(path, tok):
    tmp = path + ".new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, tok + b"\n")
    os.close(fd)
    os.rename(tmp, path)


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

    # log lines: the UTC date and time; under journald (JOURNAL_STREAM names
    # stderr, as systemd sets it) a syslog priority instead, the journal's own time
    for journal in (False, True):
        path = os.path.join(tmp, "j.log" if journal else "d.log")
        with open(path, "w") as f:
            env = dict(os.environ)
            env.pop("JOURNAL_STREAM", None)
            if journal:
                st = os.fstat(f.fileno())
                env["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
            p = subprocess.Popen(base + ["--memory", "16M", "--token-file", tok + ".j"],
                                 stdout=f, stderr=f, env=env)
            time.sleep(1.0)
            p.terminate()
            p.wait(10)
        lines = open(path).read().splitlines()
        want = (r"^<6>hatchkv-server\[\d+\] INFO " if journal else
                r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z hatchkv-server\[\d+\] INFO ")
        check(lines and all(re.match(want.replace("INFO ", "(ERROR|WARN|INFO|DEBUG) ")
                                      .replace("<6>", "<[3467]>"), ln) for ln in lines)
              and re.match(want, lines[0]),
              "log lines %s: %r" % ("under journald" if journal else "dated", lines[0]))

    # a --socket in a missing directory is named; a token the server makes is said
    nodir = os.path.join(tmp, "nodir", "x.sock")
    rc, _, err = run([srv, "-t", "shm", "-s", nodir, "--token-file", tok + ".new", "--memory",
                      "16M"])
    check(rc != 0 and nodir + ".data" in err and "does the --socket directory exist" in err,
          "a --socket in a missing directory: %r" % err.strip().split("\n")[-1])
    check("made a new random token in %s" % os.path.realpath(tok + ".new") in err,
          "the token it made is said, with its full path")
    os.unlink(tok + ".new")

    # a missing token file is named as such, not as a refusal by a server
    rc, _, err = run([os.path.join(bindir, "hatchkv-memcached"), "--server", "shm:" + sock,
                      "--token-file", os.path.join(tmp, "nosuch.token"), "-p", "0"])
    check(rc != 0 and "token file %s: No such file or directory" % os.path.join(tmp, "nosuch.token")
          in err and "authentication refused" not in err,
          "a missing token file: %r" % err.strip().split("\n")[0])

    # --config FILE: the programs' one file format (issue 30; the etcd
    # settings of issue 28 too); the command line wins over the file
    conf = os.path.join(tmp, "server.conf")
    with open(conf, "w") as f:
        f.write("# a server from a file\ntransport = shm\nsocket \"%s\"\n"
                "token-file = %s\nmemory = 16M\ncache\n" % (os.path.join(tmp, "c.sock"), tok))
    p = subprocess.Popen([srv, "--config", conf, "--memory", "24M"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while (not os.path.exists(os.path.join(tmp, "c.sock")) and p.poll() is None and
               time.monotonic() < deadline):
            time.sleep(0.1)
        check(os.path.exists(os.path.join(tmp, "c.sock")) and p.poll() is None,
              "hatchkv-server --config: serves at the file's socket")
    finally:
        p.terminate()
        out = p.communicate(timeout=10)[0].decode()
    check("region 24 MiB" in out and "cache mode" in out,
          "the file's switch (cache) holds, and --memory on the command line beats the file's")
    bad = os.path.join(tmp, "bad.conf")
    for line, what in (("memory\n", "'memory' needs a value"),
                       ("cache = yes\n", "'cache' is a switch"),
                       ("colour = blue\n", "'colour' is no option of hatchkv-server"),
                       ("socket \"x\n", "unterminated quote")):
        with open(bad, "w") as f:
            f.write("# line 1\n" + line)
        rc, _, err = run([srv, "--config", bad])
        check(rc != 0 and "%s:2: " % bad in err and what in err,
              "hatchkv-server --config with %r: %r" % (line.strip(), err.strip()))
    with open(bad, "w") as f:
        f.write("no-such-option\n")
    for prog in PROGS[1:]:
        rc, _, err = run([os.path.join(bindir, prog), "--config", bad])
        check(rc != 0 and "%s:1: 'no-such-option' is no option of %s" % (bad, prog) in err,
              "%s --config names the file, the line and the option" % prog)
    # the etcd settings in the same file: refused without TLS and a user ...
    with open(conf, "w") as f:
        f.write("cluster = etcd://127.0.0.1:1/x\n")
    rc, _, err = run([os.path.join(bindir, "hatchkv-admin"), "--config", conf, "members"])
    check(rc != 0 and "--etcd-insecure" in err, "hatchkv-admin --config without etcd TLS and "
          "user refuses and names --etcd-insecure")
    with open(conf, "a") as f:
        f.write("etcd-insecure\n")
    rc, _, err = run([os.path.join(bindir, "hatchkv-admin"), "--config", conf, "members"])
    check(rc != 0 and "without TLS and a user (--etcd-insecure)" in err and
          "Connection refused" in err, "... and with etcd-insecure in the file it warns and "
          "tries etcd (nothing listens there): %r" % err.strip().split("\n")[-1])

    # Type=notify (sd_notify): STATUS while the region is touched, READY=1
    # once it serves, STOPPING=1 on SIGTERM; hatchkv-memcached READY=1 too
    nsock = os.path.join(tmp, "notify.sock")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(nsock)
    ns.settimeout(1.0)
    env = dict(os.environ, NOTIFY_SOCKET=nsock)

    def notes(until, secs):
        got, deadline = [], time.monotonic() + secs
        while time.monotonic() < deadline and not any(until in g for g in got):
            try:
                got.append(ns.recv(4096).decode())
            except socket.timeout:
                pass
        return got

    nsrv = subprocess.Popen([srv, "-t", "shm", "-s", os.path.join(tmp, "n.sock"), "--token-file",
                             tok, "--memory", "64M"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    nmc = None
    try:
        got = notes("READY=1", 30)
        ready = [i for i, g in enumerate(got) if "READY=1" in g]
        check(ready and any("touching the region" in g for g in got[:ready[0]]),
              "hatchkv-server under NOTIFY_SOCKET: STATUS while touching, then READY=1: %r"
              % got)
        nmc = subprocess.Popen([os.path.join(bindir, "hatchkv-memcached"), "--server",
                                "shm:" + os.path.join(tmp, "n.sock"), "--token-file", tok,
                                "-p", "0"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        got = notes("READY=1", 30)
        check(any("READY=1" in g for g in got), "hatchkv-memcached: READY=1 once it listens")
        nmc.terminate()
        nmc.wait(10)
        nsrv.terminate()
        got = notes("STOPPING=1", 10)
        check(any("STOPPING=1" in g for g in got) and nsrv.wait(10) == 0,
              "SIGTERM: STOPPING=1, exit 0")
    finally:
        for p in (nsrv, nmc):
            if p and p.poll() is None:
                p.kill()
        ns.close()

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

        # SIGHUP: the token file read again; SIGUSR1/2 ignored (before: killed)
        old = open(tok, "rb").read().strip()
        check(auth(sock, old) == 2, "the token authenticates")
        new = os.urandom(16).hex().encode()
        write_token(tok, new)
        a.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        check(a.poll() is None and auth(sock, new) == 2 and auth(sock, old) == 3,
              "after SIGHUP the new token authenticates and the old one is refused")
        a.send_signal(signal.SIGUSR1)
        a.send_signal(signal.SIGUSR2)
        time.sleep(0.3)
        check(a.poll() is None and auth(sock, new) == 2, "SIGUSR1 and SIGUSR2 leave it serving")
        os.unlink(tok)
        a.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        check(a.poll() is None and auth(sock, new) == 2,
              "SIGHUP with the token file gone keeps the token in use")
        with open(os.path.join(tmp, "a.log")) as f:
            text = f.read()
        check("; token file read again" in text and "User defined signal 1 ignored" in text
              and "keeping the token in use" in text, "each signal logged")
        write_token(tok, new)
        mlog = open(os.path.join(tmp, "mc.log"), "w")
        mc = subprocess.Popen([os.path.join(bindir, "hatchkv-memcached"), "--server",
                               "shm:" + sock, "--token-file", tok, "-p", "0"], stdout=mlog,
                              stderr=subprocess.STDOUT)
        try:
            time.sleep(1.0)
            for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
                mc.send_signal(sig)
            time.sleep(0.5)
            check(mc.poll() is None, "hatchkv-memcached lives through SIGHUP, SIGUSR1, SIGUSR2")
            mc.terminate()
            check(mc.wait(10) == 0, "and exits 0 on SIGTERM")
        finally:
            if mc.poll() is None:
                mc.kill()
            mlog.close()
    finally:
        a.terminate()
        a.wait(10)
        log.close()
        subprocess.run(["rm", "-rf", tmp])
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
