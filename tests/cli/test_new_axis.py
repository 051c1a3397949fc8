"""A new axis is one declaration (bench.model.axes): a toy axis declared in a fresh interpreter is
a flag of the command line, a product of the sweep's cases, a column of the rows, a flag of the
repro command, a facet of the report, a group axis it can be promoted to, and a column of the
summary table, with nothing else written for it."""

import json
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent("""
    import argparse, contextlib, io, json, sys
    from pathlib import Path

    from bench.model import axes

    axes.declare(axes.Axis("toy", "plain", "a toy axis: plain or spicy", "texts", "FLAVOUR",
                           facet_after="kv_layout", promote_after="kv_layout"))

    import pandas as pd

    from bench.cli import build_parser, main
    from bench.runs import store
    from bench.features import repro
    from bench.engine.result import base_row
    from bench.model.spec import Spec
    from reports import frames, groups
    from reports.tables import summary_table

    out, folder = {}, Path(sys.argv[1])
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    out["help"] = "--toy FLAVOUR" in sub.choices["sweep"].format_help()
    given = ["--variants", "naive", "--seq-lens", "64", "--heads", "2", "--head-dims", "16", "--masks", "none",
             "--dtypes", "float32", "--directions", "fwd", "--batch", "1", "--device", "cpu"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        code = main(["sweep", *given, "--toy", "plain,spicy", "--dry-run", "--out", str(folder / "plan")])
    out["dry_run"] = [code, err.getvalue()]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        main(["sweep", *given, "--dry-run", "--out", str(folder / "plan")])
    out["dry_run_without"] = err.getvalue()
    with contextlib.redirect_stderr(io.StringIO()):
        code = main(["sweep", *given, "--toy", "mild,", "--dry-run"])
    out["bad_value_code"] = code
    spec = Spec(variants=["naive"], seq_lens=[64, 128], heads=[2], head_dims=[16], masks=["none"], window=[64],
                dtypes=["float32"], directions=["fwd"], batch=[1], device="cpu", toy=["plain", "spicy"])
    cases = spec.cases()
    out["cases"] = [c.toy for c in cases]
    run = folder / "run"
    run.mkdir()
    w = store.ResultWriter(run)
    for i, case in enumerate(cases):
        w.write(base_row("naive", case, "ok") | {"samples_ms": [1.0 + i] * 9})
    w.close()
    store.write_env(run, {"device": "cpu"})
    rows = store.read_rows(run)
    out["rows"] = [r["toy"] for r in rows]
    out["repro"] = [repro.cell_flags(r) for r in rows]
    df = pd.DataFrame(rows)
    out["varying"] = frames.varying_facets(df)
    out["constant"] = [frames.constant_facets(df[df["toy"] == v]) for v in ("plain", "spicy")]
    out["promote"] = list(groups.PROMOTE)
    out["summary"] = summary_table(rows)
    print(json.dumps(out, default=str))
""")


def test_a_toy_axis_declared_once_is_in_the_cli_the_cases_the_rows_repro_the_facets_and_the_tables(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["help"]
    code, plan = out["dry_run"]
    assert code == 0 and plan.startswith("2 cells in 2 cases") and "2 cells" not in out["dry_run_without"], plan
    assert out["bad_value_code"] == 2
    assert sorted(out["cases"]) == ["plain", "plain", "spicy", "spicy"]
    assert out["rows"] == out["cases"]
    flags = {toy: f for toy, f in zip(out["rows"], out["repro"])}
    assert "--toy" not in flags["plain"] and flags["spicy"][flags["spicy"].index("--toy") + 1] == "spicy"
    assert "toy" in out["varying"]
    assert out["constant"][0].get("toy") is None and out["constant"][1]["toy"] == "spicy"  # unsaid at its default
    assert out["promote"].index("toy") == out["promote"].index("kv_layout") + 1
    lines = out["summary"].splitlines()
    assert lines[1].split()[:2] == ["toy", "variant"] and lines[4].split()[:2] == ["spicy", "naive"], out["summary"]
