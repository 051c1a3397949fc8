"""A run in pytest-benchmark's format, and the pytest-benchmark suite itself."""

import json
import statistics
import subprocess
import sys

import pytest

from bench.case import Case
from bench.cli import main
from bench.runs import store
from tests.conftest import ROOT, run_cli


@pytest.mark.slow
def test_export_is_read_by_pytest_benchmark(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,sdpa.math", "--seq-lens", "64", "--heads", "2",
                   "--head-dims", "16", "--masks", "none,causal", "--budget-ms", "5", "--out", out,
                   "--no-report", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert main(["export", str(out), "--format", "pytest-benchmark"]) == 0
    path = out / "pytest-benchmark.json"
    from pytest_benchmark.storage.file import FileStorage

    class _Log:
        def info(self, *a, **k):
            pass

        warning = error = debug = info

    storage = FileStorage(str(tmp_path / "storage"), logger=_Log(), default_machine_id="m")
    loaded = list(storage.load_benchmarks(str(path)))
    assert len(loaded) == 4
    assert {b["name"].split("[")[0] for b in loaded} == {"naive", "sdpa.math"}
    rows = {f"{r['variant']}[{Case.from_dict(r).label().replace(' ', '-')}]": r for r in store.read_rows(out)}
    # % of peak: not in the rows (the end-of-sweep peak is not known when a row is written); the
    # export and the report take it from env.json's final peak, and agree
    from reports.frames import load_runs, with_peaks

    assert not any("pct_peak" in r for r in rows.values())
    df, envs = load_runs([out])
    report_pct = {(r["variant"], r["mask"]): r["pct_peak"] for r in with_peaks(df, envs).to_dict("records")}
    peak = json.loads((out / "env.json").read_text())["peaks_tflops"]["float32"]
    exported = json.loads(path.read_text())["benchmarks"]
    assert len(exported) == 4
    for b in exported:
        assert b["extra_info"]["pct_peak"] == pytest.approx(report_pct[b["name"].split("[")[0], b["params"]["mask"]])
        assert b["extra_info"]["pct_peak"] == pytest.approx(100 * rows[b["name"]]["tflops"] / peak)
    for b in loaded:  # the loader flattens stats: each benchmark carries its cell's own samples, in seconds
        samples = rows[b["name"]]["samples_ms"]
        assert b["rounds"] == len(samples) >= 1
        assert b["median"] == pytest.approx(statistics.median(samples) / 1e3)
        assert b["min"] == pytest.approx(min(samples) / 1e3)
    cli = subprocess.run([sys.executable, "-c", "from pytest_benchmark.cli import main; main()",
                          "compare", str(path), "--columns", "min,median,rounds"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "naive" in cli.stdout and "sdpa.math" in cli.stdout


@pytest.mark.slow
def test_benchmark_suite_runs_under_pytest_benchmark(tmp_path):
    out = tmp_path / "bench.json"
    # flex left out: its compile (seconds, cold) is not what this checks; the suite times it like the rest
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/benchmarks", "--benchmark-only", "-q",
                           "--benchmark-max-time=0.02", "-k", "not flex",
                           f"--benchmark-json={out}", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {b["name"] for b in json.loads(out.read_text())["benchmarks"]}
    assert any(n.startswith("test_variant[naive-") for n in names)
    assert any(n.startswith("test_variant[sdpa.math-") for n in names)
    assert any(n.startswith("test_variant[linear.elu-") for n in names)  # approximate: held to its own verdict
