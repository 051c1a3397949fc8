"""Clocks, power, temperature, throttling and energy of the GPU a cell ran on, through NVML
(``nvidia-ml-py``, optional: without it, or without a GPU, a row has none of these columns).

The worker samples its GPU at the start and end of each variant's turns (``Probe``); a cell's
row gets its SM clock, power and temperature at its first and last sample, the throttle
reasons seen, and, where the energy counter exists (Volta and later), joules per call and per
token.  A cell timed with its SM clock below CLOCK_MIN of the clock the worker started at is
``throttled``, with the reason: a shaky number, like a contended one on the CPU.

Everything but ``open_nvml`` and ``sample`` is plain arithmetic on samples, tested on the CPU
with a fake NVML module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLOCK_MIN = 0.9  # of the worker's first SM clock: a turn below it was timed on a throttled GPU
# nvmlClocksEventReasons / nvmlClocksThrottleReasons bits, as NVML names them
THROTTLE_BITS = {0x1: "gpu idle", 0x2: "applications clocks setting", 0x4: "sw power cap", 0x8: "hw slowdown",
                 0x10: "sync boost", 0x20: "sw thermal slowdown", 0x40: "hw thermal slowdown",
                 0x80: "hw power brake slowdown", 0x100: "display clocks setting"}
HARMLESS = {"gpu idle", "applications clocks setting", "display clocks setting"}  # not a slowdown of a busy GPU


def throttle_names(mask: int | None) -> list[str]:
    return [] if not mask else [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass
class Sample:
    sm_clock_mhz: float | None
    power_w: float | None
    temp_c: float | None
    throttle: int | None
    energy_mj: float | None  # total since the driver loaded, millijoules; None where the counter is missing


def _call(fn, *args):
    try:
        return fn(*args)
    except Exception:  # a query this GPU or driver does not support: that column stays empty
        return None


def open_nvml(module=None, index: int = 0):
    """(module, handle) of the GPU this process sees as ``index``, or None without NVML."""
    if module is None:
        try:
            import pynvml as module
        except ImportError:
            return None
    try:
        module.nvmlInit()
        return module, module.nvmlDeviceGetHandleByIndex(index)
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


@dataclass
class Cell:
    """One cell's samples over its turns: the first and last, the lowest clock, the throttle
    reasons seen, and the energy and calls inside the turns."""
    first: Sample | None = None
    last: Sample | None = None
    lowest_clock: float | None = None
    reasons: set = field(default_factory=set)
    energy_mj: float = 0.0
    energy_known: bool = True
    calls: int = 0

    def turn(self, start: Sample, end: Sample, calls: int) -> None:
        self.first = self.first or start
        self.last = end
        for s in (start, end):
            if s.sm_clock_mhz is not None:
                self.lowest_clock = s.sm_clock_mhz if self.lowest_clock is None else min(self.lowest_clock,
                                                                                          s.sm_clock_mhz)
            self.reasons |= set(throttle_names(s.throttle)) - HARMLESS
        if start.energy_mj is None or end.energy_mj is None:
            self.energy_known = False
        else:
            self.energy_mj += end.energy_mj - start.energy_mj
        self.calls += calls

    def columns(self, reference_clock: float | None, tokens: int) -> dict:
        """The row's columns; ``reference_clock``: the SM clock the worker started at."""
        if self.first is None:
            return {}
        out = {"sm_clock_start_mhz": self.first.sm_clock_mhz, "sm_clock_end_mhz": self.last.sm_clock_mhz,
               "power_start_w": self.first.power_w, "power_end_w": self.last.power_w,
               "temp_start_c": self.first.temp_c, "temp_end_c": self.last.temp_c,
               "throttle_reasons": ", ".join(sorted(self.reasons)) or None}
        if self.energy_known and self.calls:
            per_call = self.energy_mj / 1e3 / self.calls
            out |= {"energy_j_per_call": per_call, "energy_j_per_token": per_call / max(1, tokens)}
        ratio = (self.lowest_clock / reference_clock) if self.lowest_clock and reference_clock else None
        throttled = ratio is not None and ratio < CLOCK_MIN
        out["throttled"] = throttled
        if throttled:
            out["throttled_why"] = (f"SM clock down to {self.lowest_clock:.0f} MHz, {ratio:.2f} of the "
                                    f"{reference_clock:.0f} MHz the worker started at"
                                    + (f" ({out['throttle_reasons']})" if out["throttle_reasons"] else ""))
        return out
