import pytest
import torch

from bench.case import Case
from bench.inputs import make_grad_out, make_inputs
from bench.stats import Stats, quantile
from bench.timing import time_cpu, timed_call


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


def test_cpu_timer_takes_minimum_samples_and_syncs_each_block():
    syncs = []
    calls = []
    timing = time_cpu(lambda: calls.append(1), budget_ms=0.001, warmup_ms=0.0, min_samples=7,
                      sync=lambda: syncs.append(1))
    assert len(timing.samples_ms) == 7
    assert len(calls) == timing.warmup_calls + 7 * timing.number
    assert len(syncs) == timing.warmup_calls + 7  # once after every warm-up call and every block
    assert timing.threads == torch.get_num_threads()


def test_cpu_timer_samples_are_per_call_times_from_the_clock():
    """A fake clock that advances 2 ms per call: every per-call sample must be 2 ms."""
    now = [0.0]

    def call():
        now[0] += 0.002

    timing = time_cpu(call, budget_ms=50, warmup_ms=0.0, min_samples=5, min_block_ms=5.0,
                      clock=lambda: now[0])
    assert timing.number == 3  # ceil(5 ms block / 2 ms per call)
    assert timing.samples_ms == pytest.approx([2.0] * len(timing.samples_ms))
    assert timing.stats.iqr == pytest.approx(0.0)


def test_cpu_timer_stops_on_budget_when_noisy():
    import itertools

    durations = itertools.cycle([0.001, 0.004])  # IQR/median never small
    now = [0.0]

    def call():
        now[0] += next(durations)

    timing = time_cpu(call, budget_ms=40, warmup_ms=0.0, min_samples=5, min_block_ms=0.0,
                      threshold=0.01, clock=lambda: now[0])
    spent = sum(timing.samples_ms)
    assert 40 <= spent < 45 and timing.stats.noisy


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
