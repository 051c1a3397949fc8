"""The cells of one case, executed inside the worker: setup and reference check per
variant, then timing of every variant that passed in interleaved rounds (A B C A B C ...),
then the steps after the timing that the core and the features declare (bench.measure.cellsteps).
What a feature keeps in the worker across cells (``worker_keeps()``) is declared the same way.
A worker's other jobs live with their features: a later visit to a case (``--visits``,
bench.engine.revisit.visit_group), the re-timing in place of contended cases
(bench.features.contention.retime.Held) and the profiled pass (bench.features.profile.profiler.profile_group).

Every path ends in a row with a status and a reason; nothing here raises.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bench.engine import spans
from bench.engine.ranked import run_ranked
from bench.engine.result import CellResult
from bench.errors import first_line
from bench.measure.bound import BoundVariant, bind_variant
from bench.measure.cellsteps import Keep, Step, Timed, kept_calls
from bench.measure.cellsteps import free_device_memory as _free
from bench.measure.correctness import reference, same_bits
from bench.measure.settings import MeasureSettings
from bench.measure.timing import interleave, make_timer, release_flush_buffer
from bench.model import scope
from bench.model.case import Case
from bench.model.features import declared
from bench.model.registry import Variant, compile_dynamic, probe_reason
from bench.model.row import ReasonKind, Status

__all__ = ["REFERENCE", "ReferenceCache", "WorkerTainted", "after_timing", "builds_per_turn", "cuda_broken", "nowhere",
           "run_group", "timed_span"]


def cuda_broken() -> bool:
    """True when the CUDA context is unusable (a sticky error such as an illegal address):
    the worker must not take another cell."""
    if not torch.cuda.is_initialized() or not torch.cuda.is_available():  # a CPU worker asks CUDA nothing
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


class ReferenceCache:
    """The float64 reference of the last case: every variant of a case is checked against
    one reference computation."""

    def __init__(self):
        self._key = None
        self._value = None

    def get(self, case: Case, q, k, v, grad_out):
        key = (case.replace(direction="fwd"), grad_out is not None)
        if self._key != key:
            self._key, self._value = None, None
            self._value = reference(case, q, k, v, grad_out)
            self._key = key
        return self._value


def _extra(info: dict) -> dict:
    """Prepared.info as the row's ``extra`` (a variant's figures, in their own namespace); a
    value that cannot be sent to the sweep is an error that names its key."""
    import pickle

    for key, value in info.items():
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise TypeError(f"Prepared.info[{key!r}] cannot be sent to the sweep ({type(exc).__name__}: "
                            f"{first_line(exc)}); report plain numbers or strings") from None
    return dict(info)


@dataclass
class _Live:
    """A variant that passed its check and waits for its timing."""
    variant: Variant
    bound: BoundVariant | None
    result: CellResult
    call: Callable = None
    timer: object = None
    parts: dict = field(default_factory=dict)  # a layer's parts: part -> its timer
    checked: tuple | None = None  # on the CPU: the checked call's outputs, held against the timer's own calls


def nowhere(name: str) -> None:
    pass


REFERENCE = "(reference)"  # what ``at`` names while the float64 reference is computed: its own step


class WorkerTainted(Exception):
    """A variant left threads or processes running after its turn: its row says so, and the
    worker must not time anything else (the sweep starts a fresh one for the rest)."""


# cuBLAS runs deterministically only with a fixed workspace, set before its first handle: without it, a
# matmul under torch.use_deterministic_algorithms(True) raises on CUDA (naive, sdpa.math, chunked.online and
# the approximations would all be `error`)
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def timed_span(timers: dict, prefix: str = "") -> dict:
    """The timers' timed samples, as a span inside the rounds (bench.engine.spans)."""
    return {prefix + "timed samples": (sum(getattr(t, "timed_s", 0.0) for t in timers.values()), len(timers))}


def deterministic_env(deterministic: bool) -> dict:
    """The worker's environment for --deterministic (a value the user set is kept)."""
    return dict(DETERMINISTIC_ENV) if deterministic else {}


def run_group(variants: list[Variant], case: Case, settings: MeasureSettings, emit: Callable[[dict], None],
              cache: ReferenceCache | None = None, at: Callable[[str], None] = nowhere,
              skip_reference: str = "", kept: dict | None = None) -> None:
    """Measure ``variants`` on ``case``; ``emit(row)`` for each as soon as its row is final
    (failures at once, timed rows after the rounds).  ``at(name)`` is called whenever a
    variant's own code is about to run, so that a crash or a hang is put on the right one;
    the float64 reference is a step of its own before them (``at(REFERENCE)``: its own
    deadline in the sweep, and no variant's).  With ``skip_reference`` (the reason it could
    not be computed) or when it raises here, the variants are timed unchecked: their rows
    say ``reference_skipped`` with the reason.  ``kept``: what the worker's features keep across its
    cells, by name (bench.measure.cellsteps's ``Keep``; ``worker_keeps()`` makes them).  A variant
    that a kept object's ``on_setup`` finds has left work behind in the worker (bench.features.contention.leftovers)
    is an ``error`` with what it left, and WorkerTainted is raised before any other variant runs
    beside it; after the case, each ``on_case`` sees how its timing went (a contended case kept set
    up and timed again: bench.features.contention.retime)."""
    cache, kept = cache or ReferenceCache(), kept or {}
    deterministic = bool(getattr(settings, "deterministic", False))  # --deterministic
    os.environ.update({k: v for k, v in deterministic_env(deterministic).items() if k not in os.environ})
    torch.use_deterministic_algorithms(deterministic)
    compile_dynamic(bool(getattr(settings, "dynamic", False)))  # --dynamic
    if settings.threads is None:  # the rows record the threads the cells ran with
        settings = settings.replace(threads=torch.get_num_threads())
    try:
        where = scope.of(case)  # its shared inputs and reference, its binding and check (bench.model.scope)
        with spans.span("inputs"):
            inputs = where.inputs(case)  # None: each binding makes its own (a layer: its inputs and weights)
        if not skip_reference and inputs is not None:
            at(REFERENCE)
            try:
                with spans.span("float64 reference"):
                    where.reference(case, inputs, cache)
            except Exception as exc:  # out of memory, say: the cells are still timed, unchecked
                skip_reference = f"the reference raised {type(exc).__name__}: {first_line(exc)}"[:300]
        sharded = [v for v in variants if v.shard]  # context-parallel: measured by their ranks
        if sharded:
            run_ranked(sharded, case, settings, emit, at, cache, inputs, skip_reference)
        live = []
        for var in (v for v in variants if not v.shard):
            at(var.name)
            item = _setup_and_check(var, case, settings, cache, inputs, skip_reference)
            with spans.span("leftover-thread check"):
                left = "; ".join(x for check in kept_calls(kept, "on_setup") if (x := check()))
            if left:
                item.result.decide(Status.ERROR, f"the variant left work running after its setup and check: {left} "
                                                 f"(raised in variant code, {var.source or var.module}); the worker "
                                                 f"was restarted and no other cell was timed beside it")
                emit(item.result.row())
                raise WorkerTainted(f"{var.name} left {left}")
            if item.result.status is not None:
                emit(item.result.row())
            else:
                live.append(item)
        if live:
            quiet = _time_all(live, case, settings, emit, at, kept)
            for after in kept_calls(kept, "on_case"):
                after(case, settings, live, quiet, emit, at)
    finally:
        with spans.span("memory freed after a case"):
            release_flush_buffer()
            _free(case.device)


def _setup_and_check(var, case, settings, cache, inputs, skip_reference: str = "") -> _Live:
    result = CellResult(var.name, case, settings, approximate=var.approximate)
    try:
        why = probe_reason(var, case)  # the library's own refusal, here in the worker
        if why:
            return _Live(var, None, result.decide(Status.UNSUPPORTED, why, ReasonKind.LIBRARY))
        with spans.span(f"setup ({var.name})"):
            bound = bind_variant(var, case, inputs)
        result.setup_ms = bound.setup_ms
        result.extra = _extra(bound.prepared.info)
        checked = scope.of(case).check(bound, case, result, inputs, cache, skip_reference, spans.span)
        return _Live(var, bound, result, checked=checked)
    except Exception as exc:  # every failure becomes the result's status
        return _Live(var, None, result.fail(exc))


def _owner(key) -> str:
    """The variant a timer belongs to: its own name, or (name, part) for a layer's part."""
    return key[0] if isinstance(key, tuple) else key


def builds_per_turn(case: Case, variants: int, settings: MeasureSettings) -> bool:
    """Whether each variant's turn builds its own forward (a backward beside other variants: one
    graph alive at a time), which a held case cannot keep."""
    return case.direction == "bwd" and variants > 1 and settings.timer != "graph"


def _time_all(live: list[_Live], case: Case, settings: MeasureSettings, emit, at, kept: dict) -> bool:
    """Time ``live`` together in interleaved rounds, each step's watch around them (after_timing),
    and emit their rows; whether none of them was contended."""
    by_name = {item.variant.name: item for item in live}
    # a bwd call holds its forward's graph; built at each variant's turn and dropped after it, so
    # one variant's graph is alive at a time, not every variant's of the case (a later one's oom)
    per_turn = builds_per_turn(case, len(live), settings)
    # (a graph keeps its call; a layer's parts hold their graphs beside the whole's)
    watched = {s.name: w for s in after_timing() if s.watch and (w := s.watch(case, settings)) is not None}
    enter = _turns(by_name, per_turn, [w.turn for w in watched.values() if hasattr(w, "turn")], at)
    failed = set()

    def on_error(key, exc):
        name = _owner(key)
        if name not in failed:  # the whole's or any part's timer: the cell fails once
            failed.add(name)
            emit(by_name[name].result.fail(exc, "timing" if key == name else f"timing its part {key[1]}").row())

    for item in live:
        try:
            at(item.variant.name)
            _make_timers(item, case, settings, per_turn)
        except Exception as exc:
            on_error(item.variant.name, exc)
    timers = {}
    for item in live:
        if item.result.status is None:
            timers[item.variant.name] = item.timer
            timers |= {(item.variant.name, part): t for part, t in item.parts.items()}
    together = uuid.uuid4().hex[:12]  # the rows timed in these rounds: their round medians pair by index
    for watch in watched.values():
        watch.start()
    with spans.span("timing rounds: warm-up, calibration, between samples"):
        interleave(timers, settings.rounds, settings.budget_ms, enter=enter, on_error=on_error,
                   ceiling_ms=getattr(settings, "ceiling_ms", None))
        spans.absorb(timed_span(timers))
    for watch in watched.values():
        watch.stop()
    release_flush_buffer()
    for item in live:
        if item.result.status is None and item.variant.name not in failed:  # not failed in the rounds
            _finish(item, case, settings, together, watched, at, kept)
            emit(item.result.row())
    return not any(item.result.contention.get("contended") for item in live)


def _turns(by_name: dict, per_turn: bool, watches: list, at):
    """What surrounds each turn of the rounds (``interleave``'s ``enter``): the variant's scope;
    for a whole call (not a layer's part) its forward built here when each turn builds its own,
    and the steps' watches of a turn (on a GPU, the clocks, power and energy sampled around it)."""
    @contextlib.contextmanager
    def enter(key):
        name = _owner(key)
        at(name)
        item = by_name[name]
        if key != name:  # a layer's part: its turn in the same rounds, nothing watched around it
            part = item.parts[key[1]]
            with item.bound.scope():
                if per_turn:  # its graph built here, outside the timed turn, and dropped after it
                    part.call = item.bound.part_calls(only=key[1])[key[1]]
                try:
                    yield
                finally:
                    if per_turn:
                        part.call = None
            return
        with item.bound.scope():
            if per_turn:
                item.timer.call = item.bound.timed()  # the forward runs here, outside the timed turn
            try:
                if not watches:  # on the CPU: nothing around a turn
                    yield
                else:
                    with contextlib.ExitStack() as stack:
                        for turn in watches:
                            stack.enter_context(turn(name, item.timer))
                        yield
            finally:
                if per_turn:
                    item.timer.call = None  # its graph goes with it

    return enter


def _make_timers(item: _Live, case: Case, settings: MeasureSettings, per_turn: bool) -> None:
    """``item``'s timer, and a layer's parts' timers for the same rounds; a call built now unless
    each turn builds its own (a backward's forward, or a CUDA graph captured on its own stream)."""
    graph = case.device == "cuda" and settings.timer == "graph"
    if not per_turn and not graph:
        with item.bound.scope():
            item.call = item.bound.timed()
    item.timer = make_timer(case.device, item.call, settings.budget_ms, settings.precision, settings.timer,
                            make_call=item.bound.timed, keep_outputs=item.checked is not None)
    parts = scope.of(case).parts(case)  # a layer's, say: each a timer of its own in the whole's rounds
    if parts and graph:  # each part built when its graph is captured, on the capturing stream, as the whole
        # is (a backward's forward run there: PyTorch issue 15623)
        item.parts = {part: make_timer(case.device, None, settings.budget_ms, settings.precision, settings.timer,
                                       make_call=lambda p=part: item.bound.part_calls(only=p)[p])
                      for part in parts}
    elif parts and per_turn:  # each part's call built at its turn (_turns), as the whole's is
        item.parts = {part: make_timer(case.device, None, settings.budget_ms, settings.precision, settings.timer)
                      for part in parts}
    elif parts:  # each part, a timer of its own in the same rounds
        with item.bound.scope():
            item.parts = {part: make_timer(case.device, call, settings.budget_ms, settings.precision,
                                           settings.timer, make_call=lambda c=call: c)
                          for part, call in item.bound.part_calls().items()}
    if per_turn:
        item.result.bwd_forward = "per turn"


def _determinism(t: Timed) -> None:
    """The timer's first and latest calls against the checked one (on the CPU)."""
    item = t.item
    same, diff = same_bits(t.case, item.checked, (item.timer.first_out, item.timer.last_out))
    t.result.deterministic, t.result.nondeterminism = same, None if same else diff
    item.checked = item.timer.first_out = item.timer.last_out = None


DETERMINISM = Step("determinism", 10, lambda t: t.item.checked is not None, _determinism)


@functools.cache
def after_timing() -> tuple[Step, ...]:
    """The steps of a timed cell's life after its timing: the core's and each feature's, as
    bench/model/features.py declares them (``module:NAME``), in their ``order``
    (bench.measure.cellsteps has the protocol)."""
    return tuple(sorted(declared("steps"), key=lambda step: step.order))


@functools.cache
def worker_keeps() -> tuple[Keep, ...]:
    """What the core and each feature keep in a worker across its cells, as bench/model/features.py
    declares them (``kept``: ``module:NAME`` of a ``Keep``), in the declarations' order."""
    return tuple(declared("kept"))


def _finish(item: _Live, case: Case, settings: MeasureSettings, together: str, watched: dict, at,
            kept: dict) -> None:
    """A timed cell's result: its timing, then each step of ``after_timing()`` that applies; a step
    that raises ends the cell there, with what it held before."""
    result = item.result
    during = "timing"
    try:
        at(item.variant.name)
        result.timing = item.timer.result().summary()
        result.interleave_id = together
        timed = Timed(item, case, settings, result.timing, watched, kept)
        for step in after_timing():
            if step.applies(timed):
                during = step.during(timed) if step.during else during
                with spans.span(step.name):
                    step.run(timed)
        result.decide(Status.OK)
    except Exception as exc:
        result.fail(exc, during)
