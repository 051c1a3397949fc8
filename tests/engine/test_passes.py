"""A feature adds a pass to a sweep by its declaration alone (bench.engine.passes's protocol): a toy
feature's pass, declared beside the others, runs in a real sweep after every cell's first visit,
with the pool's workers alive and the cells measured ok, writes its own file in the run folder, and
its seconds, notes and settled flags reach the sweep's summary."""

import json
import sys
import types

import pytest

from bench.api import SweepOptions, build_spec, discover, parse_values, run_sweep
from bench.engine import passes
from bench.engine.passes import Pass, PassResult
from bench.model import features


@pytest.fixture
def toy(monkeypatch):
    seen = []
    module = types.ModuleType("toy_pass")

    def run(s):
        measured = {case.q_len: names for case, names in s.pool.measured.items()}
        worker = s.pool.workers[0]
        seen.append({"measured": measured, "cells": len(s.cells), "worker_rows": worker.run_group(
            ["naive"], next(iter(s.pool.measured)), s.spec.timeout, lambda row: None)[0]})
        writer = s.writer("toy.jsonl")
        writer.write({"variant": "naive", "toy": sorted(measured)})
        writer.close()
        return PassResult(0.25, ("toy: 2 cases",), frozenset({"noisy"}))

    module.PASS = Pass("toy pass", 15, run)
    monkeypatch.setitem(sys.modules, "toy_pass", module)
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, features.Feature(
        "toy", "a toy", passes=("toy_pass:PASS",))))
    passes.sweep_passes.cache_clear()
    yield seen
    passes.sweep_passes.cache_clear()


@pytest.mark.slow  # a real sweep, its worker a process of its own
def test_a_declared_pass_runs_after_the_first_visits_and_reaches_the_summary(toy, tmp_path):
    assert [p.name for p in passes.sweep_passes()] == ["re-measure", "toy pass", "later visits", "profiled pass",
                                                      "the cost model's record"]
    values = parse_values({"variants": ["naive"], "seq_lens": [32, 48], "heads": [2], "head_dims": [8],
                           "masks": ["none"], "directions": ["fwd"], "budget_ms": 5.0, "device": "cpu",
                           "remeasure": 0, "visits": 1})
    summary = run_sweep(build_spec(values, discover()), tmp_path / "run", SweepOptions(progress=False))
    assert toy == [{"measured": {32: ["naive"], 48: ["naive"]}, "cells": 2, "worker_rows": "done"}]
    assert "toy: 2 cases" in summary.remeasured and "noisy" in summary.settled
    assert summary.timed_s >= 0.25  # the pass's timed seconds are the sweep's
    rows = [json.loads(line) for line in (tmp_path / "run" / "toy.jsonl").read_text().splitlines()]
    assert [r["toy"] for r in rows] == [[32, 48]]
