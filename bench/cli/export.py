"""``python -m bench export RUN``: a run in another tool's format (pytest-benchmark's JSON)."""

from __future__ import annotations

from pathlib import Path


def command(args):
    from bench.engine.export import export
    from bench.engine.store import require_run

    print(f"wrote {export(require_run(args.run), Path(args.out) if args.out else None)}")
    return 0


def add_parser(sub) -> None:
    ep = sub.add_parser("export", help="write a run in another tool's format")
    ep.add_argument("run", metavar="RUN", help="the run folder to export")
    ep.add_argument("--format", choices=("pytest-benchmark",), default="pytest-benchmark")
    ep.add_argument("--out", metavar="FILE", help="default: RUN/pytest-benchmark.json")
    ep.set_defaults(func=command)
