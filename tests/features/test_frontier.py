"""The memory frontier (issue 30, part 2): a memory model a·n² + b·n + c per variant, held to a
held-out peak; the search that starts from the model's prediction and brackets the largest n
with real cells; the command's bad input; the report's predicted frontier."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.cli import main
from bench.features import frontier
from bench.measure.bound import bind_variant
from bench.measure.memory import peak_bytes
from bench.model.case import Case
from bench.runs import memmodel
from tests.conftest import read_jsonl, run_cli
from tests.support.text import value


def test_the_fit_recovers_a_quadratic_and_never_a_shrinking_one():
    ns = [256, 512, 1024, 2048]
    a, b, c = memmodel.fit(ns, [3 * n * n + 500 * n + 4096 for n in ns])
    assert a == pytest.approx(3, rel=1e-6) and b == pytest.approx(500, rel=1e-4) and c == pytest.approx(4096, rel=1e-2)
    a, b, c = memmodel.fit(ns, [1e6 + 10 * n - 1e-4 * n * n for n in ns])  # concave: fitted as a line
    assert a == 0 and b > 0


def _case(n, **kw):
    return Case(heads=4, kv_heads=4, q_len=n, kv_len=n, head_dim=32, mask="causal", **kw)


@pytest.mark.parametrize("name", ["naive", "sdpa.math"])
def test_the_memory_model_predicts_a_held_out_peak_within_ten_percent(registry, name):
    """Peaks measured here, as a sweep's memory pass measures them (the allocator's record), at four
    lengths: the model fitted on three predicts the fourth within 10 %."""
    rows = []
    for n in (128, 256, 512, 1024):
        case = _case(n)
        bound = bind_variant(registry[name], case)
        with bound.scope():
            peak = peak_bytes("cpu", bound.timed("fwd"))
        rows.append({"variant": name, "status": "ok", "peak_mem_bytes": peak, **case.to_dict()})
    (model,) = memmodel.models(rows)
    assert model.held_out_n == 1024 and model.held_out_err <= memmodel.HELD_OUT_LIMIT and model.trusted
    assert model.a > 0  # the scores: quadratic
    next_n, next_peak = model.next_doubling()
    assert next_n == 2048 and next_peak > 3.5 * rows[-1]["peak_mem_bytes"]
    # the report's table: the predicted largest n is the model's, at the machine's memory less 10 %
    table, budget = __import__("reports.sections.frontier", fromlist=["memory_table"]).memory_table(
        pd.DataFrame(rows), [{"device": "cpu", "memory_bytes": 2**30}])
    assert budget == 0.9 * 2**30 and table["largest"].iloc[0] == model.largest_n(budget)
    assert model.footprint(model.largest_n(budget)) <= budget < model.footprint(model.largest_n(budget) + 1)


class Machine:
    """Cells of a variant whose true footprint is inputs + 40·n² bytes, failing `oom` past a
    physical limit, each taking a time that grows as n²."""

    def __init__(self, oom_above=None, seconds_per_n2=1e-7):
        self.runs, self.oom_above, self.k = [], oom_above, seconds_per_n2

    def __call__(self, case):
        self.runs.append(case.q_len)
        n = case.q_len
        if self.oom_above and n > self.oom_above:
            return {"status": "oom", "reason": "CPU out of memory"}, 1.0
        return {"status": "ok", "peak_mem_bytes": 40 * n * n, "median_ms": 1.0}, 1.0 + self.k * n * n


def _search(machine, budget, **kw):
    return frontier.search("v", "n", lambda n: _case(n), machine, budget, (256, 512, 1024), 600.0, **kw)


def test_the_search_starts_from_the_model_and_brackets_within_five_percent():
    machine, budget = Machine(), 2**30
    res = _search(machine, budget)
    fits = memmodel.largest(lambda n: memmodel.input_bytes(_case(n)) + 40 * n * n, budget, 10**6)
    assert memmodel.input_bytes(_case(fits + 1)) + 40 * (fits + 1) ** 2 > budget >= 40 * fits**2
    assert res.largest <= fits and res.smallest_over > fits  # the true frontier lies in the bracket
    assert res.smallest_over <= res.largest * 1.05 and res.stop.startswith("bracketed")
    assert res.predicted == fits  # the probes' exact model puts the first guess on it
    assert len(machine.runs) <= 5  # three probes, the guess, one just above it
    assert "over the budget" in res.over_why


def test_an_out_of_memory_is_a_cell_and_the_search_goes_on_below_it():
    machine = Machine(oom_above=3000)  # the machine gives out before the budget does
    res = _search(machine, 2**30)
    assert res.largest <= 3000 < res.smallest_over and res.over_why.startswith("oom")
    assert res.smallest_over <= res.largest * 1.05 or res.smallest_over == res.largest + 1


def test_the_search_stops_before_a_cell_past_the_timeout_and_never_runs_one_past_the_machine():
    slow = Machine(seconds_per_n2=1e-4)  # n=1024 takes 106 s; twice n takes four times as long
    res = frontier.search("v", "n", lambda n: _case(n), slow, 2**30, (256, 512, 1024), 200.0)
    assert "past the timeout of 200 s" in res.stop and max(slow.runs) == 1024 and res.largest == 1024
    machine = Machine()
    res = _search(machine, 2**30, limit=2**28)  # the machine spares a quarter of the budget
    skipped = [c for c in res.cells if c.status == "skipped"]
    assert skipped and value(skipped[0].why, "beyond the") == 256 and "spare" in skipped[0].why
    assert max(machine.runs) < skipped[0].size


@pytest.mark.parametrize("args, says", [
    ([], "needs --memory-budget SIZE"),
    (["--memory-budget", "9XB"], "give a size such as 8GiB"),
    (["--memory-budget", "1GiB", "--masks", "none,causal"], "give one value of --masks"),
    (["--memory-budget", "1GiB", "--at-n", "x"], "--at-n takes a whole number from 1 to"),
    (["--memory-budget", "1PiB"], "give a size such as 8GiB"),
])
def test_bad_frontier_input_says_what_is_valid(capsys, args, says):
    assert main(["frontier", "--variants", "naive", "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.slow
def test_frontier_finds_the_largest_n_for_naive_within_five_percent(tmp_path):
    """Real cells in workers: the largest n fits the budget, the smallest above it, within 5 %, does not
    (its own run folder's row holds a footprint past the budget)."""
    out = tmp_path / "fr"
    r = run_cli("frontier", "--device", "cpu", "--variants", "naive", "--heads", "2", "--head-dims", "32",
                "--memory-budget", "48MiB", "--out", str(out))
    assert r.returncode == 0, r.stderr
    row = pd.read_csv(out / "frontier.csv").iloc[0]
    assert row["variant"] == "naive" and row["smallest_over"] <= row["largest"] * 1.05
    budget = 48 * 2**20
    for size, over in ((int(row["largest"]), False), (int(row["smallest_over"]), True)):
        (cell,) = [x for x in read_jsonl(out / "cells" / f"naive-n{size}" / "results.jsonl") if x["variant"] == "naive"]
        footprint = memmodel.input_bytes(Case.from_dict(cell)) + cell["peak_mem_bytes"]
        assert (footprint > budget) is over, (size, footprint)
    assert (out / "frontier.png").exists() and (out / "frontier-cells.csv").exists()
    assert "bracketed within 5%" in r.stdout
