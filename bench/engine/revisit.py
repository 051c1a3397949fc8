"""The worker's side of ``--visits`` (bench.engine.visits): a later visit to a case, its variants
set up on fresh inputs in a fresh worker and timed again in one interleaved round of the first
visit's, with no reference, check, determinism or memory pass.  Apart from bench.engine.visits,
which the sweep and the command line read without torch."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

import torch

from bench.engine import spans
from bench.engine.cell import nowhere, timed_span
from bench.errors import first_line
from bench.measure import cpuload
from bench.measure.bound import bind_variant
from bench.measure.cellsteps import free_device_memory
from bench.measure.settings import MeasureSettings
from bench.measure.timing import interleave, make_timer, release_flush_buffer
from bench.model import scope
from bench.model.case import Case
from bench.model.registry import Variant, compile_dynamic
from bench.model.row import Status

WARM_CALLS, WARM_S = 1, 0.0  # a later visit's calls before its timer's own warm-up: one, as a first visit's
# checked call warms its variant (the determinism check takes the timer's own calls)
FIRST_WARM_S = 0.1  # the first variant a fresh worker times: its threads start and its heap grows
# (tests/benchmarks/quick_preset.py's visits column: a visit's first case against its first visit)
_WARMED: list = []  # this worker process has warmed up once (a later visit's worker is a fresh process)


def visit_group(variants: list[Variant], case: Case, settings: MeasureSettings, emit: Callable[[dict], None],
                 at: Callable[[str], None] = nowhere) -> None:
    """A later visit to a case (``--visits``): ``variants`` (each measured ok at the first visit)
    set up on fresh inputs and timed again in one interleaved round of the first visit's (its
    share of the budget, the ceiling and the samples), with no reference, check, determinism or
    memory pass.  ``emit`` gets one
    visit row per variant: its samples, their median, the load around them, or why it failed."""
    if settings.threads is None:
        settings = settings.replace(threads=torch.get_num_threads())
    compile_dynamic(bool(getattr(settings, "dynamic", False)))
    rounds = max(1, settings.rounds)
    timers, rows = {}, {}
    try:
        with spans.span("visit: inputs"):
            inputs = scope.of(case).inputs(case)  # None: each binding makes its own (a layer)
        for var in variants:
            rows[var.name] = row = {"variant": var.name, **case.to_dict(), "status": Status.OK.value,
                                    "pid": os.getpid()}  # the process of this visit
            try:
                at(var.name)
                timers[var.name] = _visit_timer(var, case, inputs, settings, rounds)
            except Exception as exc:
                row.update(status=Status.ERROR.value, reason=f"{type(exc).__name__}: {first_line(exc)}"[:300])

        @contextlib.contextmanager
        def enter(name):
            at(name)
            with timers[name][0].scope():
                yield

        def on_error(name, exc):
            rows[name].update(status=Status.ERROR.value, reason=f"{type(exc).__name__}: {first_line(exc)}"[:300])

        window = cpuload.LoadWindow().start()
        ceiling = getattr(settings, "ceiling_ms", None)
        with spans.span("visit: timing round, less its samples"):
            interleave({n: t for n, (_, t) in timers.items()}, 1, settings.budget_ms, enter=enter, on_error=on_error,
                       ceiling_ms=ceiling, of_rounds=rounds)  # one round of the first visit's: its share of everything
            spans.absorb(timed_span({n: t for n, (_, t) in timers.items()}, "visit: "))
        other_cpu = window.stop() if case.device == "cpu" else None
        for name, (_, timer) in timers.items():
            if rows[name]["status"] == Status.OK.value:
                rows[name].update(_visit_figures(timer.result(), case.device, other_cpu))
    except Exception as exc:  # the inputs themselves: every variant's visit fails with it
        for var in variants:
            rows.setdefault(var.name, {"variant": var.name, **case.to_dict()}).update(
                status=Status.ERROR.value, reason=f"{type(exc).__name__}: {first_line(exc)}"[:300])
    finally:
        timers.clear()
        with spans.span("memory freed after a case"):
            release_flush_buffer()
            free_device_memory(case.device)
    for row in rows.values():
        emit(row)


def _visit_timer(var: Variant, case: Case, inputs, settings: MeasureSettings, rounds: int):
    """A visit's variant set up on the case's inputs, warmed (longer in a worker's first visit),
    and its timer for one round of the first visit's: (the bound variant, the timer)."""
    with spans.span(f"visit: setup ({var.name})"):
        bound = bind_variant(var, case, inputs)
    with bound.scope(), spans.span("visit: warm-up"):
        start, calls, warm = time.perf_counter(), 0, bound.timed("fwd")
        warm_s = WARM_S if _WARMED else FIRST_WARM_S
        while calls < WARM_CALLS or time.perf_counter() - start < warm_s:
            warm()
            calls += 1
        _WARMED.append(True)
        call = bound.timed()
    return bound, make_timer(case.device, call, settings.budget_ms / rounds, settings.precision, settings.timer,
                             make_call=bound.timed)


def _visit_figures(t, device: str, other_cpu) -> dict:
    """A visit row's figures from its timing: its samples and median, and on the CPU the load
    around them; an error where no sample was taken."""
    if not t.samples_ms:
        return {"status": Status.ERROR.value, "reason": "no sample was taken"}
    summary = t.summary()
    out = dict(median_ms=summary.median_ms, samples=summary.samples, samples_ms=list(summary.samples_ms),
               timed_s=summary.timed_s, number=summary.number)
    if device == "cpu":
        out.update(cpuload.verdict(summary.cpu_util, other_cpu, summary.threads, summary.samples_ms))
    return out
