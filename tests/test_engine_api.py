"""The engine driven from Python, as README shows it: a Spec in, a RunSummary out, no Namespace."""

import re

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_readmes_python_sweep_runs_as_written(tmp_path, monkeypatch, capsys):
    block = re.search(r"From Python .*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)  # its runs/notebook lands here
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
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
