"""Reports from a real small CPU sweep, synthetic scaling data, compare verdicts, and runs
holding failed cells."""

import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from bench.cli import main
from bench.store import ResultWriter, write_env
from reports.build import build_report
from reports.compare import compare_frames, compare_runs
from reports.frames import tidy
from reports.scaling import crossovers, fit_exponent, scaling_table
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "small"
    proc = run_cli("sweep", "--out", out, "--variants", "naive,sdpa.flash,window.chunked,xformers",
                   "--seq-lens", "64,128,256", "--heads", "2", "--head-dims", "16",
                   "--masks", "none,window", "--window", "16", "--budget-ms", "10", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_sweep_writes_report_naming_every_variant(small_run):
    out, proc = small_run
    page = out / "report" / "index.html"
    assert f"report: {page}" in proc.stdout
    html = page.read_text()
    for name in ("naive", "sdpa.flash", "window.chunked"):
        assert name in html
    assert "xformers" in html and "unsupported" in html  # did not run: shown with its reason
    for chart in ("time", "memory", "speedup", "tflops"):
        for ext in ("png", "svg"):
            path = out / "report" / "charts" / f"{chart}.{ext}"
            assert path.stat().st_size > 5000
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 4  # self-contained
    assert "4 * batch * heads" in html  # the FLOP convention
    md = (out / "report" / "report.md").read_text()
    assert "| naive" in md and "charts/time.png" in md
    csv = pd.read_csv(out / "report" / "tables.csv")
    assert {"time_ms", "speedup", "tflops", "pct_peak", "mem_mib"} <= set(csv["metric"])


def test_report_command_rebuilds_from_the_folder(small_run, tmp_path):
    out, _ = small_run
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "index.html").exists()
    scaling = pd.read_csv(tmp_path / "rep" / "scaling.csv")
    naive = scaling[(scaling["variant"] == "naive") & scaling["facet"].str.contains("mask=none")]
    assert naive["mem_exp"].iloc[0] > 1.5  # scores grow as n^2
    chunked = scaling[scaling["variant"] == "window.chunked"]
    assert chunked["mem_exp"].iloc[0] < 1.3


@pytest.mark.parametrize("k", [2.0, 1.0])
def test_scaling_fit_recovers_known_exponents(k):
    rng = np.random.default_rng(0)
    n = np.array([256, 512, 1024, 2048, 4096, 8192])
    y = 3e-6 * n**k * np.exp(rng.normal(0, 0.02, len(n)))
    fit = fit_exponent(n, y)
    assert abs(fit["exponent"] - k) < 0.05
    assert 0.99 < fit["r2"] <= 1.0
    assert (fit["n_min"], fit["n_max"], fit["points"]) == (256, 8192, 6)
    assert math.isnan(fit_exponent([512, 512], [1.0, 2.0])["exponent"])


def _synthetic(rows):
    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
                window=None, direction="fwd", reason="", status="ok")
    return tidy(pd.DataFrame([base | r | {"kv_len": r["q_len"]} for r in rows]))


def test_scaling_table_and_crossover_on_synthetic_runs():
    rows = []
    for n in (512, 1024, 2048, 4096):
        rows.append(dict(variant="quad", q_len=n, median_ms=1e-6 * n**2, peak_mem_bytes=4.0 * n**2))
        rows.append(dict(variant="lin", q_len=n, median_ms=2e-3 * n, peak_mem_bytes=1e4 * n))
    rows.append(dict(variant="quad", q_len=8192, status="oom", reason="OutOfMemoryError: x"))
    df = _synthetic(rows)
    s = scaling_table(df).set_index("variant")
    assert abs(s.loc["quad", "time_exp"] - 2) < 1e-6 and abs(s.loc["lin", "mem_exp"] - 1) < 1e-6
    assert s.loc["quad", "largest_ok_n"] == 4096 and s.loc["quad", "first_failure"] == "oom at n=8192"
    c = crossovers(df)
    assert len(c) == 1 and c["faster_above"].iloc[0] == "lin"
    assert c["n_cross"].iloc[0] == 2000  # 1e-6 n^2 = 2e-3 n


def _run_folder(path, rows, env=None):
    path.mkdir(parents=True)
    w = ResultWriter(path)
    for r in rows:
        w.write(r)
    w.close()
    write_env(path, {"device": "cpu", "torch": "2.13.0", "peaks_tflops": {"float32": 0.2}} | (env or {}))
    return path


def _timed_rows(variant, scale, spread, ns=(256, 512, 1024)):
    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
                window=None, direction="fwd", reason="", status="ok")
    out = []
    for n in ns:
        med = scale * 1e-5 * n**2
        out.append(base | dict(variant=variant, q_len=n, kv_len=n, median_ms=med, q1_ms=med * (1 - spread),
                               q3_ms=med * (1 + spread), iqr_ms=2 * spread * med))
    return out


def test_compare_flags_2x_slowdown_not_2pct(tmp_path):
    a = _run_folder(tmp_path / "a", _timed_rows("naive", 1.0, 0.03) + _timed_rows("sdpa", 1.0, 0.03))
    b = _run_folder(tmp_path / "b", _timed_rows("naive", 2.0, 0.03) + _timed_rows("sdpa", 1.02, 0.03),
                    env={"torch": "2.14.0"})
    m, regressions, warnings, chart = compare_runs(a, b, tmp_path / "cmp", fail_pct=10)
    verdicts = m.groupby("variant")["verdict"].agg(set).to_dict()
    assert verdicts == {"naive": {"slower"}, "sdpa": {"within noise"}}
    assert set(regressions["variant"]) == {"naive"}
    assert any("torch" in w for w in warnings)
    assert chart.exists()
    assert main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    assert main(["compare", str(a), str(b)]) == 0
    faster = compare_frames(tidy(pd.DataFrame(_timed_rows("x", 2.0, 0.01))),
                            tidy(pd.DataFrame(_timed_rows("x", 1.0, 0.01))))
    assert set(faster["verdict"]) == {"faster"}


def test_report_with_failed_cells_shows_their_statuses(tmp_path):
    rows = _timed_rows("naive", 1.0, 0.02) + _timed_rows("sdpa.flash", 0.5, 0.02)
    for r in rows:
        r["peak_mem_bytes"] = 4.0 * r["q_len"] ** 2
        r["tflops"] = 0.05
    base = {k: v for k, v in rows[0].items() if k not in ("median_ms", "q1_ms", "q3_ms", "iqr_ms")}
    rows += [base | dict(variant="naive", q_len=2048, kv_len=2048, status="oom",
                         reason="OutOfMemoryError: CUDA out of memory"),
             base | dict(variant="sdpa.flash", q_len=2048, kv_len=2048, status="error",
                         reason="RuntimeError: boom"),
             base | dict(variant="xformers", q_len=256, kv_len=256, status="unsupported",
                         reason="No operator found (device=cpu (supported: {'cuda'}))")]
    run = _run_folder(tmp_path / "failed", rows)
    page = build_report([run])
    html = page.read_text()
    assert '<td class="bad">OOM</td>' in html and '<td class="bad">ERROR</td>' in html
    assert "OutOfMemoryError" in html and "RuntimeError: boom" in html
    assert "xformers" in html and "No operator found" in html
    assert json.loads((run / "env.json").read_text())["device"] == "cpu"
