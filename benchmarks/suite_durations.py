"""The test suite's time by module, from the JUnit XML of two runs (before and after a change).

    python benchmarks/suite_durations.py BEFORE.xml AFTER.xml [--top 30]

`.ci/run` keeps each CI run's XML under ~/.cache/solaris-ci/durations/; a local run writes one
with `make test PYTEST_ARGS="--junitxml=FILE"`. Prints a Markdown table of seconds per test module
(setup, call and teardown of its tests, as pytest reports them), the ratio after/before, and the
slowest tests of the second run. A module in one run only shows a dash for the other.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def test_seconds(path: Path) -> list[tuple[str, str, float, str]]:
    """(module, test, seconds, outcome) for every test case of a JUnit XML file."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1] or "(collection)"
        outcome = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None), "passed")
        rows.append((module, case.get("name", ""), float(case.get("time", 0)), outcome))
    return rows


def by_module(rows) -> dict[str, float]:
    out: dict[str, float] = collections.Counter()
    for module, _, seconds, _ in rows:
        out[module] += seconds
    return dict(out)


def table(before: dict[str, float], after: dict[str, float]) -> str:
    lines = ["| module | before (s) | after (s) | after / before |", "|---|---:|---:|---:|"]
    for m in sorted(set(before) | set(after), key=lambda m: -max(before.get(m, 0), after.get(m, 0))):
        b, a = before.get(m), after.get(m)
        ratio = f"{a / b:.2f}" if a is not None and b else "-"
        lines.append(f"| {m} | {'-' if b is None else f'{b:.0f}'} | {'-' if a is None else f'{a:.0f}'} | {ratio} |")
    tb, ta = sum(before.values()), sum(after.values())
    lines.append(f"| **all** | **{tb:.0f}** | **{ta:.0f}** | **{ta / tb:.2f}** |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--top", type=int, default=30, help="how many of the second run's slowest tests to list")
    args = p.parse_args(argv)
    for f in (args.before, args.after):
        if not f.is_file():
            p.error(f"{f} is not a file (a JUnit XML written by pytest --junitxml)")
    before, after = test_seconds(args.before), test_seconds(args.after)
    print(table(by_module(before), by_module(after)))
    print(f"\nslowest {args.top} tests of {args.after.name}:\n")
    print("| seconds | module | test | outcome |\n|---:|---|---|---|")
    for module, name, seconds, outcome in sorted(after, key=lambda r: -r[2])[:args.top]:
        print(f"| {seconds:.0f} | {module} | {name} | {outcome} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
