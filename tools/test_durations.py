"""The durations report of a test run, as Markdown: the slowest tests and the time by file.

    python tools/test_durations.py .test-results/junit.xml --title "fresh clone, 2026-11-29" > docs/test-durations.md

``make test`` leaves the JUnit XML of its run in ``.test-results/junit.xml``.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("junit", help="pytest's --junitxml file")
    p.add_argument("--slowest", type=int, default=30)
    p.add_argument("--title", default="", help="what run this was (where, when, which commit, how long make test took)")
    args = p.parse_args(argv)
    root = ET.parse(args.junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = []
    for tc in root.iter("testcase"):
        status = "skipped" if tc.find("skipped") is not None else "failed" if tc.find("failure") is not None or tc.find("error") is not None else "passed"
        cases.append((float(tc.get("time", 0)), tc.get("classname", ""), tc.get("name", ""), status))
    by_file: dict[str, list[float]] = defaultdict(list)
    for t, cls, _name, _status in cases:
        by_file[cls.split(".")[1] if cls.startswith("tests.") else cls.split(".")[0]].append(t)
    total = sum(t for t, *_ in cases)
    wall = sum(float(s.get("time", 0)) for s in suites)
    counts = {k: sum(1 for c in cases if c[3] == k) for k in ("passed", "failed", "skipped")}
    out = ["# Test durations", ""]
    if args.title:
        out += [args.title, ""]
    out += [f"{len(cases)} tests ({counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped); "
            f"pytest's wall time {wall / 60:.1f} min, the tests' own time {total / 60:.1f} min.", "",
            f"## The {args.slowest} slowest", "", "| seconds | test |", "|---:|---|"]
    for t, cls, name, _status in sorted(cases, reverse=True)[: args.slowest]:
        out.append(f"| {t:.1f} | `{cls.split('.', 1)[-1]}::{name}` |")
    out += ["", "## By file", "", "| seconds | share | tests | file |", "|---:|---:|---:|---|"]
    for f, ts in sorted(by_file.items(), key=lambda kv: -sum(kv[1])):
        out.append(f"| {sum(ts):.1f} | {sum(ts) / total:.0%} | {len(ts)} | `tests/{f}.py` |")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
