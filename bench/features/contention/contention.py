"""Was the machine ours while we timed?  Three signs, each cheap to read on Linux:

- ``cpu_util``: the worker's CPU time (all threads) over the timed blocks, divided by their
  wall time x threads (kept by the CPU timer).  Below CPU_UTIL_MIN the threads were waiting
  for cores more than they ran.
- ``other_cpu``: cores' worth of CPU that *other* processes used while the case was timed,
  from /proc/stat's busy ticks of the CPUs this process may use (its affinity, not the whole
  machine) less this process's own (/proc/self/stat).
  The cores of its affinity the worker does not use (usable CPUs - threads) are free for others: the cell is
  contended when others took more than those plus OTHER_CPU_MARGIN.  That is why
  ``--threads`` below the core count can be the honest choice on a shared machine.
- ``quantum_ms``: the samples sit on multiples of a scheduler time slice (QUANTA_MS), spread
  over two multiples or more: the timings measure the scheduler, not the kernel.

Thresholds (measured on a 2-core VM, bench/measure/README.md "Numbers you can trust"): quiet quick sweeps
had cpu_util >= 0.77 and other_cpu <= 0.06 in every cell; next to two busy loops every
cell had cpu_util <= 0.54 and other_cpu >= 0.98.  CPU_UTIL_MIN and OTHER_CPU_MARGIN sit
between the two.  One thread has no parallel region to wait in: with a busy loop on the
other core its cpu_util was >= 0.99 in every cell of a quick sweep, and next to two loops
(three runnable threads on two cores) its median was 0.86, so CPU_UTIL_MIN_SINGLE is 0.9.
"""

from __future__ import annotations

from bench.measure import cpuload
from bench.measure.cellsteps import Step, Timed
from bench.measure.cpuload import OTHER_CPU_MARGIN  # noqa: F401  (the load's margin, shared with the core's looks)

CPU_UTIL_MIN = 0.65  # several threads: parallel regions wait for each other even on a quiet machine
CPU_UTIL_MIN_SINGLE = 0.9  # one thread has nothing to wait for: below this it waited for a core
QUANTA_MS = (10.0, 4.0, 1.0)  # the largest slice that explains the samples
QUANTUM_TOL = 0.05  # a sample within 5% of a quantum of a multiple of it
QUANTUM_SHARE = 0.8  # of the samples


def quantum_ms(samples_ms, quanta=QUANTA_MS) -> float | None:
    """The scheduler quantum the samples cluster on, or None.  Clustering needs at least
    QUANTUM_SHARE of 5+ samples within QUANTUM_TOL x q of a multiple of q, over two or more
    distinct multiples (one tight cluster is a stable kernel, not a scheduler)."""
    xs = [float(x) for x in samples_ms]
    if len(xs) < 5:
        return None
    med = sorted(xs)[len(xs) // 2]
    for q in quanta:
        if med < 2 * q:
            continue
        ks = [round(x / q) for x in xs]
        near = [k for x, k in zip(xs, ks) if k >= 1 and abs(x - k * q) <= QUANTUM_TOL * q]
        if len(near) >= QUANTUM_SHARE * len(xs) and len(set(near)) >= 2:
            return q
    return None


def verdict(cpu_util: float | None, other_cpu: float | None, threads: int,
            samples_ms=(), cpu_count: int | None = None) -> dict:
    """The row's contention columns: cpu_util, other_cpu, quantum_ms, contended, and why.  More
    threads than cores is named as the cause first: the threads waited for one another, and
    what the other processes did cannot be told apart from it."""
    cores = cpu_count or len(cpuload.usable_cpus())
    free = max(0, cores - threads)
    why = []
    if threads > cores:
        why.append(f"{threads} threads on {cores} cores: the threads waited for one another (--threads {cores} "
                   f"or fewer)")
    least = CPU_UTIL_MIN_SINGLE if threads == 1 else CPU_UTIL_MIN
    if cpu_util is not None and cpu_util < least and threads <= cores:
        why.append(f"timed with {cpu_util:.2f} of its cores (cpu_util < {least})")
    if other_cpu is not None and other_cpu > free + OTHER_CPU_MARGIN and threads <= cores:
        why.append(f"other processes used {other_cpu:.2f} cores (free: {free})")
    q = quantum_ms(samples_ms)
    if q is not None:
        why.append(f"samples on {q:g} ms scheduler slices")
    return {"cpu_util": cpu_util, "other_cpu": other_cpu, "quantum_ms": q, "contended": bool(why),
            "contended_why": "; ".join(why)}


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
