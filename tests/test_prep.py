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
    from tests.conftest import read_jsonl

    values = parse_values({"variants": ["naive", "sdpa.math"], "seq_lens": [64], "heads": [2], "head_dims": [8],
                           "masks": ["document:2"], "directions": ["fwd"], "budget_ms": 5.0, "device": "cpu",
                           "remeasure": 0})
    run_sweep(build_spec(values, discover(entry_points=False)), tmp_path / "run")
    rows = read_jsonl(tmp_path / "run" / "results.jsonl")  # as the run folder keeps it: a variant's figure
    assert {r["variant"] for r in rows} == {"naive", "sdpa.math"}
    for r in rows:
        assert r["status"] == "ok" and 0 < r["extra"]["prep_ms"] <= r["setup_ms"] + 0.05, r
    frame, _ = load_runs([tmp_path / "run"])
    assert (frame["prep_ms"] > 0).all()  # the report's frame reads it as a column
