"""``python -m bench merge A B ... --out RUN``: the shards of one sweep as one run folder, and its report."""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    mp = sub.add_parser("merge", help="join the shard folders of one sweep into one run folder and build its report")
    mp.add_argument("runs", nargs="+", metavar="RUN", help="the shards' run folders")
    mp.add_argument("--out", metavar="DIR", required=True, help="the merged run folder (new)")
    mp.add_argument("--no-report", dest="no_report", action="store_true", help="skip the report")
    mp.set_defaults(func=command)


def command(args) -> int:
    from bench.engine import store
    from bench.engine.merge import merge_runs

    out = merge_runs(args.runs, Path(args.out))
    rows = store.read_rows(out)
    print(f"merged {len(rows)} rows of {len(args.runs)} run folders into {out}")
    if not args.no_report:
        from reports.build import build_report

        print(f"report: {build_report([out])}")
    return 0
