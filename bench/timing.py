"""Timers.  GPU: CUDA events around each repetition with an L2 flush in between, warm-up
and repetition budgets in ms (the triton.testing.do_bench method).  CPU: perf_counter over
blocks of calls, adaptive until IQR/median is small or the budget is spent (the
torch.utils.benchmark adaptive_autorange method).  Raw per-call samples are kept.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bench.case import Case
from bench.stats import Stats

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100/H200: 50-60 MiB)


@dataclass
class Timing:
    samples_ms: list[float]  # per call
    number: int  # calls per sample
    warmup_calls: int
    method: str
    threads: int = field(default_factory=torch.get_num_threads)

    @property
    def stats(self) -> Stats:
        return Stats.of(self.samples_ms)

    def to_row(self) -> dict:
        s = self.stats
        return {"median_ms": s.median, "iqr_ms": s.iqr, "min_ms": s.min, "mean_ms": s.mean,
                "q1_ms": s.q1, "q3_ms": s.q3, "samples": s.count, "noisy": s.noisy,
                "number": self.number, "warmup_calls": self.warmup_calls,
                "timer": self.method, "threads": self.threads, "samples_ms": self.samples_ms}


def timed_call(case: Case, fn: Callable, q, k, v, grad_out=None) -> Callable[[], object]:
    """The call to time for the case's direction.

    fwd: the forward.  bwd: the forward runs once here, outside the timed region; the timed
    call is the backward through the retained graph (torch.autograd.grad returns fresh
    gradients, so none accumulate between repetitions).  fwd+bwd: both, as one call.
    """
    inputs = (q, k, v)
    if case.direction == "fwd":
        return lambda: fn(q, k, v)
    if case.direction == "bwd":
        out = fn(q, k, v)
        return lambda: torch.autograd.grad(out, inputs, grad_out, retain_graph=True)
    return lambda: torch.autograd.grad(fn(q, k, v), inputs, grad_out)


def time_cpu(call: Callable, budget_ms: float = 1000.0, warmup_ms: float = 50.0,
             min_samples: int = 5, max_samples: int = 1000, threshold: float = 0.05,
             min_block_ms: float = 1.0, sync: Callable[[], None] = lambda: None,
             clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Adaptive CPU timing: at least ``min_samples`` samples, more until IQR/median is
    below ``threshold`` or ``budget_ms`` is spent.  Each sample times a block of
    ``number`` calls (enough to last ``min_block_ms``) and stores the per-call mean."""
    t0 = clock()
    call()
    sync()
    warm = 1
    est = (clock() - t0) * 1e3
    while (clock() - t0) * 1e3 < warmup_ms:
        s = clock()
        call()
        sync()
        est = (clock() - s) * 1e3
        warm += 1
    number = max(1, math.ceil(min_block_ms / max(est, 1e-6)))
    samples: list[float] = []
    start = clock()
    while len(samples) < max_samples:
        s = clock()
        for _ in range(number):
            call()
        sync()
        samples.append((clock() - s) * 1e3 / number)
        if len(samples) >= min_samples:
            spent = (clock() - start) * 1e3
            if spent >= budget_ms or Stats.of(samples).rel_iqr < threshold and spent >= budget_ms / 10:
                break
    return Timing(samples, number, warm, "cpu-perf_counter")


def time_cuda(call: Callable, warmup_ms: float = 25.0, rep_ms: float = 100.0,
              min_samples: int = 10, max_samples: int = 10_000) -> Timing:
    """CUDA events around each repetition; a 256 MiB buffer is zeroed before each one so
    that no repetition finds its data in L2.  Counts derive from a 5-call estimate."""
    cache = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        cache.zero_()
        call()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-4)
    n_warmup = max(1, int(warmup_ms / est))
    n_rep = min(max_samples, max(min_samples, int(rep_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for _ in range(n_warmup):
        call()
    for i in range(n_rep):
        cache.zero_()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    del cache
    return Timing(samples, 1, n_warmup + 6, "cuda-events+l2-flush")


def time_call(device: str, call: Callable, budget_ms: float) -> Timing:
    if device == "cuda":
        return time_cuda(call, warmup_ms=min(25.0, budget_ms / 4), rep_ms=budget_ms)
    return time_cpu(call, budget_ms=budget_ms)
