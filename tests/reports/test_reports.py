"""Reports from a real small CPU sweep, synthetic scaling data, compare verdicts, and runs
holding failed cells."""

import math
import re

import numpy as np
import pandas as pd
import pytest

from bench.cli import main
from bench.runs.store import ResultWriter
from reports.build import build_report
from reports.compare import Drift, compare_frames, compare_runs
from reports.frames import paired_ratio, speedups, tidy
from reports.scaling import crossovers, fit_exponent, scaling_table
from tests.conftest import made_once, run_cli
from tests.support.browser import open_in_browser
from tests.support.runs import run_folder as _run_folder
from tests.support.runs import timed_rows as _timed_rows
from tests.support.text import count, numbers, value


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    folder, proc = made_once(tmp_path_factory, "small", lambda f: run_cli(
        "sweep", "--out", f / "small", "--variants", "naive,sdpa.flash,window.chunked,xformers,linear.elu",
        "--seq-lens", "64,128,256", "--heads", "2", "--head-dims", "16", "--masks", "none,window", "--window", "16",
        "--budget-ms", "10", "--quiet"))
    assert proc.returncode == 0, proc.stderr
    return folder / "small", proc


@pytest.mark.slow
def test_sweep_writes_report_naming_every_variant(small_run):
    out, proc = small_run
    page = out / "report" / "index.html"
    assert f"report: {page}" in proc.stdout
    html = page.read_text()
    for name in ("naive", "sdpa.flash", "window.chunked"):
        assert name in html
    assert "xformers" in html and "unsupported" in html  # did not run: shown with its reason
    for chart in ("time", "memory", "speedup", "tflops"):
        assert (out / "report" / "charts" / f"{chart}.png").stat().st_size > 5000
        assert not (out / "report" / "charts" / f"{chart}.svg").exists()  # SVG on request only (report --svg)
    # self-contained: the four charts, the roofline, the approximation's error and Pareto charts,
    # the mask pictures, time against density, and the predicted memory frontier
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 10
    assert (out / "report" / "charts" / "frontier.png").exists() and (out / "report" / "frontier.csv").exists()
    assert "<h3 id=memory>Memory model and frontier</h3>" in html
    for chart in ("roofline", "error", "pareto"):
        assert (out / "report" / "charts" / f"{chart}.png").exists()
    assert "<h2 id=masks>Masks</h2>" in html and (out / "report" / "charts" / "density.png").exists()
    assert "2 * batch * heads * pairs * (head_dim + head_dim_v)" in html  # the FLOP convention
    md = (out / "report" / "report.md").read_text()
    assert "| naive" in md and "charts/time.png" in md
    csv = pd.read_csv(out / "report" / "tables.csv")
    assert {"time_ms", "speedup", "tflops", "pct_peak", "mem_mib"} <= set(csv["metric"])


@pytest.mark.slow
def test_report_command_rebuilds_from_the_folder(small_run, tmp_path, monkeypatch):
    from reports.charts import SVG_ENV

    out, _ = small_run
    monkeypatch.delenv(SVG_ENV, raising=False)
    assert main(["report", str(out), "--out", str(tmp_path / "rep"), "--svg"]) == 0
    assert (tmp_path / "rep" / "index.html").exists()
    assert (tmp_path / "rep" / "charts" / "time.svg").stat().st_size > 5000  # asked for: drawn
    assert "href='charts/time.svg'" in (tmp_path / "rep" / "index.html").read_text()
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


def test_compare_flags_2x_slowdown_not_2pct(tmp_path, calibrated, capsys):
    a = _run_folder(tmp_path / "a", _timed_rows("naive", 1.0, 0.03) + _timed_rows("sdpa", 1.0, 0.03))
    b = _run_folder(tmp_path / "b", _timed_rows("naive", 2.0, 0.03) + _timed_rows("sdpa", 1.02, 0.03),
                    env={"torch": "2.14.0"})
    # uncalibrated: judged against the largest drift measured on this kind of machine, which a 2x passes
    # and a 2% cannot clear: the gate fails on naive and would say "unjudged" for sdpa alone
    m, regressions, *_ = compare_runs(a, b, tmp_path / "cmp0", fail_pct=10)
    assert m.attrs["drift"]["default"] and set(regressions["variant"]) == {"naive"}
    assert m.groupby("variant")["gate"].agg(set).to_dict() == {"naive": {"regression"}, "sdpa": {"unjudged"}}
    assert main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    err = capsys.readouterr().err
    assert "python -m bench ab . ." in err and "largest drift measured" in err
    only_sdpa = _run_folder(tmp_path / "b2", _timed_rows("sdpa", 1.02, 0.03))
    assert main(["compare", str(a), str(only_sdpa), "--fail-on-regression", "10"]) == 4
    assert "could not be judged against 10%" in capsys.readouterr().err
    calibrated({"device": "cpu"}, sigma=0.01)  # an A/A here measured 1% drift per run
    m, regressions, warnings, chart, trust = compare_runs(a, b, tmp_path / "cmp", fail_pct=10)
    assert len(trust) == 2 and all(t.startswith("trustworthy") for t in trust)
    verdicts = m.groupby("variant")["verdict"].agg(set).to_dict()
    assert verdicts == {"naive": {"slower"}, "sdpa": {"unsure"}}  # no samples here: the quartiles decide
    assert set(regressions["variant"]) == {"naive"}
    assert any("torch" in w for w in warnings)
    assert chart.exists()
    assert main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    assert main(["compare", str(a), str(b)]) == 0
    faster = compare_frames(tidy(pd.DataFrame(_timed_rows("x", 2.0, 0.01))),
                            tidy(pd.DataFrame(_timed_rows("x", 1.0, 0.01))), drift=Drift(0.01, 0.01))
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
    failures = html[html.index("Failed cells and reasons"):]
    assert failures.count("OutOfMemoryError") == 1 and failures.count("RuntimeError: boom") == 1


def test_the_drawing_processes_draw_what_the_reports_own_process_draws(tmp_path, monkeypatch, capsys):
    """Charts drawn beside the report's process (the default on a machine of several cores) are
    the same files, byte for byte, as the ones it draws alone ($ATTNBENCH_DRAW_PROCESSES=0, which
    the suite's test processes use: one per core already); a value that is no count is refused."""
    import reports.charts as charts

    rows = _timed_rows("naive", 1.0, 0.02) + _timed_rows("sdpa.flash", 0.5, 0.02)
    for r in rows:
        r["peak_mem_bytes"] = 4.0 * r["q_len"] ** 2
    run = _run_folder(tmp_path / "run", rows)
    drawn = {}
    for processes in ("1", "0"):
        monkeypatch.setenv(charts.DRAW_PROCESSES_ENV, processes)
        assert charts.drawing_processes() == int(processes)
        charts_dir = build_report([run], tmp_path / f"drawn-by-{processes}").parent / "charts"
        drawn[processes] = {p.relative_to(charts_dir): p.read_bytes() for p in charts_dir.rglob("*.png")}
    assert len(drawn["0"]) >= 3 and drawn["1"] == drawn["0"]
    monkeypatch.setenv(charts.DRAW_PROCESSES_ENV, "two")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "ATTNBENCH_DRAW_PROCESSES='two'" in err and "0 or more" in err and "Traceback" not in err


def test_every_ok_cell_is_fitted_a_contended_one_at_a_low_weight():
    """A wild figure taken while the CPU was shared stays in the fit, weighted down: the exponent
    barely moves; trusted at full weight, the same point drags it."""
    rows = [dict(variant="quad", q_len=n, median_ms=1e-6 * n**2, peak_mem_bytes=4.0 * n**2, ci_halfwidth=0.02)
            for n in (256, 512, 1024, 2048)]
    rows.append(dict(variant="quad", q_len=4096, median_ms=1e-6 * 2048**2 * 2, peak_mem_bytes=4.0 * 4096**2,
                     ci_halfwidth=0.02, contended=True))  # half what it should be
    s = scaling_table(_synthetic(rows)).set_index("variant")
    assert abs(s.loc["quad", "time_exp"] - 2) < 0.1 and s.loc["quad", "weighted_down"] == "1 (contended)"
    assert s.loc["quad", "points"] == 5 and s.loc["quad", "largest_ok_n"] == 4096
    rows[-1]["contended"] = False  # the same point, trusted, drags the fit down
    s = scaling_table(_synthetic(rows)).set_index("variant")
    assert s.loc["quad", "time_exp"] < 1.9 and s.loc["quad", "weighted_down"] == ""


def test_a_wide_cell_with_few_samples_is_fitted_at_its_spreads_weight():
    rows = [dict(variant="quad", q_len=n, median_ms=1e-4 * n**2, samples=20, ci_halfwidth=0.01)
            for n in (128, 256, 512)]
    big = 1e-4 * 1024**2
    rows.append(dict(variant="quad", q_len=1024, median_ms=big, samples=3, few_samples=True,
                     samples_ms=[big * 0.7, big, big * 1.3]))
    s = scaling_table(_synthetic(rows)).set_index("variant")
    assert s.loc["quad", "points"] == 4 and s.loc["quad", "weighted_down"] == "1 (too few samples)"
    assert s.loc["quad", "time_exp"] == pytest.approx(2.0)


def test_each_exponent_has_its_interval_and_says_when_it_is_uncertain_or_departs_from_the_flops():
    from reports.scaling import fit_exponent

    ns = [256, 512, 1024, 2048]
    exact = fit_exponent(ns, [1e-6 * n**2 for n in ns], [0.05] * 4)
    # known sigmas of 5% over 8x of n: se = 0.05 / sqrt(sum((log n - mean)^2))
    se = 0.05 / math.sqrt(sum((math.log(n) - sum(map(math.log, ns)) / 4) ** 2 for n in ns))
    assert exact["exponent"] == pytest.approx(2.0)
    assert exact["exponent_hi"] - exact["exponent"] == pytest.approx(1.96 * se, rel=1e-3)
    rng = np.random.default_rng(1)
    scatter = fit_exponent(ns, [1e-6 * n**2 * math.exp(rng.normal(0, 0.3)) for n in ns], [0.05] * 4)
    assert scatter["exponent_hi"] - scatter["exponent_lo"] > 2 * (exact["exponent_hi"] - exact["exponent"])
    # naive on a 2-core CPU: time grows as n^2.44 over 256-2048 while its FLOPs grow as n^2
    rows = [dict(variant="naive", q_len=n, median_ms=1e-6 * n**2.44, flops=4.0 * n * n * 64, ci_halfwidth=0.02)
            for n in (256, 512, 1024, 2048)]
    s = scaling_table(_synthetic(rows)).set_index("variant").loc["naive"]
    assert s["time_exp"] == pytest.approx(2.44) and s["flops_exp"] == pytest.approx(2.0)
    assert s["time_exp_lo"] < 2.44 < s["time_exp_hi"] and "departs from the FLOPs' 2.00" in s["time_note"]
    few = [dict(variant="naive", q_len=n, median_ms=1e-6 * n**2 * (1.3 if n == 512 else 1), flops=4.0 * n * n,
                ci_halfwidth=0.02) for n in (256, 512, 1024)]
    assert "uncertain" in scaling_table(_synthetic(few)).set_index("variant").loc["naive", "time_note"]


def _paired(variant, n, rounds, **kw):
    med = sorted(rounds)[len(rounds) // 2]
    return dict(variant=variant, q_len=n, median_ms=med, q1_ms=min(rounds), q3_ms=max(rounds),
                round_medians_ms=list(rounds), **{"interleave_id": f"rounds-{n}", **kw})


def test_crossover_uses_paired_rounds_and_leaves_out_a_flagged_point():
    rows = []
    for n in (256, 512, 1024, 2048):
        rows.append(_paired("a", n, [1.0, 1.2, 0.9]))
        rows.append(_paired("b", n, [2.0, 2.4, 1.8]))  # b slower than a in every round
    rows[5] = _paired("b", 1024, [0.5, 0.6, 0.45], contended=True)  # one shaky point says the opposite
    assert crossovers(_synthetic(rows)).empty
    rows[5]["contended"] = False
    assert len(crossovers(_synthetic(rows))) == 2  # trusted, it would flip twice


def test_paired_rounds_tell_apart_what_overlapping_quartiles_cannot():
    """Drift moves both variants together: their quartiles overlap, yet b is slower in every round."""
    a = _paired("a", 256, [1.0, 2.0, 3.0])
    b = _paired("b", 256, [1.1, 2.2, 3.3])
    ratio, lo, hi, paired = paired_ratio(a, b)
    assert paired and ratio == pytest.approx(1.1) and lo == pytest.approx(1.1) and hi == pytest.approx(1.1)
    df = speedups(_synthetic([a | {"variant": "naive"}, b]), "naive")
    sp = df.set_index("variant").loc["b"]
    assert sp["speedup"] == pytest.approx(1 / 1.1) and sp["speedup_lo"] == pytest.approx(1 / 1.1)
    unpaired = paired_ratio({"median_ms": 2.0, "q1_ms": 1.0, "q3_ms": 3.0},
                            {"median_ms": 2.2, "q1_ms": 1.1, "q3_ms": 3.3})
    assert not unpaired[3] and unpaired[1] < 1 < unpaired[2]  # the quartiles overlap: no verdict


def test_rounds_pair_only_between_rows_timed_together():
    """After --retry (or the end-of-sweep re-measurement) one variant of a case is timed again
    alone: its rounds and the baseline's older ones come from different sessions, and round i of
    one says nothing about round i of the other."""
    a = _paired("naive", 256, [1.0, 2.0, 3.0])
    again = _paired("b", 256, [1.1, 2.2, 3.3], interleave_id="a-retry")
    ratio, lo, hi, paired = paired_ratio(a, again)
    assert not paired and lo < 1 < hi  # from the medians and quartiles: the spread overlaps 1
    df = speedups(_synthetic([a, again]), "naive").set_index("variant").loc["b"]
    assert df["speedup_lo"] < 1 < df["speedup_hi"]
    legacy = {k: v for k, v in a.items() if k != "interleave_id"}  # rows written before the id existed
    assert not paired_ratio(legacy, {k: v for k, v in again.items() if k != "interleave_id"})[3]


def test_pct_peak_above_100_is_marked_and_the_trust_line_counts_shaky_cells(tmp_path):
    rows = _timed_rows("naive", 1.0, 0.02) + _timed_rows("sdpa.flash", 0.5, 0.02)
    for r in rows:
        r |= {"peak_mem_bytes": 4.0 * r["q_len"] ** 2, "tflops": 0.1, "noisy": False, "contended": False}
    rows[-1] |= {"tflops": 0.5, "contended": True}  # above the 0.2 TFLOP/s peak of _run_folder
    rows[0]["noisy"] = True
    run = _run_folder(tmp_path / "peak", rows)
    html = build_report([run]).read_text()
    counts = html[html.index("ok cells") - 3:]
    counts = counts[:counts.index("contended") + len("contended")]
    assert [count(counts, k) for k in ("ok cells", "clean", "with too few", "noisy", "contended")] == [6, 5, 0, 1, 1]
    assert "matmul peak is unreliable for float32" in html  # noisy counts as clean; contended does not
    pct = pd.read_csv(run / "report" / "tables.csv")
    pct = pct[pct["metric"] == "pct_peak"].set_index("variant")
    assert pct.loc["sdpa.flash", "n=1024"] == "250.0*†"  # shaky and above the peak
    assert pct.loc["naive", "n=256"] == "50.0†"  # the peak is unreliable for every float32 cell; noisy: no star


def test_an_approximations_exact_equivalent_rate_does_not_mark_the_peak(tmp_path):
    """An approximate variant does not do exact attention's FLOPs: flops / time can pass the
    machine's peak without saying anything about the peak (a folder from before such rows
    went without TFLOP/s, with env.json's flag set at its end)."""
    rows = _timed_rows("naive", 1.0, 0.02) + _timed_rows("performer", 0.1, 0.02)
    for r in rows:
        approx = r["variant"] == "performer"
        r |= {"tflops": 2.0 if approx else 0.1, "approximate": approx, "noisy": False, "contended": False}
    run = _run_folder(tmp_path / "approx", rows, env={"peak_unreliable": {"float32": "a cell reached 1000%"}})
    html = build_report([run]).read_text()
    assert "matmul peak is unreliable" not in html and "6 ok cells, 6 clean" in html
    pct = pd.read_csv(run / "report" / "tables.csv")
    pct = pct[pct["metric"] == "pct_peak"].set_index("variant")
    assert str(pct.loc["naive", "n=256"]) == "50.0"  # no †
    assert pct.loc["performer", ["n=256", "n=512", "n=1024"]].isna().all()  # and no % of peak for it


def test_reports_of_runs_with_no_good_rows_list_the_failures(tmp_path):
    empty = _run_folder(tmp_path / "empty", [])
    assert build_report([empty]).exists()
    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none", window=None,
                direction="fwd")
    rows = [base | dict(variant="naive", q_len=n, kv_len=n, status="mismatch", reason="output max abs err 0.5 > "
                        "tolerance (atol 0.0001, rtol 0.0001)") for n in (64, 128, 256, 512, 1024)]
    rows += [base | dict(variant="sdpa", q_len=n, kv_len=n, status=s, reason=r) for n, s, r in
             [(64, "timeout", "no result"), (128, "error", "RuntimeError: boom")] + [
                 (n, "mismatch", "output max abs err 0.5 > tolerance (atol 0.0001, rtol 0.0001)")
                 for n in (256, 512, 1024)]]
    html = build_report([_run_folder(tmp_path / "failed", rows)]).read_text()
    failures = html[html.index("Failed cells and reasons"):]
    assert "10 cells in 4 groups" in failures  # one line per variant, status and reason, with its count
    assert failures.count("output max abs err 0.5") == 2 and "<td>5</td>" in failures and "<td>3</td>" in failures
    assert "n=64-1024 (5)" in failures  # where the group's cells are
    listed = pd.read_csv(tmp_path / "failed" / "report" / "failures.csv")
    assert len(listed) == 10  # every failed cell its line in the CSV
    assert "0 ok cells" in html and "class='trust bad'" in html and "Do not use: no cell" in html


def test_compare_says_when_nothing_matches_and_reads_a_rule(tmp_path, capsys, calibrated):
    calibrated({"device": "cpu"}, sigma=0.01)
    a = _run_folder(tmp_path / "a", _timed_rows("naive", 1.0, 0.03))
    b = _run_folder(tmp_path / "b", _timed_rows("sdpa", 1.0, 0.03))
    assert main(["compare", str(a), str(b), "--fail-on-regression", "5"]) == 3
    assert "no matching ok cells" in capsys.readouterr().err
    assert main(["compare", str(a), str(b)]) == 0
    c = _run_folder(tmp_path / "c", _timed_rows("naive", 1.2, 0.03))
    assert main(["compare", str(a), str(c), "--fail-on-regression", "median:5%"]) == 1
    out = capsys.readouterr()
    assert [value(out.out, k) for k in ("Better", "Same", "Worse", "Unsure", "Shaky")] == [0, 0, 3, 0, 0]
    assert count(out.err, "cell(s) slower") == 3 and value(out.err, "slower by more than") == 5
    assert "(median)" in out.err
    (cell,) = [line for line in out.err.splitlines() if line.startswith("  naive float32 none fwd n=256:")]
    a_q1 = 0.97 * 1e-5 * 256**2  # A's first quartile at n=256 (_timed_rows: spread 3%)
    assert value(cell, "B/A") == 1.2 and value(cell, "quartiles: A") == pytest.approx(a_q1, rel=1e-3)  # its evidence
    assert main(["compare", str(a), str(c), "--fail-on-regression", "min:25%"]) == 4  # no fastest sample here
    capsys.readouterr()
    fastest = [r | {"min_ms": r["q1_ms"] * 0.99} for r in _timed_rows("naive", 1.0, 0.03)]
    a2 = _run_folder(tmp_path / "a2", fastest)
    c2 = _run_folder(tmp_path / "c2", [r | {"min_ms": r["q1_ms"] * 0.99} for r in _timed_rows("naive", 1.2, 0.03)])
    assert main(["compare", str(a2), str(c2), "--fail-on-regression", "min:25%"]) == 0
    (gate,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("gate:")]
    assert numbers(gate) == [3, 25] and "(min)" in gate
    assert main(["compare", str(a2), str(c2), "--fail-on-regression", "min:15%"]) == 1


def _declared_colours() -> dict:
    from bench.api import discover

    registry = discover()
    return {n: registry[n].traits.colour for n in registry.names() if registry[n].traits.colour is not None}


def test_variant_colours_depend_on_the_name_alone():
    from reports.charts import variant_style

    declared = _declared_colours()
    one = variant_style(["naive", "sdpa", "flex"], "naive", declared)
    other = variant_style(["sdpa", "my.plugin", "window.chunked", "sdpa.flash"], None, declared)
    assert one["sdpa"]["color"] == other["sdpa"]["color"] and one["sdpa"]["marker"] == other["sdpa"]["marker"]
    assert len({tuple(s["color"]) for n, s in other.items()}) == 4


def test_a_report_reads_the_colours_its_run_folders_recorded():
    """The palette slot a variant declares is written to env.json by the sweep (tests/engine/test_sweep.py)
    and read back by the report, the newest folder's last; a slot outside the palette is ignored."""
    from reports.charts import declared_colours, variant_style

    assert declared_colours([{}]) == {}  # a folder written before the colours: slots from the names
    assert declared_colours([{"colours": {"naive": 3}}, {"colours": {"naive": 11, "gone": 99}}]) == {"naive": 11}
    mine = variant_style(["naive", "mine"], None, {"mine": 4})
    assert mine["mine"]["color"] == variant_style(["mine"], None, {"mine": 4})["mine"]["color"]


def test_a_merged_report_gives_each_run_its_panels_and_each_panel_its_n(tmp_path, monkeypatch):
    import reports.charts as charts

    a = _run_folder(tmp_path / "a", _timed_rows("naive", 1.0, 0.02, ns=(128, 256)))
    b = _run_folder(tmp_path / "b", _timed_rows("naive", 1.0, 0.02, ns=(256, 1024, 4096)))
    seen = {}

    def keep(fig, out):
        if out.name == "time":
            seen["ticks"] = [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes if ax.get_visible()]
            seen["titles"] = [ax.get_title() for ax in fig.axes if ax.get_visible()]
        return []

    monkeypatch.setattr(charts, "save_figure", keep)
    monkeypatch.setattr(charts, "_draw_all", lambda jobs: [charts._draw(j) for j in jobs])
    build_report([a, b], tmp_path / "merged")
    assert seen["titles"] == ["run=a", "run=b"]
    assert seen["ticks"] == [["128", "256"], ["256", "1024", "4096"]]


def test_report_defaults_to_the_latest_run_and_names_it(tmp_path, monkeypatch):
    run = _run_folder(tmp_path / "runs" / "20260101-000000-cpu", _timed_rows("naive", 1.0, 0.02))
    (tmp_path / "runs" / "latest").symlink_to(run.name)
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    html = (run / "report" / "index.html").read_text()
    assert "<title>attnbench report: 20260101-000000-cpu</title>" in html


def test_panels_share_one_y_range_with_labels_on_the_outer_panels_only(tmp_path, monkeypatch):
    import reports.charts as charts

    small = _timed_rows("naive", 1.0, 0.02)
    large = [r | {"mask": "causal", "median_ms": 30 * r["median_ms"], "q1_ms": 29 * r["median_ms"],
                  "q3_ms": 31 * r["median_ms"]} for r in _timed_rows("naive", 1.0, 0.02)]
    run = _run_folder(tmp_path / "run", small + large)
    seen = {}

    def keep(fig, out):
        if out.name == "time":
            axes = [ax for ax in fig.axes if ax.get_visible()]
            seen["ylims"] = [ax.get_ylim() for ax in axes]
            seen["left_labels"] = [any(t.get_visible() and t.get_text() for t in ax.get_yticklabels()) for ax in axes]
            seen["data"] = [(min(y for line in ax.get_lines() for y in line.get_ydata() if y == y),
                             max(y for line in ax.get_lines() for y in line.get_ydata() if y == y)) for ax in axes]
        return []

    monkeypatch.setattr(charts, "save_figure", keep)
    monkeypatch.setattr(charts, "_draw_all", lambda jobs: [charts._draw(j) for j in jobs])
    build_report([run], tmp_path / "rep")
    (lo0, hi0), (lo1, hi1) = seen["ylims"]
    assert (lo0, hi0) == (lo1, hi1)  # one scale: the panels compare by eye
    assert all(lo0 <= lo and hi <= hi0 for lo, hi in seen["data"])  # and every panel's data fits it
    assert seen["left_labels"] == [True, False]  # the right panel reads its values off the left one


def test_breakdown_panels_keep_their_own_sequence_lengths(tmp_path, monkeypatch):
    import reports.charts as charts

    rows = [dict(variant=v, n=n, status="ok", share_matmul=60.0, share_softmax=40.0, mask="none", direction="fwd")
            for v, ns in (("naive", (64, 128, 256)), ("sdpa", (64, 256))) for n in ns]
    seen = {}

    def keep(fig, out):
        seen["ticks"] = [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes if ax.get_visible()]
        return []

    monkeypatch.setattr(charts, "save_figure", keep)
    charts.breakdown_chart(pd.DataFrame(rows), tmp_path / "breakdown")
    assert seen["ticks"] == [["64", "128", "256"], ["64", "256"]]


def test_pareto_chart_keeps_each_facets_largest_lengths_first(tmp_path, monkeypatch):
    import reports.accuracy as accuracy

    rows = [dict(variant=v, n=n, status="ok", median_ms=t * n, rel_err=err, approximate=err > 0, mask=m,
                 direction="fwd")
            for m in ("causal", "none") for n in (64, 128, 256, 512, 1024, 2048)
            for v, t, err in (("naive", 1.0, 0.0), ("performer", 0.5, 0.3))]
    seen = {}

    def keep(fig, out):
        seen["titles"] = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.axison]
        return []

    monkeypatch.setattr(accuracy, "save_figure", keep)
    accuracy.pareto_chart(pd.DataFrame(rows), tmp_path / "pareto", style={})
    assert accuracy.PARETO_PANELS == 8
    assert seen["titles"] == [f"n = {n}; mask={m}" for m in ("causal", "none") for n in (256, 512, 1024, 2048)]


@pytest.mark.slow
def test_the_report_renders_in_a_real_browser_within_1400_px(small_run):
    out, _ = small_run
    seen = open_in_browser(out / "report" / "index.html")
    assert seen["images"] == 10 and seen["broken"] == [], seen  # every chart decoded and drawn
    assert seen["errors"] == [], seen["errors"]
    assert {"charts", "masks", "scaling", "tables", "status", "env"} <= set(seen["ids"]), seen["ids"]
    assert seen["scroll_width"] <= seen["width"] == 1400, seen  # no horizontal scroll at 1400 px
    assert seen["trust"].split()[0] == "trust" and seen["trust"].split()[1] in ("clean", "care", "bad")


@pytest.mark.slow
def test_the_browser_probe_sees_a_broken_page(tmp_path):
    """The probe is not blind: a broken image, a console error and a too-wide block are caught."""
    page = tmp_path / "index.html"
    page.write_text("<!doctype html><html><head><title>t</title></head><body><h2 id=charts>c</h2>"
                    "<img alt=gone src='missing.png'><div style='width:2000px'>wide</div>"
                    "<script>console.error('boom')</script></body></html>")
    seen = open_in_browser(page)
    assert seen["broken"] == ["gone"] and "boom" in seen["errors"] and seen["scroll_width"] > 1400


def _decode_rows():
    rows = []
    for q in (1, 4):
        for kv in (1024, 4096, 16384, 32768):
            for variant, scale in (("naive", 2.0), ("sdpa", 1.0)):
                med = scale * 1e-4 * kv
                rows.append(dict(variant=variant, device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8,
                                 head_dim=64, mask="none", window=None, direction="fwd", q_len=q, kv_len=kv,
                                 status="ok", reason="", median_ms=med, q1_ms=med, q3_ms=med, iqr_ms=0.0,
                                 peak_mem_bytes=100.0 * kv, gbps=kv / med / 1e3, bytes=4 * kv))
    return rows


def test_decode_is_drawn_against_the_cache_in_numeric_order():
    df = tidy(pd.DataFrame(_decode_rows()))
    from reports.frames import facet_groups

    assert [label for label, _ in facet_groups(df)] == ["q=1", "q=4"]  # numeric, as the facets of kv would be too
    assert sorted(df["n"].unique()) == [1024, 4096, 16384, 32768]  # n is the cache length
    table = scaling_table(df)
    assert table["time_exp"].round(3).eq(1.0).all()  # time grows as the cache: fitted over 4 lengths
    two = scaling_table(df[df["n"] <= 4096])
    assert two["time_exp"].isna().all()  # two points always lie on a line: no exponent from them
    from reports.frames import x_label

    assert x_label(df) == "KV cache length (keys)"


@pytest.mark.slow
def test_a_decode_report_has_a_bandwidth_chart_and_table(tmp_path):
    run = _run_folder(tmp_path / "decode", _decode_rows(), env={"peak_gbps": 20.0})
    html = build_report([run]).read_text()
    assert (run / "report" / "charts" / "bandwidth.png").exists() and "achieved GB/s" in html


def test_facets_sort_numbers_as_numbers():
    from reports.frames import natural

    assert sorted(["kv=32768", "kv=1024", "kv=4096", "kv=16384"], key=natural) == [
        "kv=1024", "kv=4096", "kv=16384", "kv=32768"]


@pytest.mark.parametrize("few,contended,noisy,state", [(0, 0, 0, "clean"), (3, 0, 0, "care"), (8, 0, 0, "care"),
                                                         (0, 6, 0, "bad"), (0, 0, 8, "clean")])
def test_the_trust_box_says_clean_read_with_care_or_do_not_use(few, contended, noisy, state):
    from reports.trust import trust_state

    rows = _timed_rows("naive", 1.0, 0.02, ns=tuple(range(64, 64 + 10 * 8, 8)))
    for i, r in enumerate(rows):
        r["few_samples"], r["contended"], r["noisy"] = i < few, i < contended, i < noisy
    got, heading, why = trust_state(tidy(pd.DataFrame(rows)), [])
    assert got == state, (heading, why)  # wide intervals alone (noisy) leave it clean: the report uses them
    if state != "clean":
        assert str(max(few, contended)) in why  # the main reason first, with its count


def _recorded(cells: int, slowdown: float, seed: int):
    rows_a, rows_b = _recorded_rows(cells, slowdown, seed)
    return _synthetic(rows_a), _synthetic(rows_b)


# the between-run noise tests/benchmarks/drift.py measured on the 2-core VM: one sd of a run's log median
RUN_FACTOR_SD = 0.15  # common to every cell of a run (the machine's state that minute, the process)
CELL_DRIFT_SD = 0.12  # each cell's own, on top of it
WITHIN_SD = 0.02  # what one run's samples show (their 95% half-width / 1.96)


def _recorded_rows(cells: int, slowdown: float, seed: int):
    """Samples as two separate runs of one sweep record them, cell by cell, with the noise measured
    here: a factor common to a run, a drift of each cell of its own, and within a run a lognormal
    spread with an outlier now and then; B is ``slowdown`` times A's cells."""
    rng = np.random.default_rng(seed)
    run_a, run_b = np.exp(rng.normal(0.0, RUN_FACTOR_SD, 2))
    rows_a, rows_b = [], []
    for i in range(cells):
        base = float(rng.uniform(0.5, 50.0))
        for run, factor, out in ((run_a, 1.0, rows_a), (run_b, slowdown, rows_b)):
            n = int(rng.integers(6, 30))
            cell = float(np.exp(rng.normal(0.0, CELL_DRIFT_SD)))
            samples = base * run * cell * factor * rng.lognormal(0.0, WITHIN_SD, n)
            samples[rng.random(n) < 0.05] *= 1.3
            xs = sorted(samples)
            out.append(dict(variant=f"v{i % 7}", q_len=64 * (1 + i // 7), median_ms=float(np.median(xs)),
                            q1_ms=float(np.quantile(xs, 0.25)), q3_ms=float(np.quantile(xs, 0.75)),
                            min_ms=float(xs[0]), samples_ms=[float(x) for x in samples]))
    return rows_a, rows_b


@pytest.mark.slow  # a few seconds: the quick loop leaves it to the whole suite
def test_compare_of_two_runs_claims_nothing_it_cannot_know():
    """Two separate runs with the between-run noise measured here (a factor common to a run, each
    cell's own drift): uncalibrated, compare calls no cell changed; calibrated with the drift an A/A
    measured, at most 5% over twenty A/A pairs (each cell judged against the run's own shift), a
    3x slowdown of one variant in seven is found (at this noise a 2x one is found in about half its
    cells: a change of 10% is ab's to find), and one of every cell is found as the run's."""
    drift = Drift(cell=CELL_DRIFT_SD, run=RUN_FACTOR_SD)
    called = total = 0
    for seed in range(1, 21):
        a, b = _recorded(70, 1.0, seed)
        if seed <= 2:
            assert not compare_frames(a, b)["verdict"].isin(["faster", "slower"]).any()  # uncalibrated
        m = compare_frames(a, b, drift=drift)
        called += int(m["verdict"].isin(["faster", "slower"]).sum())
        total += len(m)
    assert called <= 0.05 * total, (called, total)
    a, b = _recorded(70, 1.0, 21)
    b.loc[b["variant"] == "v3", "median_ms"] *= 3.0
    b.loc[b["variant"] == "v3", "samples_ms"] = b.loc[b["variant"] == "v3", "samples_ms"].map(
        lambda xs: [3.0 * x for x in xs])
    found = compare_frames(a, b, drift=drift)
    assert (found.loc[found["variant"] == "v3", "verdict"] == "slower").mean() >= 0.9
    assert (found.loc[found["variant"] != "v3", "verdict"] == "slower").mean() <= 0.05
    assert (found["ratio_lo"] <= found["ratio"]).all() and (found["ratio"] <= found["ratio_hi"]).all()
    assert (found["q"] >= found["p"]).all()  # q-values never below p-values
    everything = compare_frames(*_recorded(70, 3.0, 22), drift=drift)
    assert everything.attrs["shift"]["verdict"] == "slower" and (everything["verdict"] == "slower").all()


def test_compare_explains_a_cell_with_its_samples_and_the_commands_to_measure_it_again(tmp_path, capsys,
                                                                                       calibrated):
    calibrated({"device": "cpu"}, sigma=0.01)
    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none", window=None,
                direction="fwd", reason="", status="ok")
    rows, _ = _recorded_rows(3, 1.0, 5)
    rows = [base | r | {"kv_len": r["q_len"], "variant": f"v{i}", "q_len": 64} for i, r in enumerate(rows)]
    a = _run_folder(tmp_path / "a", rows)
    b = _run_folder(tmp_path / "b", [r | {"samples_ms": [x * 1.3 for x in r["samples_ms"]],
                                          "median_ms": r["median_ms"] * 1.3} for r in rows])
    assert main(["compare", str(a), str(b), "--explain", "v1 n=64"]) == 0
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("trust ")]
    assert out[0].startswith("v1 float32 none fwd n=64: slower") and value(out[0], "B/A") == 1.3
    assert out[1].startswith("A samples (ms): ") and out[3].startswith("B samples (ms): ")
    assert "python -m bench sweep --variants v1" in out[2] and "A's conditions" in out[2]
    assert main(["compare", str(a), str(b), "--explain", "n=64"]) == 2  # three cells answer: it says so
    assert "3 matching cells answer to it" in capsys.readouterr().err


def test_each_variant_keeps_one_colour_across_charts_distinct_within_a_chart():
    import itertools
    import math

    from matplotlib.colors import to_rgb

    from reports.charts import variant_style

    declared = _declared_colours()
    names = list(declared) + ["einsum", "my.einsum", "plugin.a", "plugin.b", "chunked.online2"]
    style = variant_style(names, "naive", declared)
    colours = [to_rgb(style[n]["color"]) for n in names]
    assert min(math.dist(a, b) for a, b in itertools.combinations(colours, 2)) > 0.15  # no two alike
    # the baseline's colour is its own in every chart, baseline or not (frontier bars draw with no baseline)
    assert variant_style(["naive", "sdpa"], None, declared)["naive"]["color"] == style["naive"]["color"]
    assert variant_style(["naive", "sdpa.flash"], "naive", declared)["naive"]["color"] != style["sdpa.flash"]["color"]


def test_the_compare_chart_has_a_panel_per_variant_and_whiskers_whatever_the_cell_count(tmp_path):
    """104 cells (4 variants x 2 masks x 13 lengths) made a 3,400 px column of bars without intervals:
    now a panel per variant, its height set by the variants, and every point with its interval."""
    from PIL import Image

    rng = np.random.default_rng(0)

    def rows(scale):
        out = []
        for v in ("naive", "sdpa", "flex", "chunked.online"):
            for mask in ("none", "causal"):
                for n in [64 * 2**k for k in range(13)][:13]:
                    med = 1e-3 * n * scale
                    samples = list(med * (1 + 0.01 * rng.standard_normal(8)))
                    out.append(dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64,
                                    mask=mask, window=None, direction="fwd", reason="", status="ok", variant=v,
                                    q_len=n, kv_len=n, median_ms=float(np.median(samples)), q1_ms=min(samples),
                                    q3_ms=max(samples), samples_ms=samples))
        return out
    a = _run_folder(tmp_path / "a", rows(1.0))
    b = _run_folder(tmp_path / "b", rows(1.2))
    m, _, _, chart, _ = compare_runs(a, b, out=tmp_path / "cmp")
    assert len(m) == 104 and m["ratio_lo"].notna().all()  # every cell has its interval to draw
    width, height = Image.open(chart).size
    assert height < 800 and width < 1600, (width, height)


def test_the_roofline_encodes_n_as_marker_size_with_a_key(tmp_path, monkeypatch):
    import reports.accuracy as accuracy

    drawn = {}
    monkeypatch.setattr(accuracy, "finish", lambda fig, axes, out: drawn.setdefault("axes", axes) and [out])
    rows = [dict(status="ok", variant=v, n=n, q_len=n, run="r", dtype="float32", tflops=0.01 * n / 64,
                 intensity=n / 16, approximate=False) for v in ("naive", "sdpa") for n in (64, 256, 1024)]
    accuracy.roofline_chart(pd.DataFrame(rows), tmp_path / "roofline", {}, [{"run": "r", "peak_gbps": 20.0,
                                                                          "peaks_tflops": {"float32": 0.2}}])
    ax = drawn["axes"][0]
    sizes = [list(c.get_sizes()) for c in ax.collections if len(c.get_offsets()) == 3]
    assert sizes and all(s[0] < s[1] < s[2] for s in sizes)  # n = 64, 256, 1024: small to large
    labels = ax.get_legend_handles_labels()[1]
    assert "n = 64" in labels and "n = 1024" in labels


def test_the_trust_box_counts_the_conclusions_that_rest_on_shaky_cells(tmp_path):
    """A contended runner-up puts the winner it is beaten by at risk, and a contended cell in a fit puts its
    exponent at risk; wide intervals (noisy) on their own put nothing at risk."""
    from bench.runs import judge
    from reports.trust import conclusions

    rows = _timed_rows("naive", 1.0, 0.02, ns=(256, 512, 1024, 2048)) + \
        _timed_rows("sdpa", 0.5, 0.02, ns=(256, 512, 1024, 2048))
    for r in rows:
        r |= {"noisy": True, "contended": False, "peak_mem_bytes": 4.0 * r["q_len"] ** 2, "ci_halfwidth": 0.02,
              "samples_ms": [r["median_ms"]] * 8, "interleave_id": f"n{r['q_len']}"}

    def with_visits(folder):  # two later visits to each cell, agreeing with the first to 1%: the exponents are stated
        w = ResultWriter(folder, "visits.jsonl")
        for r in rows:
            for k, f in ((2, 1.01), (3, 0.99)):
                w.write({"variant": r["variant"], "status": "ok", "median_ms": r["median_ms"] * f, "visit": k,
                         "of": r["interleave_id"], "contended": False,
                         **{c: r[c] for c in ("device", "dtype", "q_len", "kv_len")}})
        w.close()
        return folder
    clean = with_visits(_run_folder(tmp_path / "clean", [dict(r) for r in rows]))
    html = build_report([clean]).read_text()
    assert "Clean: none of the" in html and "conclusions rests on a shaky cell" in html  # noisy everywhere: clean
    rows[0]["contended"] = True  # naive at n=256: the runner-up there, and a point of naive's fit
    risky = with_visits(_run_folder(tmp_path / "risky", rows))
    html = build_report([risky]).read_text()
    said = re.search(r"Read with care: (\d+) of (\d+) conclusions rest on shaky cells \(([^)]*)\)", html)
    assert said, html[:2000]
    assert said.group(3) == "1 winner, 1 exponent" and int(said.group(1)) == 2
    got = conclusions([], pd.DataFrame([{"time_exp": 2.0, "time_exp_lo": 1.5, "time_exp_hi": 2.5,
                                         "weighted_down": "1 (contended)"}]), None)
    assert got.stated["exponents"] == 0 and got.risky == 0  # uncertain (+-0.5): not stated, so not at risk
    assert judge.winner_at_risk(1.01, 0.99, 1.03, True) == (False, False)  # not told apart: not stated


def test_the_reports_frontier_bars_take_each_variants_declared_colour(tmp_path, monkeypatch):
    """The frontier chart draws without a baseline, from frontier.csv's rows: it still takes the
    palette slots env.json recorded, as every other chart does."""
    import reports.charts as charts

    seen = []
    real = charts.frontier_chart

    def spy(*args, **kwargs):
        seen.append(kwargs.get("declared"))
        return real(*args, **kwargs)

    monkeypatch.setattr(charts, "frontier_chart", spy)
    rows = [r | {"peak_mem_bytes": 48 * r["q_len"] ** 2} for r in _timed_rows("naive", 1.0, 0.02,
                                                                                ns=(128, 256, 512, 1024))]
    run = _run_folder(tmp_path / "run", rows, env={"colours": {"naive": 11}, "baseline": "naive",
                                                   "memory_bytes": 2**30})
    build_report([run])
    assert seen == [{"naive": 11}]
