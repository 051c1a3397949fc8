"""A feature plugs in by its declaration (bench.model.features): a toy feature declared in a fresh
interpreter, with a report section (reports.sections's protocol) and a subcommand of its own, is a
command of ``python -m bench`` and a section of index.html and report.md, its CSV written, with
nothing else edited."""

import json
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent("""
    import argparse, json, sys, types
    from dataclasses import replace
    from pathlib import Path

    import pandas as pd

    from bench.model import features

    section = types.ModuleType("toy_section")
    exec('''
    from reports.sections import Section

    def sections(ctx):
        table = ctx.df.groupby("variant", as_index=False)["median_ms"].max().rename(columns={"median_ms": "worst ms"})
        table.to_csv(ctx.folder / "toy.csv", index=False)
        return [Section("toy", "Toy section", "each variant's slowest cell", table),
                Section("toy-empty", "Toy with nothing", "never shown", table.iloc[:0])]
    ''', section.__dict__)
    command = types.ModuleType("toy_command")
    exec('''
    def add_parser(sub):
        p = sub.add_parser("toy", help="a toy command")
        p.add_argument("n", type=int)
        p.set_defaults(func=lambda args: print("toy", args.n * 2) or 0)
    ''', command.__dict__)
    sys.modules["toy_section"], sys.modules["toy_command"] = section, command
    features.FEATURES = (*features.FEATURES, features.Feature("toy", "a toy", section="toy_section",
                                                              commands=("toy_command",)))

    from bench.cli import build_parser, main
    from reports.build import build_report
    from tests.support.runs import run_folder, timed_rows

    out, folder = {}, Path(sys.argv[1])
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out["commands"] = list(sub.choices)
    out["code"] = main(["toy", "21"])
    run = run_folder(folder / "run", timed_rows("naive", 1.0, 0.02) + timed_rows("sdpa", 0.5, 0.02))
    page = build_report([run]).read_text()
    md = (run / "report" / "report.md").read_text()
    out["html"] = [page.count("<h3 id=toy>Toy section</h3>"), page.count("toy-empty"), page.count("each variant")]
    out["md"] = [md.count("### Toy section"), md.count("Toy with nothing")]
    out["csv"] = pd.read_csv(run / "report" / "toy.csv").to_dict("records")
    out["after"] = page.index("<h3 id=toy>") > page.index("<h2 id=scaling>")
    print(json.dumps(out))
""")


def test_a_declared_feature_adds_its_command_and_its_report_section(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    *printed, last = done.stdout.strip().splitlines()
    out = json.loads(last)
    assert out["commands"][-1] == "toy" and out["commands"][:3] == ["list", "sweep", "report"]
    assert out["code"] == 0 and printed == ["toy 42"]
    assert out["html"] == [1, 0, 1]  # shown once, with its note; the empty one left out
    assert out["md"] == [1, 0]
    worst = {r["variant"]: r["worst ms"] for r in out["csv"]}
    assert set(worst) == {"naive", "sdpa"}
    assert abs(worst["naive"] - 1e-5 * 1024**2) < 1e-9 and abs(worst["sdpa"] - 0.5e-5 * 1024**2) < 1e-9
    assert out["after"]

