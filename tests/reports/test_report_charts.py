"""Reports built from real small sweeps that once failed to build: a bf16 sweep with an
approximate variant (every exact variant's error above the Pareto chart's break), and a sweep
whose report cannot be built fails with its rows kept."""

import pandas as pd
import pytest

from bench.cli import main
from tests.conftest import made_once, read_jsonl, run_cli


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    folder, res = made_once(tmp_path_factory, "bf16", lambda f: run_cli(
        "sweep", "--variants", "naive,linear.elu", "--dtypes", "bf16", "--seq-lens", "64,128", "--masks", "causal",
        "--directions", "fwd", "--heads", "2", "--head-dims", "16", "--budget-ms", "20", "--out", f / "run"))
    return folder / "run", res


@pytest.mark.slow  # a sweep in a subprocess
def test_a_bf16_sweep_with_an_approximation_writes_its_report(bf16_run):
    out, res = bf16_run
    assert res.returncode == 0, res.stderr
    assert "report:" in res.stdout.splitlines()[-1]
    rows = [r for r in read_jsonl(out / "results.jsonl") if r["variant"] == "naive"]
    assert rows and all(r["rel_err"] > 1e-3 for r in rows)  # the case that broke: no exact error below the break
    assert (out / "report" / "charts" / "pareto.png").stat().st_size > 0
    print(f"pandas {pd.__version__}")


@pytest.mark.slow  # a few seconds: the quick loop leaves it to the whole suite
def test_a_report_that_cannot_be_built_fails_the_sweep_and_keeps_the_rows(tmp_path, monkeypatch, capsys):
    import reports.build

    out = tmp_path / "run"

    def broken(*_a, **_k):
        raise TypeError("Invalid value '[]' for dtype 'float64'")

    monkeypatch.setattr(reports.build, "build_report", broken)
    code = main(["sweep", "--variants", "naive", "--dtypes", "bf16", "--seq-lens", "64", "--masks", "causal",
                 "--directions", "fwd", "--heads", "2", "--head-dims", "16", "--budget-ms", "10", "--device", "cpu",
                 "--remeasure", "0", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1
    assert "report could not be built" in err and f"python -m bench report {out}" in err
    assert len(read_jsonl(out / "results.jsonl")) == 1  # the measured row is kept
    monkeypatch.undo()
    assert main(["report", str(out)]) == 0  # and `report RUN` builds it from the kept rows
    assert (out / "report" / "index.html").is_file()


@pytest.mark.slow  # a sweep in a subprocess
def test_serving_mixes_are_bar_groups_with_phase_shares_and_the_summary_has_a_column_per_mix(tmp_path):
    from reports.build import group_chart_jobs
    from reports.charts import chart, variant_style
    from reports.frames import load_runs
    from reports.sections.mixes import mix_chart, phase_shares
    from reports.tables import summary_table, with_metrics

    out = tmp_path / "run"
    res = run_cli("sweep", "--variants", "naive,chunked.online", "--batch-mix", "1x(16/16)+3x(1/64),2x(32/32)",
                  "--masks", "causal", "--heads", "2", "--head-dims", "16", "--directions", "fwd",
                  "--budget-ms", "10", "--out", out)
    assert res.returncode == 0, res.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert {r["status"] for r in rows} == {"ok"}
    summary = summary_table(rows)
    assert "by batch mix" in summary and "1x(16/16)+3x(1/64)" in summary and "n=" not in summary
    body = summary.splitlines()[3:5]  # one line per variant: its name and a figure under each mix, none blank
    assert sorted(line.split()[0] for line in body) == ["chunked.online", "naive"]
    assert all(len(line.split()) == 3 for line in body)
    df, _ = load_runs([out])
    jobs = group_chart_jobs(with_metrics(df, None), tmp_path / "charts", variant_style(df["variant"], None), None, {})
    assert [(name, fn) for name, fn, _, _ in jobs] == [("time", mix_chart), ("memory", mix_chart)]
    assert all(fn is not chart for _, fn, _, _ in jobs)
    decode_mix = next(r for r in rows if r["mix"] == "1x(16/16)+3x(1/64)")
    shares = phase_shares(decode_mix["phases"])
    assert shares[("q_tokens", "prefill")] == pytest.approx(16 / 19)
    assert shares[("q_tokens", "decode")] == pytest.approx(3 / 19)
    assert sum(v for (k, _), v in shares.items() if k == "flops") == pytest.approx(1.0)
    assert (out / "report" / "charts" / "time.png").stat().st_size > 0
