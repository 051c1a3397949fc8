"""The engine driven from Python, as the reference shows it (bench/README.md): a Spec in, a RunSummary out, no
Namespace."""

import re

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_readmes_python_sweep_runs_as_written(tmp_path, monkeypatch, capsys):
    block = re.search(r"From Python .*?```python\n(.*?)```", (ROOT / "bench" / "README.md").read_text(),
                      re.S).group(1)
    monkeypatch.chdir(tmp_path)  # its runs/notebook lands here
    namespace = {}
    exec(compile(block, "bench/README.md", "exec"), namespace)
    summary = namespace["summary"]
    assert summary.run_dir == tmp_path / "runs" / "notebook" or summary.run_dir.resolve() == \
        (tmp_path / "runs" / "notebook").resolve()
    assert summary.cells == 4 and summary.already == 0 and sum(summary.counts.values()) == 4
    assert {(r["variant"], r["q_len"], r["mask"]) for r in summary.rows} == \
        {(v, n, "causal") for v in ("naive", "sdpa") for n in (256, 512)}
    assert summary.counts["ok"] == 4 and 0 < summary.timed_s < summary.elapsed_s
    assert (summary.run_dir / "report" / "index.html").exists()
    out = capsys.readouterr().out
    assert "index.html" in out and "timed of" in out
    again = namespace["run_sweep"](namespace["spec"], summary.run_dir,
                                   namespace["run_sweep"].__globals__["SweepOptions"](resume=True, progress=False))
    assert again.cells == 0 and again.already == 4  # the folder had them all: nothing measured twice


@pytest.mark.slow
def test_the_api_and_the_command_line_resume_the_same_way(tmp_path):
    """One path from what is asked to the spec (bench.engine.request): resuming from Python and from
    the command line both start from the run's saved spec, take the settings given over it and add
    the variants of a plugin named for the first time."""
    import json
    import shutil

    from bench.api import SweepOptions, build_spec, discover, parse_values, run_sweep
    from tests.conftest import read_jsonl, run_cli, write_plugin

    plugin = write_plugin(tmp_path, "extra", """
        import torch.nn.functional as F
        from bench.registry import variant

        @variant("extra.sdpa", description="SDPA from a plugin", masks=("none",))
        def extra(case):
            return F.scaled_dot_product_attention
    """)
    values = parse_values({"variants": ["naive"], "seq_lens": [32], "heads": [2], "head_dims": [8], "masks": ["none"],
                           "directions": ["fwd"], "budget_ms": 5.0, "device": "cpu", "remeasure": 0, "visits": 1})
    run_sweep(build_spec(values, discover()), tmp_path / "cli", SweepOptions(progress=False))
    shutil.copytree(tmp_path / "cli", tmp_path / "api")
    proc = run_cli("sweep", "--resume", tmp_path / "cli", "--plugin", plugin, "--seq-lens", "32,48", "--no-report",
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = run_sweep(None, tmp_path / "api", SweepOptions(progress=False), resume=True,
                        given=parse_values({"plugins": [str(plugin)], "seq_lens": [32, 48]}))
    assert summary.already == 1 and summary.cells == 3

    def cells(folder):
        return sorted((r["variant"], r["q_len"]) for r in read_jsonl(folder / "results.jsonl"))

    assert cells(tmp_path / "cli") == cells(tmp_path / "api") == [("extra.sdpa", 32), ("extra.sdpa", 48),
                                                                 ("naive", 32), ("naive", 48)]
    specs = [json.loads((tmp_path / f / "env.json").read_text())["spec"] for f in ("cli", "api")]
    assert specs[0] == specs[1] and specs[0]["budget_ms"] == 5.0  # the saved spec's settings, kept


@pytest.mark.slow
def test_a_sweep_discovers_its_variants_and_expands_its_cells_once(tmp_path, monkeypatch):
    """The command line prepares the sweep (registry, cells, plan: bench.engine.prepare) and hands it
    to the engine, which neither discovers the variants again nor expands the cells again."""
    from bench.cli import main
    from bench.engine import discovery, prepare
    from bench.model.spec import Spec

    calls = {"discover": 0, "prepare": 0, "cases": 0}
    real_discover, real_prepare, real_cases = discovery.discover, prepare.prepare, Spec.cases

    def counting(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(discovery, "discover", counting("discover", real_discover))
    monkeypatch.setattr(prepare, "prepare", counting("prepare", real_prepare))
    monkeypatch.setattr(Spec, "cases", counting("cases", real_cases))
    assert main(["sweep", "--out", str(tmp_path / "run"), "--variants", "naive", "--seq-lens", "32", "--heads", "2",
                 "--head-dims", "8", "--masks", "none", "--directions", "fwd", "--budget-ms", "5", "--visits", "1",
                 "--remeasure", "0", "--no-report", "--quiet", "--device", "cpu"]) == 0
    assert calls == {"discover": 1, "prepare": 1, "cases": 1}, calls
