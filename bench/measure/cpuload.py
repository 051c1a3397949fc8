"""The load on this machine's CPUs, read from /proc on Linux: which CPUs this process may use
(its affinity), the cores' worth other processes used over a window (``LoadWindow``: /proc/stat's
busy ticks of those CPUs less this process's own, or its tree's), their runnable threads, and the
load average.  The core reads them: the threads a sweep takes (``auto_threads``), the placement
of its workers, the run folder's load at its start and end, a look for a quiet machine before a
figure is measured again (``wait_for_quiet``); the contention feature (bench.features.contention.contention)
judges each cell's timing by them with ``verdict``, which a later visit (bench.engine.revisit), a
re-timing and the self-check ask too.

The verdict: was the machine ours while we timed?  Three signs, each cheap to read on Linux:

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

import os
import time

OTHER_CPU_MARGIN = 0.5  # other processes' use beyond the cores left free for them, in cores, that counts as load
# (how it was chosen: the module's doc)
QUIET_LOOK_S = 0.5  # one look at the load before a figure is measured again: it does not wait for it to drop


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a container or a scheduler may grant
    a few of the machine's), not the machine's count."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _machine_ticks(cpus=None) -> tuple[int, int] | None:
    """(busy, total) ticks since boot over ``cpus`` (default: the usable ones), from their
    own lines of /proc/stat; None where /proc/stat is missing."""
    wanted = {f"cpu{c}" for c in (usable_cpus() if cpus is None else cpus)}
    busy = total = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, *values = line.split()
                if name not in wanted:
                    continue
                fields = [int(x) for x in values]
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
                all_ = sum(fields[:8])  # guest time is already in user
                busy += all_ - idle
                total += all_
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total) if total else None


def _own_ticks() -> int | None:
    try:
        with open("/proc/self/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return int(parts[11]) + int(parts[12])  # utime + stime
    except (OSError, ValueError, IndexError):
        return None


def _tree() -> list[list[str]] | None:
    """The /proc/PID/stat fields (after the name) of this process and every process below it (its
    workers, a fork server and its children), or None where /proc cannot be read."""
    me = os.getpid()
    children: dict = {}
    stats: dict = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended meanwhile
        pid = int(name)
        children.setdefault(int(parts[1]), []).append(pid)
        stats[pid] = parts
    if me not in stats:
        return None
    out, todo = [], [me]
    while todo:
        pid = todo.pop()
        out.append(stats[pid])
        todo.extend(p for p in children.get(pid, ()) if p in stats)
    return out


def _tree_ticks() -> int | None:
    """utime + stime of this process's tree (``_tree``): what a sweep itself uses, while its
    workers import torch beside it."""
    tree = _tree()
    return None if tree is None else sum(int(p[11]) + int(p[12]) for p in tree)


def _runnable_others() -> int | None:
    """Threads of other processes ready to run now: /proc/stat's procs_running less this tree's."""
    try:
        with open("/proc/stat") as f:
            running = next(int(line.split()[1]) for line in f if line.startswith("procs_running"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    tree = _tree()
    mine = sum(1 for p in tree if p[0] == "R") if tree else 0
    return max(0, running - mine)


class LoadWindow:
    """Cores' worth of CPU used by other processes between ``start()`` and ``stop()``, on the
    CPUs this process may use (its affinity).  ``tree``: this process's children are its own,
    not others (a sweep's start, whose workers are importing beside it)."""

    def __init__(self, tree: bool = False):
        self._m0 = self._o0 = None
        self._t0 = 0.0
        self._cpus: list[int] = []
        self._own = _tree_ticks if tree else _own_ticks

    def start(self) -> LoadWindow:
        self._cpus = usable_cpus()
        self._m0, self._o0, self._t0 = _machine_ticks(self._cpus), self._own(), time.monotonic()
        return self

    def stop(self) -> float | None:
        m1, o1 = _machine_ticks(self._cpus), self._own()
        if None in (self._m0, self._o0, m1, o1):
            return None
        total = m1[1] - self._m0[1]
        if total <= 0:
            return None
        wall_ticks = total / len(self._cpus)  # elapsed ticks of one CPU
        others = (m1[0] - self._m0[0]) - (o1 - self._o0)
        return max(0.0, others / wall_ticks)


def free_cores(window_s: float = 0.25) -> float | None:
    """Cores of this process's affinity that other processes left free over ``window_s``
    (None where /proc/stat cannot be read)."""
    other = others_busy(window_s)
    return None if other is None else max(0.0, len(usable_cpus()) - other)


def others_busy(window_s: float = 0.25, tree: bool = False, samples: int = 10) -> float | None:
    """Cores' worth of CPU that other processes used over ``window_s`` (``tree``: this process's
    children are not others), or None where /proc/stat cannot be read.  With ``tree``, what they
    would use: where this tree takes cores from them, their use understates their demand, so the
    mean count of their runnable threads over the window counts when it is higher."""
    window = LoadWindow(tree).start()
    counts = []
    for _ in range(samples if tree else 1):
        time.sleep(window_s / (samples if tree else 1))
        if tree:
            counts.append(_runnable_others())
    used = window.stop()
    counts = [c for c in counts if c is not None]
    if used is None or not counts:
        return used
    return max(used, min(float(len(usable_cpus())) * 4, sum(counts) / len(counts)))


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def auto_threads(spec, others: float | None = None, wait_workers=lambda: None) -> tuple[int | None, str]:
    """``--threads auto`` (the default) on the CPU: when other processes leave fewer cores free
    than the sweep would use, the free ones (at least 1), and a note that says so; else
    (None, ''): one thread per core.  ``others``: the cores' worth other processes used, as the
    caller measured it already (the plan's probe: the load is probed once per sweep); without it,
    measured here once ``wait_workers()`` returns (the workers started ahead have done their
    imports: bench.engine.runner.wait_prestarted), from the load on this process's CPUs
    (``free_cores``)."""
    if spec.threads is not None and spec.device == "cpu":
        cores = len(usable_cpus())
        if spec.threads * (spec.workers or 1) > cores:
            return None, (f"warning: --threads {spec.threads}" + (f" x {spec.workers} workers" if spec.workers else "")
                          + f" is more than the {cores} cores this process may use: the threads wait for one "
                          f"another, and the timings measure that wait (each row's contended_why names the thread "
                          f"count); --threads {max(1, cores // (spec.workers or 1))} or fewer")
    if spec.threads is not None or spec.device != "cpu" or (spec.workers or 1) > 1:
        return None, ""
    cores = len(usable_cpus())
    if others is not None:
        free = max(0.0, cores - others)
    else:
        wait_workers()
        free = free_cores()
    if free is None or free > cores - 0.5:
        return None, ""
    n = max(1, min(cores, int(free + 0.5)))
    return n, (f"note: other processes are using {cores - free:.1f} of the {cores} cores this sweep may use: it "
               f"takes --threads {n} (--threads auto: the free ones, at least 1), so that its threads do not wait "
               f"for cores; give --threads N to choose")


def wait_for_quiet(threads: int, limit_s: float = 0.0, step_s: float = QUIET_LOOK_S) -> tuple[bool, float]:
    """Look at the load (one ``step_s`` window) and, with ``limit_s``, wait at most that long until
    other processes leave the worker's cores free: (quiet, seconds taken).  Measured as the
    contention check does, on this process's CPUs."""
    free = max(0, len(usable_cpus()) - threads)
    t0 = time.monotonic()
    while True:
        window = LoadWindow().start()
        time.sleep(step_s)
        other = window.stop()
        waited = time.monotonic() - t0
        if other is None or other <= free + OTHER_CPU_MARGIN:
            return True, waited
        if waited >= limit_s:
            return False, waited


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
    cores = cpu_count or len(usable_cpus())
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
