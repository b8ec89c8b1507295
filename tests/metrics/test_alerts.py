"""docs/alerts.yml, the alerting rules docs/metrics.md describes (issue 30, item 4).

    python3 test_alerts.py

1. `promtool check rules` accepts the file (PromQL, durations, templates).
2. Every alert is described in docs/metrics.md ("Alerts"), and every hatchkv
   metric an expression names is one docs/metrics.md documents: a misspelt
   metric would make its alert never fire, silently.
3. `promtool test rules tests/metrics/alerts_test.yml` against a copy of the
   rules without annotations (promtool compares them whole): each tested
   rule fires in its failure and not in the normal case beside it.

Exit 0: passed, 1: failed, 77: promtool not installed (Debian's prometheus
package has it).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
RULES = os.path.join(TOP, "docs", "alerts.yml")
DOC = os.path.join(TOP, "docs", "metrics.md")
UNIT = os.path.join(HERE, "alerts_test.yml")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok  ", what)


def alerts_and_exprs(text):
    """[(alert name, its expression)] of a rules file (our layout: `- alert:`
    then `expr:` on one line or folded over the indented lines below)."""
    out, lines = [], text.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"\s*- alert: (\S+)$", line)
        if not m:
            continue
        j = next(k for k in range(i + 1, len(lines)) if lines[k].strip().startswith("expr:"))
        expr = lines[j].split("expr:", 1)[1].strip()
        if expr in (">-", ">", "|"):
            ind = len(lines[j]) - len(lines[j].lstrip())
            parts = []
            for k in range(j + 1, len(lines)):
                if lines[k].strip() and len(lines[k]) - len(lines[k].lstrip()) <= ind:
                    break
                parts.append(lines[k].strip())
            expr = " ".join(parts)
        out.append((m.group(1), expr))
    return out


def strip_annotations(tmp):
    import yaml  # (python3-yaml)

    with open(RULES) as f:
        rules = yaml.safe_load(f)
    for g in rules["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    bare = os.path.join(tmp, "alerts.yml")
    with open(bare, "w") as f:
        yaml.safe_dump(rules, f)
    with open(UNIT) as f:
        unit = yaml.safe_load(f)
    unit["rule_files"] = [bare]
    path = os.path.join(tmp, "alerts_test.yml")
    with open(path, "w") as f:
        yaml.safe_dump(unit, f)
    return path


def main():
    promtool = shutil.which("promtool")
    if not promtool:
        print("SKIP: no promtool (apt-get install prometheus)")
        return 77
    r = subprocess.run([promtool, "check", "rules", RULES], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    out = r.stdout.decode()
    check(r.returncode == 0 and "SUCCESS" in out, "promtool check rules docs/alerts.yml: %s"
          % out.strip().replace("\n", " / "))

    with open(RULES) as f:
        pairs = alerts_and_exprs(f.read())
    with open(DOC) as f:
        doc = f.read()
    check(len(pairs) == int(re.search(r"SUCCESS: (\d+) rules", out).group(1)),
          "%d alerts read from the file" % len(pairs))
    undocumented = [a for a, _ in pairs if a not in doc]
    check(not undocumented, "every alert is described in docs/metrics.md (missing: %s)"
          % (undocumented or "none"))
    named = sorted({m for _, e in pairs for m in re.findall(r"\bhatchkv_[a-z_]+", e)})
    unknown = [m for m in named if not re.search(r"`%s(\{[^`]*\})?`" % m, doc)]
    check(not unknown, "the %d hatchkv metrics the expressions name are all in "
          "docs/metrics.md (unknown: %s)" % (len(named), unknown or "none"))

    tmp = tempfile.mkdtemp(prefix="hkv-alerts-")
    try:
        try:
            unit = strip_annotations(tmp)
        except ImportError:
            print("# no python3-yaml: the rules' unit tests are not run")
            return 0
        r = subprocess.run([promtool, "test", "rules", unit], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        out = r.stdout.decode()
        with open(UNIT) as f:
            tested = sorted(set(re.findall(r"alertname: (\S+)", f.read())))
        check(r.returncode == 0 and "SUCCESS" in out,
              "promtool test rules: %d alerts fire in their failure and not beside it (%s)%s"
              % (len(tested), ", ".join(tested), "" if r.returncode == 0 else "\n" + out))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print("FAIL:", e)
        sys.exit(1)
