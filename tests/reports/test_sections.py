"""A feature plugs in by its declaration (bench.model.features): a toy feature, with a report
section (reports.sections's protocol) and a subcommand of its own, declared beside the others is
a command of ``python -m bench`` and a section of index.html and report.md, its CSV written, with
nothing else edited."""

import argparse
import sys
import types

import pandas as pd

from bench.cli import build_parser, main
from bench.model import features
from reports.build import build_report
from reports.sections import Section
from tests.support.runs import run_folder, timed_rows


def _toy_modules(monkeypatch) -> None:
    section = types.ModuleType("toy_section")

    def sections(ctx):
        table = ctx.df.groupby("variant", as_index=False)["median_ms"].max().rename(columns={"median_ms": "worst"})
        table.to_csv(ctx.folder / "toy.csv", index=False)
        return [Section("toy", "Toy section", "slowest cell per variant", table),
                Section("toy-empty", "Toy with nothing", "never shown", table.iloc[:0])]

    section.sections = sections
    command = types.ModuleType("toy_command")

    def add_parser(sub):
        p = sub.add_parser("toy", help="a toy command")
        p.add_argument("n", type=int)
        p.set_defaults(func=lambda args: print("toy", args.n * 2) or 0)

    command.add_parser = add_parser
    monkeypatch.setitem(sys.modules, "toy_section", section)
    monkeypatch.setitem(sys.modules, "toy_command", command)
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, features.Feature(
        "toy", "a toy", section="toy_section", commands=("toy_command",))))


def test_a_declared_feature_adds_its_command_and_its_report_section(tmp_path, monkeypatch, capsys):
    _toy_modules(monkeypatch)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices)[:3] == ["list", "sweep", "report"] and list(sub.choices)[-1] == "toy"
    assert main(["toy", "21"]) == 0 and capsys.readouterr().out == "toy 42\n"
    run = run_folder(tmp_path / "run", timed_rows("naive", 1.0, 0.02) + timed_rows("sdpa", 0.5, 0.02))
    page = build_report([run]).read_text()
    md = (run / "report" / "report.md").read_text()
    assert page.count("<h3 id=toy>Toy section</h3>") == 1 and page.count("slowest cell per variant") == 1
    assert "toy-empty" not in page and "Toy with nothing" not in md  # a section with an empty table is left out
    assert md.count("### Toy section") == 1
    assert page.index("<h3 id=toy>") > page.index("<h2 id=scaling>")  # among the sections, after the scaling
    worst = pd.read_csv(run / "report" / "toy.csv").set_index("variant")["worst"]
    assert worst.to_dict() == {"naive": 1e-5 * 1024**2, "sdpa": 0.5e-5 * 1024**2}


def test_a_declared_section_draws_the_groups_it_claims_and_only_those(monkeypatch, tmp_path):
    """reports.sections's ``group_charts``: a toy section claims the groups of one variant; the other
    groups are drawn as lines over n."""
    from reports.build import group_chart_jobs
    from reports.charts import chart
    from reports.frames import load_runs
    from reports.tables import with_metrics

    section = types.ModuleType("toy_groups")

    def toy_chart(*a, **k):
        return None

    section.sections = lambda ctx: []
    section.group_charts = lambda frame, folder, style: (
        [("toy", toy_chart, frame, {"out": folder / "toy"})] if set(frame["variant"]) == {"naive"} else None)
    monkeypatch.setitem(sys.modules, "toy_groups", section)
    monkeypatch.setattr(features, "FEATURES", (features.Feature("toy", "a toy", section="toy_groups"),
                                               *features.FEATURES))
    run = run_folder(tmp_path / "run", timed_rows("naive", 1.0, 0.02) + timed_rows("sdpa", 0.5, 0.02))
    df = with_metrics(load_runs([run])[0], None)
    claimed = group_chart_jobs(df[df["variant"] == "naive"], tmp_path / "charts", {}, None, {})
    assert [(name, fn) for name, fn, _, _ in claimed] == [("toy", toy_chart)]
    others = group_chart_jobs(df, tmp_path / "charts", {}, None, {})
    assert chart in {fn for _, fn, _, _ in others} and toy_chart not in {fn for _, fn, _, _ in others}
