"""Timers.

CPU: perf_counter around blocks of calls (each block lasts at least MIN_BLOCK_MS, so the
clock's own cost is negligible).  There is no fixed warm-up: blocks are timed from the
start, and the ones taken before two successive blocks agree within WARMUP_AGREE are
dropped as warm-up.  Sampling stops as soon as the 95% confidence interval of the median
(order statistics, so no assumption on the shape of the distribution) lies within
+-precision of the median, or when the budget is spent.  The process CPU time spent in
the timed blocks is kept beside their wall time: ``cpu_util`` says whether the cores were
ours.  The garbage collector is off inside the timed blocks, as in timeit.

GPU: CUDA events around each repetition with a 256 MiB buffer zeroed in between (an L2
flush), warm-up and repetition budgets in ms (the triton.testing.do_bench method).

Both take their samples in segments: a ``Timer`` is run for one round at a time, so that
the variants of one case can take turns (A B C A B C ...), and drift on a shared machine
lands on all of them alike.  Raw per-call samples are kept, with the median of each round.
"""

from __future__ import annotations

import bisect
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from bench.measure.settings import DEFAULT_PRECISION, INTERVAL_SAMPLES
from bench.measure.stats import Stats, ci_halfwidth, sample_figures
from bench.model.case import Case

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H100/H200: 50-60 MiB)
MIN_BLOCK_MS = 1.0  # a CPU sample times a block of calls lasting at least this long
WARMUP_AGREE = 0.10  # warm once two successive block estimates agree within 10%
MAX_CPU_SAMPLES = 2000
MIN_ROUND_SAMPLES = 3  # per round, so that each round's median means something


@dataclass
class Timing:
    samples_ms: list[float]  # per call, every round
    number: int  # calls per sample
    warmup_calls: int
    method: str
    threads: int = field(default_factory=torch.get_num_threads)
    round_medians_ms: list[float] = field(default_factory=list)
    timed_s: float = 0.0  # wall time inside the timed blocks
    cpu_s: float | None = None  # process CPU time (all threads) inside them; None on GPU
    precision: float | None = None  # the target, as a fraction

    @property
    def stats(self) -> Stats:
        return Stats.of(self.samples_ms)

    @property
    def cpu_util(self) -> float | None:
        """Process CPU time / (wall time x threads) over the timed blocks: near 1 when every
        thread had a core of its own, lower when others took them (or the op is serial)."""
        if self.cpu_s is None or self.timed_s <= 0:
            return None
        return self.cpu_s / (self.timed_s * self.threads)

    def summary(self) -> TimingSummary:
        """What the samples say, typed: the row's timing columns come from it (``columns``)."""
        return TimingSummary(
            **sample_figures(self.samples_ms), number=self.number, warmup_calls=self.warmup_calls, timer=self.method,
            samples_ms=tuple(self.samples_ms), round_medians_ms=tuple(self.round_medians_ms),
            rounds=len(self.round_medians_ms), timed_s=self.timed_s, cpu_util=self.cpu_util, threads=self.threads)


@dataclass(frozen=True)
class TimingSummary:
    """One cell's timing as its row gives it, typed (in the spirit of torch.utils.benchmark's
    ``Measurement``): the statistics of its samples, how precise the median is, how it was timed.
    ``columns()`` is the one place these become row columns."""
    median_ms: float
    iqr_ms: float
    min_ms: float
    mean_ms: float
    q1_ms: float
    q3_ms: float
    samples: int
    rel_iqr: float
    ci_halfwidth: float | None  # None: too few samples for a 95% interval of the median (few_samples)
    noisy: bool
    few_samples: bool
    median_confidence: float
    ci_lo_ms: float | None
    ci_hi_ms: float | None
    number: int  # calls per sample
    warmup_calls: int
    timer: str
    samples_ms: tuple[float, ...]
    round_medians_ms: tuple[float, ...]
    rounds: int
    timed_s: float
    cpu_util: float | None
    threads: int  # not a column here: the row's threads are the settings' (contention's verdict reads it)

    def columns(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "threads"}
        out["samples_ms"], out["round_medians_ms"] = list(self.samples_ms), list(self.round_medians_ms)
        return out


def timed_call(case: Case, fn: Callable, q, k, v, grad_out=None) -> Callable[[], object]:
    """The call to time for the case's direction.

    fwd: the forward.  bwd: the forward runs once here, outside the timed region; the timed
    call is the backward through the retained graph (torch.autograd.grad returns fresh
    gradients, so none accumulate between repetitions).  fwd+bwd: both, as one call.
    """
    return direction_call(case.direction, lambda: fn(q, k, v), (q, k, v), grad_out)


def direction_call(direction: str, forward: Callable, leaves, grad_out, allow_unused: bool = False) -> Callable:
    """``forward`` as the call a direction times: itself (fwd); the gradients of ``leaves`` from
    ``grad_out`` through a graph built once, here (bwd); or both in each call (fwd+bwd).  A layer's
    parts and whole (bench.scopes.layer_run) are timed through it too, their weights among the leaves."""
    if direction == "fwd":
        return forward
    if direction == "bwd":
        out = forward()
        return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True, allow_unused=allow_unused)
    return lambda: torch.autograd.grad(forward(), leaves, grad_out, allow_unused=allow_unused)


class CpuTimer:
    """Adaptive CPU timing of one callable, one round at a time (see the module doc)."""

    def __init__(self, call: Callable, precision: float = DEFAULT_PRECISION, min_block_ms: float = MIN_BLOCK_MS,
                 sync: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time, max_samples: int = MAX_CPU_SAMPLES,
                 keep_outputs: bool = False):
        self.call, self.precision, self.min_block_ms = call, precision, min_block_ms
        # keep_outputs: the output of the first block's last call and of the latest block's (a determinism
        # check from calls the timing makes anyway); each is kept past the block's clock, so no free moves in
        self.keep_outputs, self.first_out, self.last_out = keep_outputs, None, None
        self.sync, self.clock, self.cpu_clock, self.max_samples = sync, clock, cpu_clock, max_samples
        self.rounds: list[list[float]] = []
        self.number = 1
        self.warmup_calls = 0
        self.warm = False
        self.timed_s = 0.0
        self.cpu_s = 0.0
        self._sorted: list[float] = []  # every sample so far, kept sorted for the stopping rule

    @property
    def samples(self) -> list[float]:
        return [x for r in self.rounds for x in r]

    def _keep(self, mine: list[float], *xs: float) -> None:
        for x in xs:
            mine.append(x)
            bisect.insort(self._sorted, x)

    def _block(self) -> float:
        """One timed block of ``number`` calls; returns ms per call."""
        number, call, clock = self.number, self.call, self.clock
        out = None
        c0 = self.cpu_clock()
        t0 = clock()
        if self.keep_outputs:
            for _ in range(number):
                out = call()
        else:
            for _ in range(number):
                call()
        self.sync()
        t1 = clock()
        self.cpu_s += self.cpu_clock() - c0
        self.timed_s += t1 - t0
        if self.keep_outputs:
            if self.first_out is None:
                self.first_out = out
            else:
                self.last_out = out
        return (t1 - t0) * 1e3 / number

    def precise(self) -> bool:
        return ci_halfwidth(self._sorted, presorted=True) <= self.precision

    def run_round(self, budget_ms: float, min_samples: int = 1, floor: int = 1,
                  ceiling_ms: float | None = None) -> None:
        """Samples until the pooled 95% CI of the median is within +-precision (and this
        round has ``min_samples``), or ``budget_ms`` is spent and the round has ``floor``
        samples (with one at least), or ``ceiling_ms`` is spent whatever it has."""
        start = self.clock()
        mine: list[float] = []
        self.rounds.append(mine)
        prev = None
        gc_was = gc.isenabled()
        gc.disable()
        try:
            while len(self._sorted) < self.max_samples:
                est = self._block()
                if not self.warm:
                    self.warmup_calls += self.number
                    if est * self.number < self.min_block_ms / 2:  # too short to compare yet
                        self.number = max(1, math.ceil(self.min_block_ms / max(est, 1e-6)))
                        prev = None
                        continue
                    if prev is not None and abs(est - prev) <= WARMUP_AGREE * max(est, prev):
                        self.warm = True  # both agreeing blocks were warm: keep them
                        self.warmup_calls -= 2 * self.number
                        self._keep(mine, prev, est)
                    else:
                        prev = est
                        if (self.clock() - start) * 1e3 < budget_ms / 2:
                            continue
                        self.warm = True  # never agreed within half the budget: take it as it is
                        self._keep(mine, est)
                        self.warmup_calls -= self.number
                else:
                    self._keep(mine, est)
                spent = (self.clock() - start) * 1e3
                if len(mine) >= min_samples and self.precise():
                    break
                if spent >= budget_ms and (len(mine) >= floor or (ceiling_ms is not None and spent >= ceiling_ms)):
                    break
        finally:
            if gc_was:
                gc.enable()

    def result(self) -> Timing:
        rounds = [r for r in self.rounds if r]
        return Timing(self.samples, self.number, self.warmup_calls, "cpu-perf_counter",
                      round_medians_ms=[Stats.of(r).median for r in rounds], timed_s=self.timed_s,
                      cpu_s=self.cpu_s, precision=self.precision)


class CudaTimer:
    """CUDA events around each repetition, the L2 flushed before each one; counts derive from
    a 5-call estimate taken in the first round."""

    def __init__(self, call: Callable, warmup_ms: float = 25.0, min_samples: int = 10, max_samples: int = 10_000):
        self.call, self.warmup_ms = call, warmup_ms
        self.min_samples, self.max_samples = min_samples, max_samples
        self.rounds: list[list[float]] = []
        self.est = None
        self.warmup_calls = 0
        self.timed_s = 0.0
        self.flushes = 0  # L2 flushes made (the energy of a turn leaves them out)

    def _estimate(self, cache) -> None:
        self.call()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            cache.zero_()
            self.call()
        end.record()
        torch.cuda.synchronize()
        self.est = max(start.elapsed_time(end) / 5, 1e-4)
        self.flushes += 5
        n_warmup = max(1, int(self.warmup_ms / self.est))
        for _ in range(n_warmup):
            self.call()
        self.warmup_calls = n_warmup + 6

    def run_round(self, budget_ms: float, min_samples: int | None = None) -> None:
        cache = flush_buffer()
        if self.est is None:
            self._estimate(cache)
        floor = max(self.min_samples, min_samples or 0)
        n_rep = min(self.max_samples, max(floor, int(budget_ms / self.est)))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            cache.zero_()
            starts[i].record()
            self.call()
            ends[i].record()
        torch.cuda.synchronize()
        self.flushes += n_rep
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        self.timed_s += sum(samples) / 1e3
        self.rounds.append(samples)

    def result(self) -> Timing:
        return Timing([x for r in self.rounds for x in r], 1, self.warmup_calls, "cuda-events+l2-flush",
                      round_medians_ms=[Stats.of(r).median for r in self.rounds if r], timed_s=self.timed_s)


class GraphTimer:
    """CUDA-graph timing (``--timer graph``, and the cross-check of cells under GRAPH_CHECK_MS):
    the call is captured once into a CUDA graph, and each sample is the mean of REPLAYS replays
    between two events.  No launch overhead and no L2 flush: what the kernels themselves take
    back to back, the figure to hold a sub-0.1 ms event time against.

    ``make_call()`` builds the call to capture, and it is built on the capturing stream: a
    ``bwd`` call runs its forward there, and autograd replays each backward op on the stream
    of its forward op, so the backward is captured on the stream that captures it (a forward
    run on the default stream would make capture fail: PyTorch issue 15623).  The warm-up runs
    on that same side stream, as capture requires.  ``cuda`` is ``torch.cuda`` (a stand-in in
    the CPU tests)."""

    REPLAYS = 20

    def __init__(self, make_call: Callable[[], Callable], min_samples: int = 10, max_samples: int = 2_000,
                 cuda=None):
        self.make_call, self.min_samples, self.max_samples = make_call, min_samples, max_samples
        self.cuda = cuda if cuda is not None else torch.cuda
        self.rounds: list[list[float]] = []
        self.graph = None
        self.est = None
        self.warmup_calls = 0
        self.timed_s = 0.0

    def _capture(self) -> None:
        cuda = self.cuda
        stream = cuda.Stream()
        stream.wait_stream(cuda.current_stream())
        with cuda.stream(stream):  # the call built and warmed on the side stream that captures it
            call = self.make_call()
            for _ in range(3):
                call()
        stream.synchronize()
        self.graph = cuda.CUDAGraph()
        with cuda.graph(self.graph, stream=stream):
            call()
        self.graph.replay()
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        cuda.synchronize()
        self.est = max(start.elapsed_time(end), 1e-4)
        self.warmup_calls = 5

    def run_round(self, budget_ms: float, min_samples: int | None = None) -> None:
        if self.graph is None:
            self._capture()
        floor = max(self.min_samples, min_samples or 0)
        n = min(self.max_samples, max(floor, int(budget_ms / (self.est * self.REPLAYS))))
        events = [(self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            start.record()
            for _ in range(self.REPLAYS):
                self.graph.replay()
            end.record()
        self.cuda.synchronize()
        samples = [s.elapsed_time(e) / self.REPLAYS for s, e in events]
        self.timed_s += sum(samples) * self.REPLAYS / 1e3
        self.rounds.append(samples)

    def result(self) -> Timing:
        return Timing([x for r in self.rounds for x in r], self.REPLAYS, self.warmup_calls, "cuda-graph",
                      round_medians_ms=[Stats.of(r).median for r in self.rounds if r], timed_s=self.timed_s)

    @property
    def number(self) -> int:
        return self.REPLAYS


def release(timer) -> None:
    """Drop what a timer holds to call its cell again (its call, with a backward's retained graph; a
    CUDA graph and what builds it); its samples stay, and so does its result."""
    for name in ("call", "graph", "make_call"):
        if hasattr(timer, name):
            setattr(timer, name, None)


GRAPH_CHECK_MS = 0.1  # a CUDA cell whose event median is below this is timed again as a graph
AGREE = 0.10  # event time, graph time and the profiler's kernel sum agree within 10%, or the cell is flagged


def timer_disagreement(event_ms: float | None, graph_ms: float | None, kernel_ms: float | None,
                       tol: float = AGREE) -> str:
    """'' when the figures a cell has agree within ``tol`` of the event time; else which pair
    does not, with the figures (the row's ``timer_mismatch``)."""
    if not event_ms:
        return ""
    out = []
    for name, other in (("CUDA-graph time", graph_ms), ("profiler kernel sum", kernel_ms)):
        if other and abs(other / event_ms - 1) > tol:
            out.append(f"{name} {other:.4g} ms is {other / event_ms:.2f}x the event time {event_ms:.4g} ms")
    return "; ".join(out)


_FLUSH: list = []


def flush_buffer():
    """The 256 MiB L2-flush buffer, allocated once and kept until ``release_flush_buffer``."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda"))
    return _FLUSH[0]


def release_flush_buffer() -> None:
    _FLUSH.clear()


def make_timer(device: str, call: Callable | None, budget_ms: float, precision: float = DEFAULT_PRECISION,
               kind: str = "events", make_call: Callable[[], Callable] | None = None, keep_outputs: bool = False):
    """The timer of a cell: CUDA events (``kind`` "events") or a CUDA graph ("graph") on a
    GPU, the adaptive perf_counter timer on the CPU.  A graph is captured from
    ``make_call()`` (the call built on its capturing stream; see GraphTimer).  ``keep_outputs``:
    the CPU timer keeps its first and latest calls' outputs (``CpuTimer``)."""
    if device == "cuda":
        if kind == "graph":
            return GraphTimer(make_call if make_call is not None else (lambda: call))
        return CudaTimer(call, warmup_ms=min(25.0, budget_ms / 4))
    return CpuTimer(call, precision=precision, keep_outputs=keep_outputs)


def interleave(timers: dict, rounds: int, budget_ms: float, enter=None, on_error=None,
               ceiling_ms: float | None = None, of_rounds: int | None = None) -> None:
    """Run ``timers`` (name -> timer) round-robin: every timer takes its turn in round 1,
    then in round 2, and so on.  Each turn gets ``budget_ms / rounds``; a CPU timer's turn
    goes on past it, up to ``ceiling_ms / rounds``, until the rounds together hold the
    INTERVAL_SAMPLES a 95% interval of the median needs.  ``enter(name)`` gives a context
    manager held around a turn (a variant's scope); ``on_error(name, exc)`` takes a timer
    that raised out of later rounds instead of stopping the others.  ``of_rounds``: the rounds
    the budget, the ceiling and the samples are split over, when only some of them run here (a
    later visit, bench.engine.visits, runs one round of a cell's ``rounds``)."""
    import contextlib

    live = dict(timers)
    split = max(1, of_rounds or rounds)
    per_round = budget_ms / split
    floor = math.ceil(INTERVAL_SAMPLES / split)
    ceiling = None if ceiling_ms is None else max(per_round, ceiling_ms / split)
    for _ in range(rounds):
        for name in list(live):
            try:
                with (enter(name) if enter else contextlib.nullcontext()):
                    timer = live[name]
                    if isinstance(timer, CpuTimer):
                        timer.run_round(per_round, min_samples=MIN_ROUND_SAMPLES, floor=floor, ceiling_ms=ceiling)
                    else:
                        timer.run_round(per_round, min_samples=MIN_ROUND_SAMPLES)
            except Exception as exc:
                if on_error is None:
                    raise
                del live[name]
                on_error(name, exc)
