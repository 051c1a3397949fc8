"""``python -m bench export RUN``: a run in another tool's format (pytest-benchmark's JSON)."""

from __future__ import annotations

from pathlib import Path

DEFAULT = "pytest-benchmark.json"  # RUN/pytest-benchmark.json: the export's own file in the run folder


def command(args):
    from bench.features.export import export
    from bench.runs.store import output_file, require_run

    run = require_run(args.run)
    out = output_file(Path(args.out) if args.out else run / DEFAULT, force=args.force, own=(DEFAULT,))
    print(f"wrote {export(run, out)}")
    return 0


def add_parser(sub) -> None:
    ep = sub.add_parser("export", help="write a run in another tool's format")
    ep.add_argument("run", metavar="RUN", help="the run folder to export")
    ep.add_argument("--format", choices=("pytest-benchmark",), default="pytest-benchmark")
    ep.add_argument("--out", metavar="FILE", help="default: RUN/pytest-benchmark.json; never a file of a run folder")
    ep.add_argument("--force", action="store_true", help="replace FILE when it exists (never a run's own files)")
    ep.set_defaults(func=command)
