"""A feature adds to a cell's life by its declaration alone (bench.measure.cellsteps's protocol):
a toy feature's steps, declared beside the others, watch a real CPU cell's rounds and turns and
add to its row, in their order among the built-in steps, and a step that raises ends its cell
with what it held before and its own name in the reason."""

import sys
import types

import pytest
import torch.nn.functional as F

from bench.engine import cell
from bench.engine.cell import run_group
from bench.measure.cellsteps import Keep, Step
from bench.measure.settings import MeasureSettings
from bench.model import features
from bench.model.case import Case
from bench.registry import Variant

CASE = Case("cpu", "float32", 1, 2, 2, 64, 64, 16, "none", None, "fwd")
SETTINGS = MeasureSettings(budget_ms=3, rounds=3, threads=1)


def _calls(timer) -> int:
    return timer.warmup_calls + sum(len(r) for r in timer.rounds)


class Watch:
    def __init__(self, log):
        self.log = log

    def start(self):
        self.log.append("start")

    def stop(self):
        self.log.append("stop")

    def turn(self, name, timer):
        log = self.log

        class Turn:
            def __enter__(self):
                log.append(("turn", name, _calls(timer)))

            def __exit__(self, *exc):
                log.append(("end", name, _calls(timer)))

        return Turn()


def _variant(name):
    return Variant(name=name, factory=lambda case: F.scaled_dot_product_attention, description=name,
                   module=__name__)


@pytest.fixture
def toy(monkeypatch):
    """A toy feature with two steps: one watching the rounds (order 5, before every built-in step)
    and one after the memory pass (order 55) that fails where the cell's variant is named 'fails'."""
    log = []
    module = types.ModuleType("toy_steps")

    def early(t):
        t.result.extra["toy_turns"] = sum(1 for e in log if e[0] == "turn" and e[1] == t.item.variant.name)
        t.result.extra["toy_saw_peak"] = t.result.peak_mem_bytes is not None

    def late(t):
        if t.item.variant.name == "fails":
            raise RuntimeError("the toy step broke")
        t.result.extra["toy_late_saw_peak"] = t.result.peak_mem_bytes is not None

    module.EARLY = Step("toy watch", 5, lambda t: "toy watch" in t.watched, early,
                        watch=lambda case, settings: Watch(log))
    module.LATE = Step("toy late", 55, lambda t: True, late, lambda t: "the toy's late step")
    monkeypatch.setitem(sys.modules, "toy_steps", module)
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, features.Feature(
        "toy", "a toy", steps=("toy_steps:LATE", "toy_steps:EARLY"))))
    cell.after_timing.cache_clear()
    yield log
    cell.after_timing.cache_clear()


def test_a_declared_step_watches_the_rounds_and_adds_to_the_row_in_its_order(toy):
    rows = []
    run_group([_variant("a"), _variant("b")], CASE, SETTINGS, rows.append)
    by = {r["variant"]: r for r in rows}
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert toy[0] == "start" and toy.count("start") == toy.count("stop") == 1
    stop = toy.index("stop")
    assert all(e[0] in ("turn", "end") for e in toy[1:stop])  # every turn watched inside the rounds
    for name in ("a", "b"):
        turns = [e for e in toy if e[0] == "turn" and e[1] == name]
        ends = [e for e in toy if e[0] == "end" and e[1] == name]
        assert len(turns) == len(ends) >= SETTINGS.rounds
        assert sum(end[2] - turn[2] for turn, end in zip(turns, ends)) > 0  # the timer's calls fall inside its turns
        assert by[name]["extra"]["toy_turns"] == len(turns)
        assert by[name]["extra"]["toy_saw_peak"] is False  # order 5: before the memory pass
        assert by[name]["extra"]["toy_late_saw_peak"] is True  # order 55: after it
        assert by[name]["contended_why"] is not None  # the built-in steps still ran


def test_a_step_that_raises_ends_its_cell_with_its_name_and_what_it_held(toy):
    rows = []
    run_group([_variant("fails"), _variant("fine")], CASE, SETTINGS, rows.append)
    by = {r["variant"]: r for r in rows}
    assert by["fine"]["status"] == "ok", by["fine"]["reason"]
    assert by["fails"]["status"] == "error"
    assert by["fails"]["reason"].startswith("the toy's late step") and "the toy step broke" in by["fails"]["reason"]
    assert by["fails"]["extra"]["toy_turns"] >= SETTINGS.rounds  # the earlier step's figure is kept


class Ledger:
    """A toy feature's kept object: what the worker's cells told it, and a taint to report."""

    def __init__(self, device_name):
        self.device_name, self.log, self.taint = device_name, [], ""

    def on_setup(self):
        self.log.append("setup")
        return self.taint

    def on_case(self, case, settings, live, quiet, emit, at):
        self.log.append(("case", case.q_len, [i.variant.name for i in live], isinstance(quiet, bool)))


@pytest.fixture
def ledger(monkeypatch):
    """A toy feature that keeps a Ledger in the worker, and a step that reads it."""
    module = types.ModuleType("toy_kept")
    module.KEEP = Keep("toy ledger", Ledger)

    def note(t):
        t.result.extra["toy_cases_before"] = sum(1 for e in t.kept["toy ledger"].log if e[0] == "case")

    module.STEP = Step("toy reads", 6, lambda t: "toy ledger" in t.kept, note)
    monkeypatch.setitem(sys.modules, "toy_kept", module)
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, features.Feature(
        "toy", "a toy", steps=("toy_kept:STEP",), kept=("toy_kept:KEEP",))))
    cell.after_timing.cache_clear()
    cell.worker_keeps.cache_clear()
    yield
    cell.after_timing.cache_clear()
    cell.worker_keeps.cache_clear()


def test_what_a_feature_keeps_is_made_once_and_told_of_each_setup_and_case(ledger):
    keeps = cell.worker_keeps()
    assert [k.name for k in keeps][-1] == "toy ledger" and {"memory", "held", "leftovers"} <= {k.name for k in keeps}
    kept = {"toy ledger": Ledger("cpu")}
    rows = []
    run_group([_variant("a"), _variant("b")], CASE, SETTINGS, rows.append, kept=kept)
    run_group([_variant("a")], CASE, SETTINGS, rows.append, kept=kept)
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert kept["toy ledger"].log == ["setup", "setup", ("case", 64, ["a", "b"], True),
                                      "setup", ("case", 64, ["a"], True)]
    assert [r["extra"]["toy_cases_before"] for r in rows] == [0, 0, 1]  # the step saw the same object


def test_a_variant_that_a_kept_object_finds_tainting_the_worker_is_an_error_and_ends_the_case(ledger):
    kept = {"toy ledger": Ledger("cpu")}
    kept["toy ledger"].taint = "a toy thread still busy"
    rows = []
    with pytest.raises(cell.WorkerTainted):
        run_group([_variant("a"), _variant("b")], CASE, SETTINGS, rows.append, kept=kept)
    assert [(r["variant"], r["status"]) for r in rows] == [("a", "error")]  # b never set up beside it
    assert "a toy thread still busy" in rows[0]["reason"] and kept["toy ledger"].log == ["setup"]
