import itertools

import pytest
import torch

from bench.case import Case
from bench.measure.inputs import make_grad_out, make_inputs
from bench.measure.stats import Stats, median_ci_ranks, quantile
from bench.measure.timing import CpuTimer, interleave, timed_call


def test_stats_against_hand_computed_figures():
    s = Stats.of([4.0, 1.0, 3.0, 2.0, 100.0])
    # sorted 1 2 3 4 100: median 3; q1 at rank 1.0 -> 2; q3 at rank 3.0 -> 4
    assert (s.count, s.median, s.q1, s.q3, s.iqr, s.min, s.max) == (5, 3.0, 2.0, 4.0, 2.0, 1.0, 100.0)
    assert s.mean == pytest.approx(22.0)
    assert s.rel_iqr == pytest.approx(2 / 3) and s.noisy
    t = Stats.of([10.0, 10.2, 10.4, 10.6])
    # ranks: q1 at 0.75 -> 10.15, median at 1.5 -> 10.3, q3 at 2.25 -> 10.45
    assert t.q1 == pytest.approx(10.15) and t.median == pytest.approx(10.3)
    assert t.q3 == pytest.approx(10.45) and t.iqr == pytest.approx(0.3)
    assert not t.noisy  # 0.3 / 10.3 < 10%
    assert quantile([5.0], 0.75) == 5.0
    with pytest.raises(ValueError):
        Stats.of([])


class FakeClock:
    """A clock that advances only when the timed call runs (and a CPU clock beside it)."""

    def __init__(self, durations, cpu_share=1.0):
        self.now = 0.0
        self.cpu = 0.0
        self.durations = itertools.cycle(durations)
        self.cpu_share = cpu_share
        self.calls = 0

    def call(self):
        d = next(self.durations)
        self.now += d
        self.cpu += d * self.cpu_share * torch.get_num_threads()
        self.calls += 1


def _timer(clock, **kw):
    return CpuTimer(clock.call, clock=lambda: clock.now, cpu_clock=lambda: clock.cpu, **kw)


def test_median_ci_ranks_are_the_exact_binomial_ones():
    assert median_ci_ranks(5) is None  # [min, max] of 5 covers the median with p = 0.9375 < 0.95
    assert median_ci_ranks(6) == (0, 5)  # 1 - 2/64 = 0.969
    assert median_ci_ranks(10) == (1, 8)  # 1 - 2*11/1024 = 0.979; (2, 7) would be 0.891
    lo, hi = median_ci_ranks(1000)
    assert 468 <= lo <= 470 and hi == 1000 - 1 - lo  # normal approximation: 500 -+ 1.96 * sqrt(1000) / 2


def test_cpu_timer_stops_once_the_median_is_precise():
    """Constant 2 ms calls: warm after two agreeing blocks, precise at the first 95% CI (6
    samples), long before the budget."""
    clock = FakeClock([0.002])
    timer = _timer(clock, precision=0.02)
    timer.run_round(budget_ms=10_000, min_samples=3)
    t = timer.result()
    assert t.samples_ms == pytest.approx([2.0] * 6)
    assert t.number == 1 and t.warmup_calls == 0  # the two agreeing blocks are kept as samples
    assert clock.calls == 6
    assert t.timed_s == pytest.approx(0.012) and t.cpu_util == pytest.approx(1.0)


def test_cpu_timer_drops_cold_blocks_and_blocks_short_calls():
    """A slow first call is warm-up, not a sample; 0.25 ms calls are timed 4 to a block."""
    clock = FakeClock([0.010] + [0.00025] * 10_000)
    timer = _timer(clock, precision=0.02, min_block_ms=1.0)
    timer.run_round(budget_ms=10_000, min_samples=3)
    t = timer.result()
    assert t.number == 4 and t.samples_ms == pytest.approx([0.25] * 6)
    assert t.warmup_calls >= 1 and clock.calls == t.warmup_calls + 6 * 4


def test_cpu_timer_stops_on_budget_when_noisy_and_says_so():
    clock = FakeClock([0.001, 0.004])  # the median's CI never narrows to +-2%
    timer = _timer(clock, precision=0.02, min_block_ms=0.0)
    timer.run_round(budget_ms=40, min_samples=3)
    t = timer.result()
    spent = sum(t.samples_ms) + t.warmup_calls * 2.5
    assert 40 <= spent < 46
    assert t.summary().columns()["noisy"] is True and t.summary().columns()["samples"] == len(t.samples_ms)


def test_cpu_timer_syncs_every_block_and_keeps_gc_off_inside():
    import gc

    syncs, gc_states = [], []
    clock = FakeClock([0.002])

    def call():
        gc_states.append(gc.isenabled())
        clock.call()

    timer = CpuTimer(call, clock=lambda: clock.now, cpu_clock=lambda: clock.cpu, sync=lambda: syncs.append(1))
    timer.run_round(budget_ms=1000, min_samples=3)
    assert len(syncs) == clock.calls  # one block per call here: a sync after each
    assert gc_states and not any(gc_states) and gc.isenabled()


def test_cpu_util_is_cpu_time_over_wall_time_and_threads():
    clock = FakeClock([0.002], cpu_share=0.5)  # the threads ran half of the time
    timer = _timer(clock)
    timer.run_round(budget_ms=1000, min_samples=3)
    assert timer.result().cpu_util == pytest.approx(0.5)
    assert timer.result().summary().columns()["cpu_util"] == pytest.approx(0.5)


def test_interleave_takes_turns_round_by_round():
    order = []

    class Logger:
        def __init__(self, name):
            self.name = name

        def run_round(self, budget_ms, min_samples=1):
            order.append((self.name, budget_ms))

    interleave({n: Logger(n) for n in "ABC"}, rounds=3, budget_ms=90)
    assert [n for n, _ in order] == list("ABCABCABC")
    assert {b for _, b in order} == {30}  # each turn gets budget / rounds


def test_interleave_drops_a_failing_timer_and_goes_on():
    order, failed = [], []

    class T:
        def __init__(self, name):
            self.name, self.turns = name, 0

        def run_round(self, budget_ms, min_samples=1):
            self.turns += 1
            order.append(self.name)
            if self.name == "B" and self.turns == 2:
                raise RuntimeError("boom")

    interleave({n: T(n) for n in "ABC"}, rounds=3, budget_ms=30, on_error=lambda n, e: failed.append((n, str(e))))
    assert order == list("ABCABCAC") and failed == [("B", "boom")]


def test_backward_timing_runs_forward_once_outside():
    case = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "none", None, "bwd")
    q, k, v = make_inputs(case)
    forwards = []

    def fn(q, k, v):
        forwards.append(1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    call = timed_call(case, fn, q, k, v, make_grad_out(case))
    assert len(forwards) == 1
    first = call()
    second = call()
    assert len(forwards) == 1  # the timed call is the backward alone
    assert all(torch.equal(a, b) for a, b in zip(first, second))  # nothing accumulates
    assert q.grad is None

    both = timed_call(case.replace(direction="fwd+bwd"), fn, q, k, v, make_grad_out(case))
    both()
    both()
    assert len(forwards) == 3


def test_the_variants_of_a_case_are_timed_round_robin_in_the_worker_code():
    """run_group, as the worker runs it: each variant is checked, then the three are timed in
    turns over three rounds (A B C A B C A B C), then each one's memory pass."""
    import torch.nn.functional as F

    from bench.engine.cell import run_group
    from bench.features.contention import contention
    from bench.measure.settings import MeasureSettings
    from bench.registry import Variant

    log = []

    def make(name):
        def factory(case):
            def attention(q, k, v):
                log.append(name)
                return F.scaled_dot_product_attention(q, k, v)
            return attention
        return Variant(name=name, factory=factory, description=name)

    case = Case("cpu", "float32", 1, 2, 2, 32, 32, 16, "none", None, "fwd")
    rows = []
    run_group([make("A"), make("B"), make("C")], case, MeasureSettings(budget_ms=30, rounds=3), rows.append)
    turns = [name for name, _ in itertools.groupby(log)]
    assert turns == list("ABC") + list("ABC") * 3 + list("ABC")  # check, 3 rounds, memory
    assert [r["status"] for r in rows] == ["ok"] * 3
    for r in rows:
        assert r["rounds"] == 3 and len(r["round_medians_ms"]) == 3
        assert r["samples"] >= 3 and r["budget_ms"] == 30 and r["precision"] == 0.02  # one a round at least
        assert 0 < r["cpu_util"] and "other_cpu" in r
        # the flag is the verdict on this row's own figures, not a guess
        assert r["contended"] == contention.verdict(r["cpu_util"], r["other_cpu"], r["threads"],
                                                    r["samples_ms"])["contended"]


def test_a_cell_gets_the_samples_an_interval_needs_under_its_ceiling():
    """50 ms calls and a 60 ms budget over 3 rounds: the budget alone takes one sample a round, three
    in all, which hold no 95% interval of the median.  Under a ceiling of 2 s the rounds take two
    each, six in all; under one too low for that they keep what they have, and the row says what
    three samples support (their min and max hold the median with 75% confidence) instead of calling
    the cell noisy."""
    from bench.measure.stats import minmax_confidence
    from bench.measure.timing import INTERVAL_SAMPLES, interleave

    def timed(ceiling_ms):
        clock = FakeClock([0.050, 0.051, 0.049])
        timer = _timer(clock, precision=0.02, min_block_ms=0.0)
        timer.warm = True  # warm-up is another test's business
        interleave({"a": timer}, rounds=3, budget_ms=60.0, ceiling_ms=ceiling_ms)
        return timer

    timer = timed(2000.0)
    enough = timer.result()
    assert len(enough.samples_ms) == INTERVAL_SAMPLES and [len(r) for r in timer.rounds] == [2, 2, 2]
    row = enough.summary().columns()
    assert row["few_samples"] is False and row["noisy"] is False and row["ci_halfwidth"] is not None
    assert row["median_confidence"] == 0.95
    capped = timed(60.0)
    assert [len(r) for r in capped.rounds] == [1, 1, 1]  # the budget alone, as before
    row = capped.result().summary().columns()
    assert row["samples"] == 3 and row["few_samples"] is True and row["noisy"] is False  # unknown, not wide
    assert row["median_confidence"] == minmax_confidence(3) == 0.75 and row["ci_halfwidth"] is None

