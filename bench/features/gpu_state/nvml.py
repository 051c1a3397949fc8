"""Clocks, power, temperature, throttling and energy of the GPU a cell ran on, through NVML
(``nvidia-ml-py``, optional: without it, or without a GPU, a row has none of these columns).

Which GPU: NVML numbers the GPUs of the machine and ignores ``CUDA_VISIBLE_DEVICES``, so
index 0 is not the GPU a worker on GPU 5 measures.  The handle is taken by the UUID that
PyTorch reports for the worker's device (``device_uuid``).

The worker samples its GPU at the start and end of each variant's turns, each time after a
synchronize (so a turn's samples hold its kernels and none of the forward a ``bwd`` turn runs
before it); a cell's row gets its SM clock, power and temperature at its first and last
sample, the power limit, the throttle reasons seen, and, where the energy counter exists
(Volta and later), joules per call and per token.

Throttling is read from NVML's own slowdown reasons (thermal and hardware slowdown, the power
brake), never from a clock ratio alone: a GPU held at its power cap under load runs below its
boost clock by design, and an idle first sample would make every later clock look high.  The
clock is compared with a steady reference, the application clock, and that ratio is said in
the reason.  ``nvmlDeviceGetPowerUsage`` is a one-second average on Hopper: the power columns
are context, not a per-call figure.

Energy: the counter (millijoules since the driver loaded) is read around each turn.  A turn's
timed calls each follow a 256 MiB L2-flush (``cache.zero_()``), whose energy is not the
kernel's: it is measured once per worker in a flush-only loop of at least FLUSH_LOOP_S and
subtracted, flush by flush.  What stays in J/call is the call and the idle gaps between calls.

Everything but ``open_nvml``, ``device_uuid`` and ``sample`` is plain arithmetic on samples,
tested on the CPU with a fake NVML module.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.measure.cellsteps import Step, Timed

CLOCK_MIN = 0.9  # of the reference clock: below it, the reason says by how much (context for a slowdown)
# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits, as NVML names them
THROTTLE_BITS = {0x1: "gpu idle", 0x2: "applications clocks setting", 0x4: "sw power cap", 0x8: "hw slowdown",
                 0x10: "sync boost", 0x20: "sw thermal slowdown", 0x40: "hw thermal slowdown",
                 0x80: "hw power brake slowdown", 0x100: "display clocks setting"}
IDLE = 0x1
HARMLESS = {"gpu idle", "applications clocks setting", "display clocks setting"}  # not a slowdown of a busy GPU
# the reasons that make a timing shaky: the GPU slowed itself down for heat or by a hardware
# signal.  A power cap ("sw power cap") and sync boost are how a loaded GPU normally runs.
SLOWDOWN = {"hw slowdown", "sw thermal slowdown", "hw thermal slowdown", "hw power brake slowdown"}
FLUSH_LOOP_S = 1.0  # the flush-only energy loop: the counter and the power reading need about a second
ENERGY_WINDOW_S = 1.0  # the least time a cell's turns must add up to for an energy per call (the same reason)


def throttle_names(mask: int | None) -> list[str]:
    return [] if not mask else [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass
class Sample:
    sm_clock_mhz: float | None
    power_w: float | None
    temp_c: float | None
    throttle: int | None
    energy_mj: float | None  # total since the driver loaded, millijoules; None where the counter is missing


@dataclass(frozen=True)
class Device:
    """What a worker reads once about its GPU: the steady clock its turns are held against,
    and the power limit."""
    app_clock_mhz: float | None
    power_limit_w: float | None


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception:  # a query this GPU or driver does not support: that column stays empty
        return None


def device_uuid(index: int | None = None, torch_cuda=None) -> str | None:
    """NVML's UUID ("GPU-...") of the CUDA device this process sees as ``index`` (the current
    one by default), from PyTorch's device properties; None where PyTorch gives none."""
    if torch_cuda is None:
        import torch

        torch_cuda = torch.cuda
    index = torch_cuda.current_device() if index is None else index
    raw = str(getattr(torch_cuda.get_device_properties(index), "uuid", "") or "")
    if not raw:
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def open_nvml(module=None, uuid: str | None = None):
    """(module, handle) of the GPU with NVML UUID ``uuid``, or None without NVML, or without a
    UUID (index 0 could be another GPU: no figures rather than another GPU's)."""
    if module is None:
        try:
            import pynvml as module
        except ImportError:
            return None
    if not uuid:
        return None
    try:
        module.nvmlInit()
        try:
            handle = module.nvmlDeviceGetHandleByUUID(uuid)
        except TypeError:  # older nvidia-ml-py takes bytes
            handle = module.nvmlDeviceGetHandleByUUID(uuid.encode())
        return module, handle
    except Exception:
        return None


def sample(nvml) -> Sample:
    module, handle = nvml
    reasons = getattr(module, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(module, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    clock = _call(module.nvmlDeviceGetClockInfo, handle, module.NVML_CLOCK_SM)
    power = _call(module.nvmlDeviceGetPowerUsage, handle)
    energy = _call(module.nvmlDeviceGetTotalEnergyConsumption, handle)
    return Sample(clock, power / 1e3 if power is not None else None,
                  _call(module.nvmlDeviceGetTemperature, handle, module.NVML_TEMPERATURE_GPU),
                  _call(reasons, handle) if reasons else None, energy)


def device_info(nvml) -> Device:
    """The application SM clock (the steady clock a loaded GPU is set to run at) and the
    enforced power limit."""
    module, handle = nvml
    app = getattr(module, "nvmlDeviceGetApplicationsClock", None)
    limit = getattr(module, "nvmlDeviceGetEnforcedPowerLimit", None)
    clock = _call(app, handle, module.NVML_CLOCK_SM) if app else None
    watts = _call(limit, handle) if limit else None
    return Device(clock or None, watts / 1e3 if watts else None)


def flush_energy_mj(nvml, flush: Callable[[], None], sync: Callable[[], None],
                    seconds: float = FLUSH_LOOP_S, clock: Callable[[], float] = time.perf_counter) -> float | None:
    """The energy of one L2 flush, in millijoules: ``flush()`` back to back for at least
    ``seconds``, the counter read after a ``sync()`` at both ends.  None without a counter."""
    sync()
    start = sample(nvml).energy_mj
    if start is None:
        return None
    t0, n = clock(), 0
    while clock() - t0 < seconds:
        for _ in range(16):
            flush()
        n += 16
        sync()
    end = sample(nvml).energy_mj
    return None if end is None or end < start else (end - start) / n


@dataclass
class Cell:
    """One cell's samples over its turns: the first and last, the lowest clock, the throttle
    reasons seen, and the energy, calls and L2 flushes inside the turns."""
    first: Sample | None = None
    last: Sample | None = None
    lowest_clock: float | None = None
    reasons: set = field(default_factory=set)
    energy_mj: float = 0.0
    energy_known: bool = True
    calls: int = 0
    flushes: int = 0
    seconds: float | None = 0.0  # the turns' wall time added up; None once a turn's was not measured

    def turn(self, start: Sample, end: Sample, calls: int, flushes: int = 0, seconds: float | None = None) -> None:
        """One turn between two samples: ``calls`` timed calls and ``flushes`` L2 flushes in ``seconds``."""
        self.first = self.first or start
        self.last = end
        for s in (start, end):
            if s.sm_clock_mhz is not None and not (s.throttle or 0) & IDLE:  # an idle GPU lowers its clock
                self.lowest_clock = s.sm_clock_mhz if self.lowest_clock is None else min(self.lowest_clock,
                                                                                          s.sm_clock_mhz)
            self.reasons |= set(throttle_names(s.throttle)) - HARMLESS
        if start.energy_mj is None or end.energy_mj is None:
            self.energy_known = False
        else:
            self.energy_mj += end.energy_mj - start.energy_mj
        self.calls += calls
        self.flushes += flushes
        self.seconds = None if seconds is None or self.seconds is None else self.seconds + seconds

    def energy_gap(self, flush_mj: float | None) -> str:
        """Why no energy per call is given ('' when it is): the counter missing, no calls, flushed
        turns without a flush figure, or a window shorter than ENERGY_WINDOW_S, over which NVML's
        counter (steps of about 10 ms) would give a figure of its own steps, not of the calls."""
        if not self.energy_known:
            return "NVML has no energy counter on this GPU"
        if not self.calls:
            return "no timed call"
        if self.flushes and flush_mj is None:
            return "the turns flushed L2 and the flush's own energy was not measured"
        if self.seconds is None:
            return "the turns' window was not measured"
        if self.seconds < ENERGY_WINDOW_S:
            return (f"the turns add up to {self.seconds:.3g} s, under the {ENERGY_WINDOW_S:g} s NVML's energy counter "
                    f"needs (it advances in steps of about 10 ms): a larger --budget-ms gives it")
        return ""

    def columns(self, device: Device | None, tokens: int, flush_mj: float | None = None) -> dict:
        """The row's columns.  ``device``: the worker's GPU (its application clock, the
        reference, and its power limit); ``flush_mj``: the energy of one L2 flush, taken out
        of the turns' energy (None: not measured, and then no energy figure is given where
        the turns flushed)."""
        if self.first is None:
            return {}
        device = device or Device(None, None)
        out = {"sm_clock_start_mhz": self.first.sm_clock_mhz, "sm_clock_end_mhz": self.last.sm_clock_mhz,
               "power_start_w": self.first.power_w, "power_end_w": self.last.power_w,
               "power_limit_w": device.power_limit_w, "temp_start_c": self.first.temp_c,
               "temp_end_c": self.last.temp_c, "throttle_reasons": ", ".join(sorted(self.reasons)) or None}
        why = self.energy_gap(flush_mj)
        if why:
            out["energy_why"] = why
        else:
            per_call = max(0.0, self.energy_mj - self.flushes * (flush_mj or 0.0)) / 1e3 / self.calls
            out |= {"energy_j_per_call": per_call, "energy_j_per_token": per_call / max(1, tokens)}
        slowdown = sorted(self.reasons & SLOWDOWN)
        out["throttled"] = bool(slowdown)
        if slowdown:
            ref = device.app_clock_mhz
            ratio = self.lowest_clock / ref if self.lowest_clock and ref else None
            clock = (f"; SM clock down to {self.lowest_clock:.0f} MHz, {ratio:.2f} of the {ref:.0f} MHz "
                     f"application clock" if ratio is not None and ratio < CLOCK_MIN else "")
            out["throttled_why"] = f"NVML reports {', '.join(slowdown)}{clock}"
        return out


_WORKER: dict = {}  # this worker's NVML handle, its GPU's steady clock and power limit, and one L2 flush's energy


def worker_gpu():
    """NVML for this worker's GPU (opened once per process, by the UUID of the device PyTorch
    uses), or None without nvidia-ml-py or a driver."""
    if "handle" not in _WORKER:
        handle = open_nvml(uuid=device_uuid())
        _WORKER["handle"] = handle
        _WORKER["device"] = device_info(handle) if handle else None
        _WORKER["flush_mj"] = None
        if handle:
            import torch

            from bench.measure.timing import flush_buffer

            cache = flush_buffer()
            _WORKER["flush_mj"] = flush_energy_mj(handle, cache.zero_, torch.cuda.synchronize)
    return _WORKER["handle"]


def _calls(timer) -> int:
    """Calls a timer has made so far, warm-up included (the energy of a turn is over all of them)."""
    return timer.warmup_calls + sum(len(r) for r in timer.rounds) * getattr(timer, "number", 1)


def _flushes(timer) -> int:
    """L2 flushes a timer has made so far (the CUDA-event timer flushes before each timed call)."""
    return getattr(timer, "flushes", 0)


class Turns:
    """The step's watch on a GPU cell: the GPU sampled at the start and end of each variant's turn,
    after a synchronize (a turn's counters hold its kernels only), into one ``Cell`` per variant."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.cells: dict[str, Cell] = {}

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def _sample(self) -> Sample:
        import torch

        torch.cuda.synchronize()
        return sample(self.nvml)

    @contextlib.contextmanager
    def turn(self, name: str, timer):
        before = self._sample(), _calls(timer), _flushes(timer), time.perf_counter()
        try:
            yield
        finally:
            end = self._sample()
            self.cells.setdefault(name, Cell()).turn(before[0], end, _calls(timer) - before[1],
                                                     _flushes(timer) - before[2],
                                                     seconds=time.perf_counter() - before[3])


def _watch(case, settings) -> Turns | None:
    if case.device != "cuda":
        return None
    handle = worker_gpu()
    return Turns(handle) if handle else None


def _gpu_state(t: Timed) -> None:
    """The GPU's clocks, power and energy around the cell's turns."""
    cell = t.watched["gpu state"].cells.get(t.item.variant.name, Cell())
    t.result.gpu_state = cell.columns(_WORKER["device"], t.case.batch * t.case.q_len, _WORKER["flush_mj"])


STEP = Step("gpu state", 40, lambda t: "gpu state" in t.watched, _gpu_state, watch=_watch)
