"""The cells of one case, executed inside the worker: setup and reference check per
variant, then timing of every variant that passed in interleaved rounds (A B C A B C ...),
then each one's memory pass.  ``retime_group`` is a later visit to a case (``--visits``): its
variants timed again, one interleaved round, in another worker, and nothing else.
``profile_group`` is the profiled pass of ``sweep --profile``, which the sweep runs after every
cell is timed, so that the profiler cannot touch a timing.

Every path ends in a row with a status and a reason; nothing here raises.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from bench.engine import spans
from bench.engine.memcache import MemoryCache
from bench.engine.result import CellResult
from bench.errors import first_line
from bench.measure import contention, kernels, nvml
from bench.measure.bound import BoundVariant, bind_variant, case_inputs
from bench.measure.correctness import check_form, determinism, reference, run_and_check, same_bits
from bench.measure.layer import in_call_figures, layer_figures
from bench.measure.leftovers import Leftovers
from bench.measure.memory import peak_bytes
from bench.measure.settings import MeasureSettings
from bench.measure.steps import run_steps
from bench.measure.timing import (
    GRAPH_CHECK_MS,
    GraphTimer,
    interleave,
    make_timer,
    release_flush_buffer,
    timer_disagreement,
)
from bench.model.case import Case
from bench.model.registry import Variant, compile_dynamic, probe_reason
from bench.model.row import ReasonKind, Status

__all__ = ["REFERENCE", "ReferenceCache", "WorkerTainted", "cuda_broken", "profile_group", "retime_group", "run_group"]


_NVML: dict = {}  # this worker's NVML handle, its GPU's steady clock and power limit, and one L2 flush's energy


def _nvml():
    """NVML for this worker's GPU (opened once, by the UUID of the device PyTorch uses), or
    None without nvidia-ml-py or a driver."""
    if "handle" not in _NVML:
        handle = nvml.open_nvml(uuid=nvml.device_uuid())
        _NVML["handle"] = handle
        _NVML["device"] = nvml.device_info(handle) if handle else None
        _NVML["flush_mj"] = None
        if handle:
            from bench.measure.timing import flush_buffer

            cache = flush_buffer()
            _NVML["flush_mj"] = nvml.flush_energy_mj(handle, cache.zero_, torch.cuda.synchronize)
    return _NVML["handle"]


def _calls(timer) -> int:
    """Calls a timer has made so far, warm-up included (the energy of a turn is over all of them)."""
    return timer.warmup_calls + sum(len(r) for r in timer.rounds) * getattr(timer, "number", 1)


def _flushes(timer) -> int:
    """L2 flushes a timer has made so far (the CUDA-event timer flushes before each timed call)."""
    return getattr(timer, "flushes", 0)


def _gpu_sample(gpu):
    """An NVML sample after the queued work has finished (a turn's counters hold its kernels only)."""
    torch.cuda.synchronize()
    return nvml.sample(gpu)


def _free(device: str) -> None:
    """Return memory between cases.  Only CUDA needs a collection (cached blocks go back to
    the driver); on the CPU reference counting frees tensors, and a full collection over
    torch's heap costs ~100 ms a time."""
    if device == "cuda":
        gc.collect()
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # a sticky CUDA error: the row already has it; the worker restarts
            pass


def cuda_broken() -> bool:
    """True when the CUDA context is unusable (a sticky error such as an illegal address):
    the worker must not take another cell."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
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


def _nowhere(name: str) -> None:
    pass


IN_CALL_CALLS = 20  # GPU layer cells, forward: whole calls timed with events around each part (after the timing)
REFERENCE = "(reference)"  # what ``at`` names while the float64 reference is computed: its own step


class WorkerTainted(Exception):
    """A variant left threads or processes running after its turn: its row says so, and the
    worker must not time anything else (the sweep starts a fresh one for the rest)."""


# cuBLAS runs deterministically only with a fixed workspace, set before its first handle: without it, a
# matmul under torch.use_deterministic_algorithms(True) raises on CUDA (naive, sdpa.math, chunked.online and
# the approximations would all be `error`)
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def _timed_parts(timers: dict, prefix: str = "") -> dict:
    """The timers' timed samples, as a span inside the rounds (bench.engine.spans)."""
    return {prefix + "timed samples": (sum(getattr(t, "timed_s", 0.0) for t in timers.values()), len(timers))}


def deterministic_env(deterministic: bool) -> dict:
    """The worker's environment for --deterministic (a value the user set is kept)."""
    return dict(DETERMINISTIC_ENV) if deterministic else {}


def run_group(variants: list[Variant], case: Case, settings: MeasureSettings, emit: Callable[[dict], None],
              cache: ReferenceCache | None = None, at: Callable[[str], None] = _nowhere,
              skip_reference: str = "", leftovers: Leftovers | None = None, held: Held | None = None,
              memory: MemoryCache | None = None) -> None:
    """Measure ``variants`` on ``case``; ``emit(row)`` for each as soon as its row is final
    (failures at once, timed rows after the rounds).  ``at(name)`` is called whenever a
    variant's own code is about to run, so that a crash or a hang is put on the right one;
    the float64 reference is a step of its own before them (``at(REFERENCE)``: its own
    deadline in the sweep, and no variant's).  With ``skip_reference`` (the reason it could
    not be computed) or when it raises here, the variants are timed unchecked: their rows
    say ``reference_skipped`` with the reason.  With ``leftovers``, a variant that leaves busy
    threads or processes behind after its setup and check is an ``error`` with what it left, and
    WorkerTainted is raised before any other variant runs beside it.  With ``held``, a case whose
    timing was contended is kept set up, and timed again once a later case's was not (Held).  With
    ``memory``, a cell's memory peak comes from the machine's record of the same cell
    (bench.engine.memcache)."""
    cache = cache or ReferenceCache()
    deterministic = bool(getattr(settings, "deterministic", False))  # --deterministic
    os.environ.update({k: v for k, v in deterministic_env(deterministic).items() if k not in os.environ})
    torch.use_deterministic_algorithms(deterministic)
    compile_dynamic(bool(getattr(settings, "dynamic", False)))  # --dynamic
    if settings.threads is None:  # the rows record the threads the cells ran with
        settings = settings.replace(threads=torch.get_num_threads())
    try:
        layer = case.scope != "core"  # a layer: its own inputs and weights, its own float64 check (bench.measure.layer)
        with spans.span("inputs"):
            inputs = None if layer else case_inputs(case)
        if not skip_reference and not layer:
            at(REFERENCE)
            try:
                (q, k, v), grad_out = inputs
                with spans.span("float64 reference"):
                    cache.get(case, q, k, v, grad_out)
            except Exception as exc:  # out of memory, say: the cells are still timed, unchecked
                skip_reference = f"the reference raised {type(exc).__name__}: {first_line(exc)}"[:300]
        live = []
        for var in variants:
            at(var.name)
            item = _setup_and_check(var, case, settings, cache, inputs, skip_reference)
            with spans.span("leftover-thread check"):
                left = leftovers.check() if leftovers is not None else ""
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
            quiet = _time_all(live, case, settings, emit, at, memory)
            if held is not None:
                if not quiet:
                    held.keep(case, settings, live)
                elif held.cases:
                    with spans.span("re-timing in place"):
                        held.retime(emit, at)
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
        if case.scope != "core":
            return _check_layer(var, bound, result)
        if case.ragged or case.mixed:  # how the variant held the batch: packed, nested, padded or a dense mask
            result.layout = result.extra.pop("layout", "packed")
        (q, k, v), grad_out = inputs
        if skip_reference:  # timed unchecked: the output's form is still checked, its values cannot be
            result.reference_skipped = skip_reference
            with bound.scope(), spans.span("checked call"):
                check = check_form(case, bound.fn(q, k, v))
        else:
            with bound.scope(), spans.span("checked call against the reference"):
                check = run_and_check(case, bound.fn, q, k, v, grad_out, cache.get(case, q, k, v, grad_out),
                                      var.error_budget, var.approximate)
        result.checked(check)
        outputs = getattr(check, "outputs", None) if check.ok else None
        if outputs is not None and case.device == "cpu":  # the same bits? from the timer's own calls, after it
            return _Live(var, bound, result, checked=outputs)
        if outputs is not None:  # two more calls on its inputs: the same bits?
            with bound.scope(), spans.span("determinism: two more calls"):
                same, diff = determinism(case, bound.fn, q, k, v, grad_out, outputs)
            result.deterministic, result.nondeterminism = same, None if same else diff
        return _Live(var, bound, result)
    except Exception as exc:  # every failure becomes the result's status
        return _Live(var, None, result.fail(exc))


def _check_layer(var: Variant, bound, result: CellResult) -> _Live:
    """A layer cell's check: the whole against the float64 layer, then twice more for the same bits."""
    with bound.scope():
        check = bound.check(var.approximate)
    result.checked(check)
    if check.ok:
        with bound.scope():
            result.deterministic, result.nondeterminism = bound.determinism()
    return _Live(var, bound, result)


def _owner(key) -> str:
    """The variant a timer belongs to: its own name, or (name, part) for a layer's part."""
    return key[0] if isinstance(key, tuple) else key


def _per_turn(case: Case, variants: int, settings: MeasureSettings) -> bool:
    """Whether each variant's turn builds its own forward (a backward beside other variants: one
    graph alive at a time), which a held case cannot keep."""
    return case.direction == "bwd" and variants > 1 and settings.timer != "graph" and case.scope == "core"


def _time_all(live: list[_Live], case: Case, settings: MeasureSettings, emit, at,
              memory: MemoryCache | None = None) -> bool:
    """Time ``live`` together in interleaved rounds and emit their rows; whether none of them was
    contended."""
    by_name = {item.variant.name: item for item in live}
    # a bwd call holds its forward's graph; built at each variant's turn and dropped after it, so
    # one variant's graph is alive at a time, not every variant's of the case (a later one's oom)
    per_turn = _per_turn(case, len(live), settings)
    # (a graph keeps its call; a layer's parts hold their graphs beside the whole's)
    gpu = _nvml() if case.device == "cuda" else None  # clocks, power, energy around each turn
    states = {name: nvml.Cell() for name in by_name}

    enter = _turns(by_name, per_turn, gpu, states, at)
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
    window = contention.LoadWindow().start()
    with spans.span("timing rounds: warm-up, calibration, between samples"):
        interleave(timers, settings.rounds, settings.budget_ms, enter=enter, on_error=on_error,
                   ceiling_ms=getattr(settings, "ceiling_ms", None))
        spans.absorb(_timed_parts(timers))
    other_cpu = window.stop() if case.device == "cpu" else None
    release_flush_buffer()
    for item in live:
        if item.result.status is None and item.variant.name not in failed:  # not failed in the rounds
            _finish(item, case, settings, together, other_cpu, states[item.variant.name] if gpu else None, at,
                    memory)
            emit(item.result.row())
    return not any(item.result.contention.get("contended") for item in live)


def _turns(by_name: dict, per_turn: bool, gpu, states: dict, at):
    """What surrounds each turn of the rounds (``interleave``'s ``enter``): the variant's scope;
    for a whole call (not a layer's part) its forward built here when each turn builds its own,
    and on a GPU the clocks, power and energy sampled around it."""
    @contextlib.contextmanager
    def enter(key):
        name = _owner(key)
        at(name)
        item = by_name[name]
        if key != name:  # a layer's part: its turn in the same rounds, nothing sampled around it
            with item.bound.scope():
                yield
            return
        with item.bound.scope():
            if per_turn:
                item.timer.call = item.bound.timed()  # the forward runs here, outside the timed turn
            before = (_gpu_sample(gpu), _calls(item.timer), _flushes(item.timer), time.perf_counter()) if gpu \
                else None
            try:
                yield
            finally:
                if before:
                    end = _gpu_sample(gpu)
                    states[name].turn(before[0], end, _calls(item.timer) - before[1], _flushes(item.timer) - before[2],
                                      seconds=time.perf_counter() - before[3])
                if per_turn:
                    item.timer.call = None  # its graph goes with it

    return enter


HOLD_CASES = 8  # contended cases a worker keeps set up for a re-timing; the oldest goes beyond


def _make_timers(item: _Live, case: Case, settings: MeasureSettings, per_turn: bool) -> None:
    """``item``'s timer, and a layer's parts' timers for the same rounds; a call built now unless
    each turn builds its own (a backward's forward, or a CUDA graph captured on its own stream)."""
    graph = case.device == "cuda" and settings.timer == "graph"
    if not per_turn and not graph:
        with item.bound.scope():
            item.call = item.bound.timed()
    item.timer = make_timer(case.device, item.call, settings.budget_ms, settings.precision, settings.timer,
                            make_call=item.bound.timed, keep_outputs=item.checked is not None)
    if case.scope != "core":  # each part, a timer of its own in the same rounds
        with item.bound.scope():
            item.parts = {part: make_timer(case.device, call, settings.budget_ms, settings.precision,
                                           settings.timer, make_call=lambda c=call: c)
                          for part, call in item.bound.part_calls().items()}
    if per_turn:
        item.result.bwd_forward = "per turn"


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
        if case.device != "cpu" or case.scope != "core" or not ok or _per_turn(case, len(ok), settings):
            return
        self.cases.append((case, settings, ok))
        del self.cases[:-self.limit]

    def retime(self, emit, at=_nowhere) -> None:
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
                _free(case.device)


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

    window = contention.LoadWindow().start()
    interleave(timers, settings.rounds, settings.budget_ms, enter=enter, on_error=lambda name, exc: failed.add(name),
               ceiling_ms=getattr(settings, "ceiling_ms", None))
    spans.absorb(_timed_parts(timers))
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


@dataclass
class _Timed:
    """A timed cell as its steps after the timing see it: its item, its case and settings, its
    timing, the load and the GPU's state around its turns, the machine's memory record."""
    item: _Live
    case: Case
    settings: MeasureSettings
    timing: object  # TimingSummary
    other_cpu: float | None
    state: object  # nvml.Cell, on a GPU
    memory: MemoryCache | None

    @property
    def result(self) -> CellResult:
        return self.item.result


def _determinism(t: _Timed) -> None:
    """The timer's first and latest calls against the checked one (on the CPU)."""
    item = t.item
    with spans.span("determinism: the timer's calls compared"):
        same, diff = same_bits(t.case, item.checked, (item.timer.first_out, item.timer.last_out))
    t.result.deterministic, t.result.nondeterminism = same, None if same else diff
    item.checked = item.timer.first_out = item.timer.last_out = None


def _layer_parts(t: _Timed) -> None:
    """A layer's parts (``--scope``), and on a GPU, forward, the parts inside whole calls."""
    item, case, result = t.item, t.case, t.result
    result.layer = layer_figures(case, t.timing, {p: tm.result().summary() for p, tm in item.parts.items()})
    if case.device == "cuda" and case.direction == "fwd":
        try:
            with item.bound.scope():
                result.layer["in_call"] = in_call_figures(item.bound.in_call_parts(IN_CALL_CALLS))
        except Exception as exc:  # a check after the timing: the timing stays, the row says why
            result.layer["in_call_error"] = f"{type(exc).__name__}: {exc}"[:300]


def _contention(t: _Timed) -> None:
    """The CPU's verdict on the load around the cell's turns (bench.measure.contention)."""
    tm = t.timing
    t.result.contention = contention.verdict(tm.cpu_util, t.other_cpu, tm.threads, tm.samples_ms)


def _gpu_state(t: _Timed) -> None:
    """The GPU's clocks, power and energy around the cell's turns (NVML)."""
    t.result.gpu_state = t.state.columns(_NVML["device"], t.case.batch * t.case.q_len, _NVML["flush_mj"])


def _memory(t: _Timed) -> None:
    """The peak of the whole step, from the machine's record or a memory pass."""
    item, case, result = t.item, t.case, t.result
    item.call = None  # the retained graph of a bwd call goes before the memory pass
    item.parts = {}  # and a layer's parts' graphs
    with spans.span("memory freed after a case"):
        _free(case.device)
    key = t.memory.key(item.variant, case, t.settings.threads) if t.memory is not None else None
    cached = t.memory.get(key, getattr(t.settings, "peak_age_h", 0.0)) if key else None
    if cached is not None:
        result.peak_mem_bytes, result.peak_mem_cached = cached, True
        return
    with item.bound.scope(), spans.span("memory pass"):  # the whole step: forward and, with one, backward
        result.peak_mem_bytes = peak_bytes(case.device, item.bound.timed("fwd+bwd" if case.needs_grad else "fwd"))
    if key:
        t.memory.put(key, result.peak_mem_bytes)
        result.peak_mem_cached = False


def _gpu_checks(t: _Timed) -> None:
    """The kernels that ran, the backend they belong to, and a second timer (a CUDA graph)."""
    with spans.span("GPU checks (kernel names, graph)"):
        t.result.gpu_checks = gpu_check_columns(t.item.bound, t.timing.median_ms, t.settings)


def _steps(t: _Timed) -> None:
    """--steps: what a step costs beyond the kernel; the cell's timing stays when they fail."""
    try:
        t.result.extra.update(run_steps(t.item.variant, t.case, t.settings.steps))
    except Exception as exc:
        t.result.extra["steps_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]


@dataclass(frozen=True)
class Step:
    """One step of a timed cell's life after its timing: its name (bench.model.features names a
    feature's), when it applies, what it does, and what a failure in it names (None: the pass
    before it; a step that must not fail its cell, such as --steps, catches its own errors)."""
    name: str
    applies: Callable[[_Timed], bool]
    run: Callable[[_Timed], None]
    during: Callable[[_Timed], str] | None = None


AFTER_TIMING: tuple[Step, ...] = (
    Step("determinism", lambda t: t.item.checked is not None, _determinism),
    Step("layer parts", lambda t: bool(t.item.parts), _layer_parts),
    Step("contention", lambda t: t.case.device == "cpu", _contention),
    Step("gpu state", lambda t: t.state is not None, _gpu_state),
    Step("memory pass", lambda t: True, _memory,
         lambda t: f"memory pass (after a timing of median {t.timing.median_ms:.4g} ms, not kept)"),
    Step("gpu checks", lambda t: t.case.device == "cuda", _gpu_checks,
         lambda t: "kernel names (a profiled call after the timing)"),
    Step("steps", lambda t: bool(getattr(t.settings, "steps", 0)), _steps),
)


def _finish(item: _Live, case: Case, settings: MeasureSettings, together: str, other_cpu, state, at,
            memory: MemoryCache | None = None) -> None:
    """A timed cell's result: its timing, then each step of ``AFTER_TIMING`` that applies; a step
    that raises ends the cell there, with what it held before."""
    result = item.result
    during = "timing"
    try:
        at(item.variant.name)
        result.timing = item.timer.result().summary()
        result.interleave_id = together
        timed = _Timed(item, case, settings, result.timing, other_cpu, state, memory)
        for step in AFTER_TIMING:
            if step.applies(timed):
                during = step.during(timed) if step.during else during
                step.run(timed)
        result.decide(Status.OK)
    except Exception as exc:
        result.fail(exc, during)


def gpu_check_columns(bound: BoundVariant, median_ms: float, settings: MeasureSettings,
                names_of=kernels.names_of_one_call, graph_timer=GraphTimer) -> dict:
    """A GPU cell's kernel names and backend (a profiled call), and, under GRAPH_CHECK_MS with
    the event timer, its time as a CUDA graph: its columns keep every figure and flag a
    disagreement beyond AGREE between them (``timer_mismatch``).  Each check has its own
    ``try``: one that fails is recorded (``kernels_error``, ``graph_error``) and never takes
    the cell's timing with it."""
    names, kernel_ms, graph_ms, errors = [], None, None, {}
    with bound.scope():
        try:
            names, kernel_ms = names_of(bound.timed(), "cuda")
        except Exception as exc:
            errors["kernels_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]
        if settings.timer == "events" and median_ms < GRAPH_CHECK_MS:
            try:
                graph = graph_timer(bound.timed)  # a bwd call's forward runs on the capturing stream
                graph.run_round(min(settings.budget_ms, 50.0))
                graph_ms = graph.result().stats.median
            except Exception as exc:
                errors["graph_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]
    ran = kernels.backend_of(names) if names else None
    return errors | dict(
        kernels=names or None, backend_ran=ran, kernel_sum_ms=kernel_ms, graph_median_ms=graph_ms,
        kernel_mismatch=(kernels.mismatch(bound.prepared.info.get("backend"), ran) or None) if names else None,
        timer_mismatch=timer_disagreement(median_ms, graph_ms, kernel_ms) or None)


WARM_CALLS, WARM_S = 1, 0.0  # a later visit's calls before its timer's own warm-up: one, as a first visit's
# checked call warms its variant (the determinism check takes the timer's own calls)
FIRST_WARM_S = 0.1  # the first variant a fresh worker times: its threads start and its heap grows
# (tests/benchmarks/quick_preset.py's visits column: a visit's first case against its first visit)
_WARMED: list = []  # this worker process has warmed up once (a later visit's worker is a fresh process)


def retime_group(variants: list[Variant], case: Case, settings: MeasureSettings, emit: Callable[[dict], None],
                 at: Callable[[str], None] = _nowhere) -> None:
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
            inputs = case_inputs(case) if case.scope == "core" else None  # a layer makes its own
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

        window = contention.LoadWindow().start()
        ceiling = getattr(settings, "ceiling_ms", None)
        with spans.span("visit: timing round, less its samples"):
            interleave({n: t for n, (_, t) in timers.items()}, 1, settings.budget_ms, enter=enter, on_error=on_error,
                       ceiling_ms=ceiling, of_rounds=rounds)  # one round of the first visit's: its share of everything
            spans.absorb(_timed_parts({n: t for n, (_, t) in timers.items()}, "visit: "))
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
            _free(case.device)
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
        out.update(contention.verdict(summary.cpu_util, other_cpu, summary.threads, summary.samples_ms))
    return out


def profile_group(variants: list[Variant], case: Case, emit: Callable[[dict], None],
                  at: Callable[[str], None] = _nowhere) -> None:
    """The profiled pass: category shares of profiled self time per variant, as a row keyed
    like the cell's (``variant`` and the case fields); a failure is ``profile_error``."""
    from bench.measure.profiler import category_shares

    try:
        inputs = case_inputs(case)
        for var in variants:
            at(var.name)
            row = {"variant": var.name, **case.to_dict()}
            try:
                bound = bind_variant(var, case, inputs)
                with bound.scope():
                    row.update(category_shares(bound))
            except Exception as exc:
                row["profile_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]
            emit(row)
    finally:
        _free(case.device)
