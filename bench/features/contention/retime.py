"""The worker's side of ``--remeasure`` (bench.features.contention.remeasure): contended cases kept set up in
the worker and timed again in place."""

from __future__ import annotations

import contextlib
import uuid

from bench.engine import spans
from bench.engine.cell import builds_per_turn, nowhere, timed_span
from bench.features.contention import contention
from bench.measure import cpuload
from bench.measure.cellsteps import Keep, free_device_memory
from bench.measure.settings import MeasureSettings
from bench.measure.timing import interleave, make_timer
from bench.model import scope
from bench.model.case import Case
from bench.model.row import Status

HOLD_CASES = 8  # contended cases a worker keeps set up for a re-timing; the oldest goes beyond


class Held:
    """Contended cases kept set up in the worker and timed again in place (``--remeasure``): once
    a later case's own timing was quiet, or when the sweep asks at the end of its pass.  A
    re-timing times only: the variants' calls on the inputs they were checked on, in the same
    interleaved rounds, budget and ceiling; no new inputs, reference, setup, check or memory pass.
    Each variant's row is sent again with its new timing and load verdict, and ``retimed`` saying
    why the first was contended (the newest row of a cell counts; the first stays in the file).
    Kept: CPU cases of the core scope; not a backward's several variants (each turn builds its own
    forward) nor a layer's parts."""

    def __init__(self, limit: int = HOLD_CASES):
        self.limit = limit
        self.cases: list = []  # (case, settings, the items timed ok), oldest first; beyond the limit the oldest goes

    def keep(self, case: Case, settings: MeasureSettings, live: list) -> None:
        ok = [i for i in live if i.result.status is Status.OK and i.bound is not None]
        if case.device != "cpu" or not scope.of(case).core_alone or not ok or builds_per_turn(case, len(ok), settings):
            return
        self.cases.append((case, settings, ok))
        del self.cases[:-self.limit]

    def on_case(self, case: Case, settings: MeasureSettings, live: list, quiet: bool, emit, at) -> None:
        """After a case (bench.measure.cellsteps's Keep protocol): kept when its timing was contended,
        else the held cases timed again now that the load has dropped (with ``--remeasure 0``, neither)."""
        if not getattr(settings, "retime", True):
            return
        if not quiet:
            self.keep(case, settings, live)
        elif self.cases:
            with spans.span("re-timing in place"):
                self.retime(emit, at)

    def on_flush(self, emit, at) -> None:
        """The sweep's end of its pass: every held case timed again."""
        with spans.span("re-timing in place"):
            self.retime(emit, at)

    def retime(self, emit, at=nowhere) -> None:
        """Time every held case again, oldest first, and let them go.  A re-timing that raises
        leaves the case's first rows as they are (the worker goes on)."""
        cases, self.cases = self.cases, []
        for case, settings, items in cases:
            try:
                _retime(case, settings, items, emit, at)
            except Exception:  # noqa: BLE001  (a second try at a timing: its first rows stand)
                pass
            finally:
                for item in items:
                    item.bound = item.call = item.timer = None
                free_device_memory(case.device)


def _retime(case: Case, settings: MeasureSettings, items: list, emit, at) -> None:
    by_name, timers, failed = {i.variant.name: i for i in items}, {}, set()
    for item in items:
        at(item.variant.name)
        with item.bound.scope():
            timers[item.variant.name] = make_timer(case.device, item.bound.timed(), settings.budget_ms,
                                                   settings.precision, settings.timer, make_call=item.bound.timed)

    @contextlib.contextmanager
    def enter(name):
        at(name)
        with by_name[name].bound.scope():
            yield

    window = cpuload.LoadWindow().start()
    interleave(timers, settings.rounds, settings.budget_ms, enter=enter, on_error=lambda name, exc: failed.add(name),
               ceiling_ms=getattr(settings, "ceiling_ms", None))
    spans.absorb(timed_span(timers))
    other_cpu = window.stop()
    together = uuid.uuid4().hex[:12]
    for name, timer in timers.items():
        if name in failed:  # its first row stands
            continue
        result = by_name[name].result
        timing = timer.result().summary()
        first = result.contention.get("contended_why")
        result.timing, result.interleave_id = timing, together
        result.contention = contention.verdict(timing.cpu_util, other_cpu, timing.threads, timing.samples_ms)
        result.retimed = (f"in place; its first timing: {first}" if first else
                          "in place, with its case (another variant's first timing was contended)")[:300]
        emit(result.row())


KEEP = Keep("held", lambda device_name: Held())  # contended cases, in each worker
