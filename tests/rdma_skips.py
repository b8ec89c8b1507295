#!/usr/bin/env python3
"""rdma_skips.py BUILD_DIR - on a host with no RDMA device, every test of the
rdma and netdev labels must skip cleanly (issue 33): exit with its
SKIP_RETURN_CODE (77), print one "SKIP: <why> (run through
scripts/softroce-run ...)" line, start nothing and crash nowhere; and with
HKV_REQUIRE_RDMA set the same test must fail instead (the Soft-RoCE guest's
rule). Runs each test's own command, as ctest lists it, not ctest itself (a
nested ctest would write the Testing/ log of the run it is part of).

Host only: with an RDMA device present this check has nothing to check and
skips (exit 77)."""
import json
import os
import subprocess
import sys
import time

LABELS = "rdma|netdev"
LIMIT_S = 60  # a skip starts nothing: anything near this is a bug


def devices():
    d = "/sys/class/infiniband"
    return [n for n in os.listdir(d) if not n.startswith(".")] if os.path.isdir(d) else []


def main():
    build = sys.argv[1]
    if devices():
        print("SKIP: this host has RDMA devices (%s): the rdma label runs for real here"
              % " ".join(devices()))
        return 77
    listing = subprocess.run(["ctest", "--test-dir", build, "-N", "-L", LABELS,
                              "--show-only=json-v1"], check=True, capture_output=True,
                             text=True).stdout
    tests = json.loads(listing)["tests"]
    failures = 0
    if len(tests) < 10:
        print("not ok - only %d tests carry the labels %s" % (len(tests), LABELS))
        return 1
    for t in tests:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = dict(os.environ)
        env.pop("HKV_REQUIRE_RDMA", None)
        for kv in props.get("ENVIRONMENT", []):
            k, _, v = kv.partition("=")
            env[k] = v
        cwd = props.get("WORKING_DIRECTORY", build)
        want = props.get("SKIP_RETURN_CODE")
        problems = []
        if want != 77:
            problems.append("SKIP_RETURN_CODE is %r, not 77" % (want,))
        t0 = time.monotonic()
        try:
            r = subprocess.run(t["command"], cwd=cwd, env=env, capture_output=True, text=True,
                               timeout=LIMIT_S, stdin=subprocess.DEVNULL)
            rc, out = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            rc, out = None, ""
            problems.append("still running after %d s" % LIMIT_S)
        secs = time.monotonic() - t0
        skip_lines = [ln for ln in out.splitlines() if ln.startswith("SKIP: ")]
        if rc is not None and rc != 77:
            problems.append("exit status %d, not 77 (skip)" % rc)
        if rc == 77 and (len(skip_lines) != 1 or "scripts/softroce-run" not in skip_lines[0]):
            problems.append("no single SKIP line naming scripts/softroce-run: %r" % skip_lines)
        # HKV_REQUIRE_RDMA (the guest's rule) turns the same skip into a failure
        env["HKV_REQUIRE_RDMA"] = "1"
        try:
            req = subprocess.run(t["command"], cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=LIMIT_S, stdin=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            req = None
        if req in (0, 77, None) or req < 0:
            problems.append("with HKV_REQUIRE_RDMA: exit status %r, not a failure" % req)
        if problems:
            failures += 1
            print("not ok - %s: %s" % (t["name"], "; ".join(problems)))
            for ln in out.splitlines()[-8:]:
                print("   | " + ln)
        else:
            print("ok - %s skips in %.2f s: %s" % (t["name"], secs, skip_lines[0]))
    print("%d passed, %d failed" % (len(tests) - failures, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
