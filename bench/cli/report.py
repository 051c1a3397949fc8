"""``python -m bench report``: (re)build the report of one or more run folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def command(args):
    from bench.runs.store import DEFAULT_ROOT, writable_dir
    from reports.build import build_report

    runs = args.runs or [str(DEFAULT_ROOT / "latest")]
    first: dict = {}
    for r in runs:  # one run named twice (or once more through runs/latest): read once
        first.setdefault(Path(r).resolve(), r)
    unique = list(first.values())
    if len(unique) < len(runs):
        twice = sorted({r for r in runs if runs.count(r) > 1 or r not in unique})
        print(f"warning: {', '.join(twice)} named more than once (or through a link to the same folder): each run "
              f"is read once", file=sys.stderr)
        runs = unique
    out = writable_dir(args.out) if args.out else None
    if args.svg:
        from reports.charts import SVG_ENV

        os.environ[SVG_ENV] = "1"  # the drawing processes read it
    print(f"report: {build_report(runs, out)}")
    return 0


def add_parser(sub) -> None:
    rp = sub.add_parser("report", help="(re)build the report of one or more run folders")
    rp.add_argument("runs", nargs="*", metavar="RUN",
                    help="run folders, one report for all of them (default: runs/latest)")
    rp.add_argument("--out", metavar="DIR", help="report folder (default: RUN/report)")
    rp.add_argument("--svg", action="store_true", help="every chart as SVG too (the page embeds PNG; SVG doubles "
                                                       "the drawing time)")
    rp.set_defaults(func=command)
