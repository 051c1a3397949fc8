"""Was the machine ours while we timed?  The step that stamps each CPU cell with the load's
verdict: a watch (``RoundsLoad``) over the cell's rounds reads the cores' worth other processes
used, and ``verdict`` (the core's, bench.measure.cpuload, where its three signs and thresholds
are described) turns it and the timer's own figures into the row's contention columns.
"""

from __future__ import annotations

from bench.measure import cpuload
from bench.measure.cellsteps import Step, Timed
from bench.measure.cpuload import (  # noqa: F401  (the load's verdict and its thresholds live with the readings)
    CPU_UTIL_MIN,
    CPU_UTIL_MIN_SINGLE,
    OTHER_CPU_MARGIN,
    QUANTA_MS,
    QUANTUM_SHARE,
    QUANTUM_TOL,
    quantum_ms,
    verdict,
)


class RoundsLoad:
    """The step's watch: the cores' worth other processes used over a CPU cell's rounds."""

    def __init__(self):
        self.window = cpuload.LoadWindow()
        self.other_cpu: float | None = None

    def start(self) -> None:
        self.window.start()

    def stop(self) -> None:
        self.other_cpu = self.window.stop()


def _watch(case, settings) -> RoundsLoad | None:
    return RoundsLoad() if case.device == "cpu" else None


def _contention(t: Timed) -> None:
    """The CPU's verdict on the load around the cell's turns."""
    tm = t.timing
    t.result.contention = verdict(tm.cpu_util, t.watched["contention"].other_cpu, tm.threads, tm.samples_ms)


STEP = Step("contention", 30, lambda t: "contention" in t.watched, _contention, watch=_watch)
