"""Host-side preparation (issue 30, part 1): what a factory must redo whenever the inputs'
structure changes (a bool mask, a bias, a block mask, a page table, nested offsets) is timed
apart from the rest of its setup, as prep_ms, and lands in the row."""

from __future__ import annotations

import pytest

from bench.measure.bound import bind_variant
from bench.model import masks
from bench.model.case import Case
from bench.registry import Prepared, prep


def test_prep_adds_the_time_inside_it_to_the_figures():
    import time

    info = {}
    with prep(info):
        time.sleep(0.02)
    with prep(info):
        time.sleep(0.01)
    assert 30 <= info["prep_ms"] < 1000  # both blocks, in milliseconds
    with pytest.raises(ValueError), prep(info):  # an error inside still counts the time, and goes on
        raise ValueError("x")
    assert info["prep_ms"] >= 30


@pytest.mark.parametrize("spelling, layout", [("causal", "contiguous"), ("document:3", "contiguous"),
                                              ("causal+alibi", "contiguous"), ("causal", "paged:16")])
def test_each_variant_times_its_structure_apart_from_its_setup(registry, spelling, layout):
    case = Case(q_len=48, kv_len=96, heads=4, kv_heads=2, head_dim=16, mask=masks.canonical(spelling)[0],
                align="br", kv_layout=layout)
    for name in ("naive", "chunked.online", "sdpa", "sdpa.math"):
        if registry[name].static_reason(case):
            continue
        bound = bind_variant(registry[name], case)
        assert isinstance(bound.prepared, Prepared)
        prep_ms = bound.prepared.info.get("prep_ms")
        assert prep_ms is not None and 0 < prep_ms <= bound.setup_ms, (name, spelling, bound.prepared.info)


@pytest.mark.slow
def test_a_sweep_row_carries_prep_ms(tmp_path):
    from bench.api import build_spec, discover, parse_values, run_sweep
    from reports.frames import load_runs
    from tests.conftest import read_records

    values = parse_values({"variants": ["naive", "sdpa.math"], "seq_lens": [64], "heads": [2], "head_dims": [8],
                           "masks": ["document:2"], "directions": ["fwd"], "budget_ms": 5.0, "device": "cpu",
                           "remeasure": 0, "steps": 2, "visits": 1})
    run_sweep(build_spec(values, discover(entry_points=False)), tmp_path / "run")
    rows = read_records(tmp_path / "run" / "results.jsonl")  # as the run folder keeps it: a variant's figure
    assert {r["variant"] for r in rows} == {"naive", "sdpa.math"}
    for r in rows:
        assert r["status"] == "ok" and 0 < r["extra"]["prep_ms"] <= r["setup_ms"] + 0.05, r
    frame, _ = load_runs([tmp_path / "run"])
    assert (frame["prep_ms"] > 0).all()  # the report's frame reads it as a column
    # --steps 2: each row's step figures, and the report's cost per step
    assert all(len(r["extra"]["step_ms"]) == 2 and r["extra"]["recompiles"] == 0 for r in rows)
    from bench.api import build_report

    build_report([tmp_path / "run"])
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "## Cost per step" in report and (tmp_path / "run" / "report" / "charts" / "steps.png").exists()
    table = __import__("pandas").read_csv(tmp_path / "run" / "report" / "steps.csv")
    assert set(table["variant"]) == {"naive", "sdpa.math"} and (table["recompiles"] == "0 of 2").all()


# -- what a step costs (--steps K) ----------------------------------------------------------------


def test_a_loader_s_next_batches_vary_their_tokens_around_n():
    from bench.features.steps import step_cases
    from bench.model.case import Case
    from bench.model.workload import free_lengths

    draws = [free_lengths("lognormal:0.5", 4, 64, seed) for seed in range(1, 41)]
    assert all(sum(d) % 4 == 0 and len(set(d)) > 1 for d in draws)  # a whole mean, ragged
    assert len({sum(d) for d in draws}) > 10 and 0.8 < sum(map(sum, draws)) / (40 * 4 * 64) < 1.2
    assert free_lengths("lognormal:0.5", 4, 64, 3) == draws[2]  # seeded
    assert sorted(free_lengths("10/20/30", 3, 20, 5)) == [10, 20, 30]  # a list is shuffled, not redrawn
    case = Case(batch=4, heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=8, mask="causal", lengths="lognormal:0.5")
    steps = step_cases(case, 3)
    assert [c.batch * c.q_len for c in steps] == [sum(d) for d in draws[:3]]
    fixed = case.replace(lengths="fixed")
    assert step_cases(fixed, 2) == [fixed, fixed]


def test_steps_time_each_fresh_batch_and_count_no_recompile_without_a_compile(registry):
    from bench.features.steps import run_steps
    from bench.model.case import Case

    case = Case(batch=4, heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=8, mask="none", lengths="lognormal:0.5",
                direction="fwd+bwd")  # nested tensors (whose is_causal the CPU refuses)
    out = run_steps(registry["sdpa.math"], case, 3)
    assert out["steps"] == 3 and len(out["step_ms"]) == 3 and all(s > 0 for s in out["step_ms"])
    assert out["recompiles"] == 0 and out["step_recompiles"] == [0, 0, 0] and "compile_warm_ms" not in out
    assert len(set(out["step_tokens"])) > 1 and out["step_prep_ms"] > 0  # nested offsets, rebuilt per batch
    assert min(out["step_ms"]) <= out["step_median_ms"] <= max(out["step_ms"])


@pytest.mark.slow
def test_flex_recompiles_for_each_new_length_unless_dynamic_and_a_warm_compile_is_cheaper(registry, tmp_path):
    """Static shapes: every step's new number of tokens is a new graph; dynamic shapes (the block
    mask's block counts marked dynamic too): none.  The same case compiled again after a dynamo reset
    hits inductor's caches: cheaper than its first compile."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    from bench.features.steps import run_steps
    from bench.model.case import Case
    from bench.model.registry import compile_dynamic

    case = Case(batch=4, heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=16, mask="causal",
                lengths="lognormal:0.5")
    counts = {}
    try:
        for dynamic in (False, True):
            compile_dynamic(dynamic)
            torch._dynamo.reset()  # cold: nothing compiled in this process, nor in an earlier run's cache
            with temporary_cache_dir(str(tmp_path / f"inductor-{dynamic}")):
                first = registry["flex"].prepare(case)  # the cell's setup: its first compile
                out = run_steps(registry["flex"], case, 1)  # a step of a new length, then the same case again, warm
            counts[dynamic] = out["step_recompiles"]
            if not dynamic:
                assert out["compile_warm_ms"] < first.info["compile_ms"], (out["compile_warm_ms"], first.info)
    finally:
        compile_dynamic(False)
    assert counts[False] == [1] and counts[True] == [0]  # the first new length: where a guard would fail
