"""A contended case is timed again in place (bench.features.contention.retime.Held): kept set up in the worker,
timed again after the next case whose own timing was quiet or when the sweep flushes it, with no
new inputs, reference, setup or check; its rows come again with the new timing and say why."""

import torch.nn.functional as F

from bench.engine import cell
from bench.engine.cell import run_group
from bench.features.contention import contention
from bench.features.contention.retime import Held
from bench.measure import bound
from bench.measure.settings import MeasureSettings
from bench.model.case import Case
from bench.registry import Variant
from tests.support.text import count, numbers


def _variants(setups: list):
    def make(name):
        def factory(case):
            setups.append((name, case.q_len))

            def attention(q, k, v):
                return F.scaled_dot_product_attention(q, k, v)
            return attention
        return Variant(name=name, factory=factory, description=name)
    return [make("A"), make("B")]


def _case(n: int) -> Case:
    return Case("cpu", "float32", 1, 2, 2, n, n, 16, "none", None, "fwd")


def _scripted_load(monkeypatch, busy: list):
    """The load verdict each timing gets, in turn: contended while ``busy`` says so (injected,
    not measured: the machine's own load plays no part)."""
    real = contention.verdict

    def verdict(cpu_util, other_cpu, threads, samples_ms=(), cpu_count=None):
        out = real(1.0, 0.0, threads, (), cpu_count)
        if busy.pop(0):
            out.update(contended=True, other_cpu=1.5, contended_why="other processes used 1.50 cores (free: 0)")
        return out

    monkeypatch.setattr(contention, "verdict", verdict)


def test_a_contended_case_is_timed_again_after_the_next_quiet_case_and_only_timed(monkeypatch):
    setups, inputs = [], []
    real_inputs = bound.case_inputs  # the core scope's shared inputs (bench.scopes.core)
    monkeypatch.setattr(bound, "case_inputs", lambda case: inputs.append(case.q_len) or real_inputs(case))
    _scripted_load(monkeypatch, [True, True, False, False, False, False])  # n=32 busy, n=48 quiet, n=32 again
    held, rows = Held(), []
    settings = MeasureSettings(budget_ms=6, rounds=2, threads=1)
    variants = _variants(setups)
    run_group(variants, _case(32), settings, rows.append, kept={"held": held})
    assert [(r["variant"], r["contended"]) for r in rows] == [("A", True), ("B", True)]
    assert len(held.cases) == 1  # kept set up
    run_group(variants, _case(48), settings, rows.append, kept={"held": held})
    assert [(r["variant"], r["q_len"], r["contended"], r.get("retimed")) for r in rows[2:4]] == \
        [("A", 48, False, None), ("B", 48, False, None)]
    again = rows[4:]
    assert [(r["variant"], r["q_len"], r["contended"]) for r in again] == [("A", 32, False), ("B", 32, False)]
    assert not held.cases
    for first, new in zip(rows[:2], again):
        assert new["retimed"].startswith("in place;") and numbers(new["retimed"]) == [1.5, 0]  # cores used, free
        assert new["interleave_id"] != first["interleave_id"]  # timed together in rounds of their own
        assert new["samples_ms"] != first["samples_ms"] and new["samples"] >= 2
        for kept in ("max_abs_err", "cosine", "peak_mem_bytes", "setup_ms", "deterministic"):
            assert new[kept] == first[kept], kept  # the check and the memory pass are not made again
    assert again[0]["interleave_id"] == again[1]["interleave_id"]  # paired, as the first rounds were
    assert setups == [("A", 32), ("B", 32), ("A", 48), ("B", 48)]  # no setup for the re-timing
    assert inputs == [32, 48]  # nor new inputs (nor a reference, which is computed from them)


def test_the_newest_held_cases_are_kept_and_timed_again_when_flushed(monkeypatch):
    _scripted_load(monkeypatch, [True] * 6 + [False] * 4)
    held, rows = Held(limit=2), []
    settings = MeasureSettings(budget_ms=4, rounds=1, threads=1)
    variants = _variants([])
    for n in (16, 24, 32):
        run_group(variants, _case(n), settings, rows.append, kept={"held": held})
    assert [c.q_len for c, _, _ in held.cases] == [24, 32]  # the oldest let go
    held.retime(rows.append)  # the sweep's flush at the end of its pass
    assert [(r["variant"], r["q_len"], bool(r.get("retimed"))) for r in rows[6:]] == \
        [("A", 24, True), ("B", 24, True), ("A", 32, True), ("B", 32, True)]
    assert not held.cases


def test_nothing_is_held_without_a_holder_or_for_what_cannot_be_timed_again(monkeypatch):
    _scripted_load(monkeypatch, [True] * 4)
    rows = []
    run_group(_variants([]), _case(16), MeasureSettings(budget_ms=4, rounds=1, threads=1), rows.append)
    assert len(rows) == 2 and all(r["contended"] for r in rows)  # --remeasure 0: rows as they came
    held = Held()
    bwd = Case("cpu", "float32", 1, 2, 2, 16, 16, 16, "none", None, "bwd")
    run_group(_variants([]), bwd, MeasureSettings(budget_ms=4, rounds=1, threads=1), rows.append, kept={"held": held})
    assert not held.cases  # two backward variants build their forward per turn: not held


def test_a_variant_timed_again_with_its_case_says_so(monkeypatch):
    """Only A's first timing was contended: the case is held whole, B is timed again beside A (their
    rounds stay paired), and B's row says why it came again."""
    _scripted_load(monkeypatch, [True, False, False, False])
    held, rows = Held(), []
    run_group(_variants([]), _case(16), MeasureSettings(budget_ms=4, rounds=1, threads=1), rows.append,
              kept={"held": held})
    held.retime(rows.append)
    assert [(r["variant"], r["contended"]) for r in rows[:2]] == [("A", True), ("B", False)]
    assert rows[2]["retimed"].startswith("in place;") and count(rows[2]["retimed"], "cores") == 1.5
    assert rows[3]["retimed"].startswith("in place, with its case") and "contended" in rows[3]["retimed"]


def test_a_re_timing_that_raises_leaves_the_first_rows_and_the_worker(monkeypatch):
    _scripted_load(monkeypatch, [True, True])
    held, rows = Held(), []
    run_group(_variants([]), _case(16), MeasureSettings(budget_ms=4, rounds=1, threads=1), rows.append,
              kept={"held": held})
    monkeypatch.setattr(cell, "make_timer", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no timer")))
    held.retime(rows.append)  # no exception out of it: the worker goes on
    assert len(rows) == 2 and all(r["contended"] for r in rows) and not held.cases


def test_with_remeasure_0_a_contended_case_is_not_held(monkeypatch):
    _scripted_load(monkeypatch, [True, True])
    held, rows = Held(), []
    settings = MeasureSettings(budget_ms=4, rounds=1, threads=1, retime=False)
    run_group(_variants([]), _case(16), settings, rows.append, kept={"held": held})
    assert len(rows) == 2 and all(r["contended"] for r in rows) and not held.cases
