"""--visits: a cell timed in several fresh worker processes, its figure and interval over them
(bench.engine.visits), and compare judging two runs from their visits."""

import math
import random
import statistics

import pandas as pd
import pytest

from bench.runs import visits
from bench.runs import store
from bench.measure.stats import t_quantile, visit_evidence
from tests.conftest import read_jsonl, run_cli
from tests.support.runs import samples_giving
from tests.support.text import numbers


def _row(median, **extra):
    return {"variant": "naive", "status": "ok", "median_ms": median, "interleave_id": "abc", "contended": False,
            "tflops": 2.0, "ci_lo_ms": median * 0.99, "ci_hi_ms": median * 1.01, "ci_halfwidth": 0.01,
            "noisy": False, "timed_s": 0.5, **extra}


def _visit(median, k, **extra):
    return {"variant": "naive", "status": "ok", "median_ms": median, "of": "abc", "visit": k, "contended": False,
            "timed_s": 0.2, **extra}


def test_a_cell_with_three_visits_takes_their_geometric_mean_and_a_reruns_t_interval():
    out = visits.merge([_row(1.0)], {("abc", "naive"): [_visit(1.2, 2), _visit(0.9, 3)]})[0]
    logs = [0.0, math.log(1.2), math.log(0.9)]
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    half = t_quantile(0.975, 2) * sd / math.sqrt(3) * 2  # one cell: nothing to pool with; the run's share as large
    assert out["visits"] == 3 and out["visit_medians_ms"] == [1.0, 1.2, 0.9] and out["first_median_ms"] == 1.0
    assert out["median_ms"] == pytest.approx(math.exp(mean))
    assert out["ci_lo_ms"] == pytest.approx(math.exp(mean - half))
    assert out["ci_hi_ms"] == pytest.approx(math.exp(mean + half))
    assert out["visit_se"] == pytest.approx(sd / math.sqrt(3))
    assert out["tflops"] == pytest.approx(2.0 / math.exp(mean))  # the rates follow the figure
    assert out["timed_s"] == pytest.approx(0.9)
    assert out["noisy"]  # +-20% between processes: a wide interval, said so (and not, on its own, shaky)
    from bench.runs import judge

    assert judge.raw_flags(out) == ["noisy"] and not judge.shaky(out)


def test_a_cell_whose_visits_agree_by_chance_borrows_its_runs_spread():
    rows = [_row(1.0, interleave_id=f"c{i}") for i in range(4)]
    ms = (1.2, 1.25, 1.15, 1.0001)
    later = {(f"c{i}", "naive"): [_visit(m, 2, of=f"c{i}"), _visit(1 / m, 3, of=f"c{i}")] for i, m in enumerate(ms)}
    merged = visits.merge(rows, later)
    lucky = merged[3]
    own = statistics.variance([0.0, math.log(1.0001), -math.log(1.0001)])
    pooled = statistics.median(statistics.variance([0.0, math.log(m), -math.log(m)]) for m in ms)
    var = (2 * own + visits.POOL_DOF * pooled) / (2 + visits.POOL_DOF)
    # what every cell of a visit shares (visit 2 the median cell's log m, visit 3 minus it): a whole run's
    # shared offset, which its visits cannot show, is taken to be as large
    offset = statistics.median(math.log(m) for m in ms)
    shared = statistics.variance([0.0, offset, -offset])
    assert visits.shared_var(merged) == pytest.approx(shared)
    half = t_quantile(0.975, 2 + visits.POOL_DOF) * math.sqrt(2 * (var / 3 + max(shared, var / 3)))
    assert lucky["ci_hi_ms"] == pytest.approx(lucky["median_ms"] * math.exp(half))
    assert lucky["ci_halfwidth"] > 0.1  # its own three figures agreed to 0.01%: the run's say +-10% and more


def test_a_cell_whose_visits_give_its_interval_is_not_shaky_for_few_samples_per_visit():
    from bench.runs import judge

    slow = _row(900.0, few_samples=True, samples=3)  # three samples of a long call at its first visit
    out = visits.merge([slow], {("abc", "naive"): [_visit(950.0, 2, samples=2), _visit(880.0, 3, samples=2)]})[0]
    assert "few_samples" in judge.raw_flags(out) and judge.shaky_flags(out) == []  # its precision is the visits'
    assert judge.shaky_flags(slow) == ["few_samples"]  # one visit: no interval, shaky
    assert judge.shaky_counts([out])["few_samples"] == 0 and judge.shaky_counts([slow])["few_samples"] == 1


def test_a_contended_visit_is_left_out_when_the_first_was_clean_and_a_failed_one_always():
    failed = {"variant": "naive", "status": "error", "reason": "boom", "of": "abc", "visit": 4}
    out = visits.combine(_row(1.0), [_visit(3.0, 2, contended=True), _visit(1.1, 3), failed])
    assert out["visit_medians_ms"] == [1.0, 1.1] and out["visits_left_out"] == 2
    shared = visits.combine(_row(1.0, contended=True), [_visit(3.0, 2, contended=True)])
    assert shared["visit_medians_ms"] == [1.0, 3.0]  # the first was contended too: every visit counts


def test_rows_without_later_visits_are_read_as_they_were():
    rows = [_row(1.0), {"variant": "sdpa", "status": "crash", "reason": "x"}]
    assert visits.merge(rows, {}) == rows
    assert visits.merge(rows, {("zzz", "naive"): [_visit(2.0, 2)]}) == rows


def _simulated_run(rng, cells: int, visits_per_run: int) -> list[dict]:
    """One run of ``cells`` cells on a machine with the noise tests/benchmarks/drift.py measured on the 2-core VM
    (quiet, 2 threads, 6 runs of 18 cells with 3 visits each): the machine's state a log offset of sd 0.10 that
    the whole run shares and its visits cannot show; each visit's worker process an offset of sd 0.06 that every
    cell it times shares; each cell at each visit 0.15 on top; within one process, samples that agree to +-2%."""
    state = rng.gauss(0, 0.10)
    walk = [state + rng.gauss(0, 0.06) for _ in range(visits_per_run)]
    rows, later = [], {}
    for c in range(cells):
        truth = math.log(1.0 + c)
        meds = [math.exp(truth + walk[k] + rng.gauss(0, 0.15)) for k in range(visits_per_run)]
        rows.append(_row(meds[0], interleave_id=f"c{c}") | {"ci_lo_ms": meds[0] * 0.98, "ci_hi_ms": meds[0] * 1.02})
        if visits_per_run > 1:
            later[(f"c{c}", "naive")] = [_visit(m, k + 2, of=f"c{c}") for k, m in enumerate(meds[1:])]
    return visits.merge(rows, later)


def _coverage(runs) -> float:
    hits = pairs = 0
    for a in runs:
        for b in runs:
            if a is b:
                continue
            for ra, rb in zip(a, b):
                pairs += 1
                hits += ra["ci_lo_ms"] <= rb["median_ms"] <= ra["ci_hi_ms"]
    return hits / pairs


def test_three_visits_in_fresh_processes_hold_a_reruns_figure_where_one_process_cannot():
    rng = random.Random(7)
    three = [_simulated_run(rng, 18, 3) for _ in range(30)]  # 30 runs of 18 cells
    one = [_simulated_run(rng, 18, 1) for _ in range(30)]
    assert _coverage(three) >= 0.9  # a rerun's interval over three processes
    assert _coverage(one) < 0.2  # one process's +-2%: what the rows claimed before


def test_compare_judges_two_runs_from_their_visits():
    fast = visit_evidence([1.0, 1.02, 0.98], [1.5, 1.53, 1.47], margin=0.05)
    assert fast.p_slower < 0.01 and fast.lo > 1.4 and fast.ratio == pytest.approx(1.5, rel=1e-3)
    wide = visit_evidence([1.0, 1.3, 0.8], [1.1, 0.9, 1.35], margin=0.05)
    assert wide.p_slower > 0.2 and wide.lo < 1.0 < wide.hi
    none = visit_evidence([1.0], [1.1])
    assert none.p == 1.0 and math.isinf(none.hi)


def test_compare_frames_calls_a_change_the_visits_support_and_none_they_do_not():
    from bench.model.row import IDENTITY
    from reports.compare import compare_frames

    def frame(meds_by_n):
        rows = []
        for n, meds in meds_by_n.items():
            est = math.exp(statistics.mean(math.log(m) for m in meds))
            rows.append({**dict.fromkeys(IDENTITY, "x"), "variant": "naive", "q_len": n, "status": "ok",
                         "median_ms": est, "q1_ms": est, "q3_ms": est, "iqr_ms": 0.0, "min_ms": est, "shaky": False,
                         "timer": "cpu-perf_counter", "samples_ms": [est] * 6, "visit_medians_ms": meds})
        return pd.DataFrame(rows)

    a = frame({256: [1.0, 1.01, 0.99], 512: [4.0, 4.4, 3.7]})
    b = frame({256: [2.0, 2.02, 1.98], 512: [4.2, 3.8, 4.5]})
    m = compare_frames(a, b).set_index("q_len")
    assert m.loc[256, "verdict"] == "slower"  # twice the time, the visits agreeing: no calibration needed
    assert m.loc[512, "verdict"] == "unsure"
    assert m.attrs["visited"] == 2


@pytest.mark.slow
def test_a_sweep_visits_each_ok_cell_in_fresh_workers_and_reads_its_rows_over_the_visits(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,sdpa", "--seq-lens", "32,64", "--heads", "2", "--head-dims", "16",
                   "--masks", "none", "--directions", "fwd", "--budget-ms", "20", "--visits", "3", "--out", out,
                   "--no-report")
    assert proc.returncode == 0, proc.stderr
    first = {(r["variant"], r["q_len"]): r for r in read_jsonl(out / "results.jsonl")}
    later = read_jsonl(out / visits.VISITS)
    assert len(later) == 2 * len(first) == 8
    assert {v["visit"] for v in later} == {2, 3}
    by_visit = {k: {v["pid"] for v in later if v["visit"] == k} for k in (2, 3)}
    assert all(len(p) == 1 for p in by_visit.values()) and by_visit[2] != by_visit[3]  # one fresh process each
    assert all(v["of"] == first[(v["variant"], v["q_len"])]["interleave_id"] for v in later)
    for r in store.read_current(out):
        raw = first[(r["variant"], r["q_len"])]
        mine = [v for v in later if (v["variant"], v["q_len"]) == (r["variant"], r["q_len"])]
        kept = [v for v in mine if v["status"] == "ok" and (raw["contended"] or not v["contended"])]
        assert r["visits"] == 1 + len(kept) and r["visits_left_out"] == 2 - len(kept)  # a contended visit: left out
        assert r["first_median_ms"] == raw["median_ms"] and r["visit_medians_ms"][0] == raw["median_ms"]
        assert r["median_ms"] == pytest.approx(math.exp(statistics.mean(math.log(m) for m in r["visit_medians_ms"])))
        assert r["ci_lo_ms"] <= r["median_ms"] <= r["ci_hi_ms"]
    assert raw["median_ms"] == read_jsonl(out / "results.jsonl")[-1]["median_ms"]  # results.jsonl is not rewritten


def test_the_plan_prices_each_later_visit_as_a_fresh_worker_and_one_round_of_every_case(registry):
    from bench.api import build_spec, parse_values
    from bench.features.cost_model import plan

    given = {"variants": ["naive", "sdpa"], "seq_lens": [64, 128], "heads": [2], "head_dims": [8], "masks": ["none"],
             "directions": ["fwd"], "budget_ms": 30, "device": "cpu", "dtypes": ["float32"], "rounds": 3}
    one, three = (build_spec(parse_values(given | {"visits": v}), registry) for v in (1, 3))
    cells = [(n, c) for c in one.cases() for n in one.variants]
    p1, p3 = (plan.project(cells, registry, s, history=plan.History.empty(), report=False) for s in (one, three))
    gs = plan.groups(cells, registry, one.budget_ms, rounds=3)
    visit = plan.VISIT_START_S["cpu"] + sum(g.setup_s + plan.GROUP_OVERHEAD_S + len(g.variants) * plan.VISIT_WARM_S
                                              + (g.cost_s - g.setup_s) / 3 for g in gs)
    assert p1.visits_s == 0 and p3.visits_s == pytest.approx(2 * visit)
    assert p3.wall_s == pytest.approx(p1.wall_s + 2 * visit)
    assert "later visits" in p3.lines()[-1] and "(--visits)" in p3.lines()[-1]


def test_a_merge_of_shards_keeps_each_cells_visits_apart_and_reads_them_back_folded_in(tmp_path):
    from bench.runs.store import ResultWriter, write_env
    from bench.features.shards.merge import merge_runs

    shards = []
    for i, n in enumerate((64, 128), start=1):
        folder = tmp_path / f"shard-{i}"
        folder.mkdir()
        row = _row(1.0 * i, interleave_id=f"s{i}") | {"q_len": n, "kv_len": n, "device": "cpu", "dtype": "float32",
                                                       "samples_ms": [1.0 * i] * 9}
        w = ResultWriter(folder)
        w.write(row)
        w.close()
        w = ResultWriter(folder, visits.VISITS)
        for k, f in ((2, 1.1), (3, 0.9)):
            w.write(_visit(1.0 * i * f, k, of=f"s{i}") | {"q_len": n, "kv_len": n, "device": "cpu", "dtype": "float32"})
        w.close()
        write_env(folder, {"device": "cpu", "spec": {"variants": ["naive"], "device": "cpu"}, "shard": f"{i}/2"})
        shards.append(folder)
    out = merge_runs(shards, tmp_path / "merged")
    written = read_jsonl(out / "results.jsonl")
    assert [r["median_ms"] for r in written] == [1.0, 2.0]  # as measured at the first visit, not the estimate
    assert len(read_jsonl(out / visits.VISITS)) == 4
    merged = {r["q_len"]: r for r in store.read_current(out)}
    assert merged[128]["visits"] == 3 and merged[128]["visit_medians_ms"] == pytest.approx([2.0, 2.2, 1.8])


def _visited_run(folder, scale: float):
    from bench.runs.store import ResultWriter, write_env

    folder.mkdir()
    base = {"device": "cpu", "dtype": "float32", "batch": 1, "heads": 2, "kv_heads": 2, "head_dim": 16,
            "mask": "none", "window": None, "direction": "fwd", "reason": ""}
    rows, later = ResultWriter(folder), ResultWriter(folder, visits.VISITS)
    for n in (64, 128, 256):
        med = scale * n * 1e-3
        rows.write(_row(med, interleave_id=f"{folder.name}{n}", q_len=n, kv_len=n,
                        samples_ms=samples_giving(med, med * 0.98, med * 1.02), **base))
        for k, f in ((2, 1.01), (3, 0.99)):
            later.write(_visit(med * f, k, of=f"{folder.name}{n}", q_len=n, kv_len=n, **base))
    rows.close()
    later.close()
    write_env(folder, {"device": "cpu", "torch": "2.13.0", "peaks_tflops": {"float32": 0.2}})
    return folder


def test_compare_of_two_visited_runs_judges_them_without_a_calibration(tmp_path, capsys):
    from bench.cli import main

    a, b = _visited_run(tmp_path / "a", 1.0), _visited_run(tmp_path / "b", 2.0)
    assert main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1  # twice the time: a regression
    out = capsys.readouterr()
    judged = [line for line in out.err.splitlines() if "judged from each run's visits" in line]
    assert "Worse 3" in out.out and judged and numbers(judged[0])[:2] == [3, 3]
    assert "not calibrated" not in out.err
    merged = store.read_current(a)[0]
    assert merged["q1_ms"] == pytest.approx(0.98 * merged["median_ms"])  # the band lies around the figure
