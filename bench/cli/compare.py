"""``python -m bench compare A B``: the B/A time ratio of every matching cell, with a verdict
against noise, and a regression gate for CI."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.errors import UsageError


def parse_regression(text: str | None) -> tuple[str, float] | None:
    """``--fail-on-regression``: ``PCT``, ``PCT%`` or ``METRIC:PCT%`` (metric median or min)."""

    if text is None:
        return None
    metric, _, pct = str(text).rpartition(":")
    metric = metric or "median"
    try:
        value = float(pct.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if metric not in ("median", "min") or not (value >= 0 and value < float("inf")):
        raise UsageError(f"--fail-on-regression takes PCT, PCT% or METRIC:PCT% with METRIC median or min and "
                         f"PCT a number >= 0 (e.g. median:5%), got {text!r}")
    return metric, value


def command(args):
    from tabulate import tabulate

    from bench.engine.store import require_run, writable_dir
    from reports.compare import compare_runs

    rule = parse_regression(args.fail_on_regression)
    require_run(args.run_b)
    out = writable_dir(args.out if args.out else Path(args.run_b) / "compare")
    m, regressions, warnings, chart, trust = compare_runs(args.run_a, args.run_b, out, rule)
    for name, line in zip("AB", trust):
        print(f"trust {name}: {line}")
    for w in warnings:
        print(f"warning: the environments differ: {w}", file=sys.stderr)
    if m.empty:
        print("no matching ok cells between the two runs: no cell has the same variant and case, "
              "with status ok, in both", file=sys.stderr)
        return 3 if rule else 0
    cols = ["variant", "dtype", "mask", "direction", "q_len", "median_ms_a", "median_ms_b", "ratio", "verdict"]
    print(tabulate(m[cols], headers=["variant", "dtype", "mask", "dir", "n", "A ms", "B ms", "B/A", "verdict"],
                   showindex=False, floatfmt=".4g"))
    counts = m["verdict"].value_counts()
    shaky = int(counts.get("shaky", 0))
    other = int(counts.get("other timer", 0))
    apart = f", Other timer {other}" if other else ""
    print(f"Better {counts.get('faster', 0)}, Same {counts.get('within noise', 0)}, Worse {counts.get('slower', 0)}, "
          f"Shaky {shaky}{apart} (of {len(m)} matching cells; chart: {chart})")
    if other:
        pairs = sorted({f"{a} in A, {b} in B" for a, b in zip(m["timer_a"], m["timer_b"]) if a != b})
        print(f"warning: {other} matching cell(s) were timed with different timers ({'; '.join(pairs)}): their "
              f"times measure different things and are not judged", file=sys.stderr)
    if shaky and args.strict_trust:
        print(f"strict trust: {shaky} matching cell(s) are noisy or contended in A or B; re-measure them "
              f"(sweep --resume RUN --retry shaky) before comparing", file=sys.stderr)
        return 1
    if rule and shaky:
        print(f"note: {shaky} shaky cell(s) were not judged for regressions (noisy or contended in A or B; "
              f"--strict-trust fails on them)", file=sys.stderr)
    if rule and len(regressions):
        beyond = "beyond noise" if rule[0] == "median" else "in their fastest sample"
        print(f"{len(regressions)} cell(s) slower by more than {rule[1]:g}% {beyond} ({rule[0]})", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    cp = sub.add_parser("compare", help="B/A time ratio per matching cell of two runs")
    cp.add_argument("run_a", metavar="RUN_A", help="the reference run folder")
    cp.add_argument("run_b", metavar="RUN_B", help="the run folder compared with it (B/A)")
    cp.add_argument("--fail-on-regression", dest="fail_on_regression", metavar="RULE",
                    help="exit 1 when a cell regressed: PCT, or median:PCT%% (B's first quartile more than "
                         "PCT%% above A's third), or min:PCT%% (B's fastest sample more than PCT%% above A's); "
                         "exit 3 when no cell matches")
    cp.add_argument("--strict-trust", dest="strict_trust", action="store_true",
                    help="exit 1 when a matching cell is noisy or contended in either run (by default such "
                         "cells are counted as Shaky and never judged a regression)")
    cp.add_argument("--out", metavar="DIR", help="where the table and chart go (default: RUN_B/compare)")
    cp.set_defaults(func=command)
