"""Numbers measured again rather than only flagged: ``--threads auto`` (the free cores at the
start), the end-of-sweep re-measurement of contended cells once the load has dropped (a
``Pass``, after the workers timed theirs again in place: bench.engine.retime.Held), and an
end-of-sweep matmul peak measured again when it ran under load.  Each reads the load on this
process's CPUs (bench.measure.cpuload), as the contention check does."""

from __future__ import annotations

import time
from pathlib import Path

from bench.engine import judge, spans, store
from bench.engine.passes import Pass, PassResult, SweepSoFar
from bench.measure import contention, cpuload

QUIET_LOOK_S = 0.5  # the end-of-sweep re-measurement's one look at the load: it does not wait for it to drop


def auto_threads(spec, others: float | None = None, wait_workers=lambda: None) -> tuple[int | None, str]:
    """``--threads auto`` (the default) on the CPU: when other processes leave fewer cores free
    than the sweep would use, the free ones (at least 1), and a note that says so; else
    (None, ''): one thread per core.  ``others``: the cores' worth other processes used, as the
    caller measured it already (the plan's probe: the load is probed once per sweep); without it,
    measured here once ``wait_workers()`` returns (the workers started ahead have done their
    imports: bench.engine.runner.wait_prestarted), from the load on this process's CPUs
    (bench.measure.cpuload)."""
    if spec.threads is not None and spec.device == "cpu":
        cores = len(cpuload.usable_cpus())
        if spec.threads * (spec.workers or 1) > cores:
            return None, (f"warning: --threads {spec.threads}" + (f" x {spec.workers} workers" if spec.workers else "")
                          + f" is more than the {cores} cores this process may use: the threads wait for one "
                          f"another, and the timings measure that wait (each row's contended_why names the thread "
                          f"count); --threads {max(1, cores // (spec.workers or 1))} or fewer")
    if spec.threads is not None or spec.device != "cpu" or (spec.workers or 1) > 1:
        return None, ""
    cores = len(cpuload.usable_cpus())
    if others is not None:
        free = max(0.0, cores - others)
    else:
        wait_workers()
        free = cpuload.free_cores()
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
    free = max(0, len(cpuload.usable_cpus()) - threads)
    t0 = time.monotonic()
    while True:
        window = cpuload.LoadWindow().start()
        time.sleep(step_s)
        other = window.stop()
        waited = time.monotonic() - t0
        if other is None or other <= free + contention.OTHER_CPU_MARGIN:
            return True, waited
        if waited >= limit_s:
            return False, waited


def remeasure(cells, run_dir: Path, spec, threads: int | None, measure, retimed: tuple[int, int] = (0, 0)
              ) -> tuple[list[str], float]:
    """The cells still contended once the workers re-timed theirs in place (bench.engine.retime.Held;
    ``retimed``: how many rows they timed again, and how many came out clean): up to
    ``spec.remeasure`` passes at the end of the sweep, each only when the load has dropped by then
    (one look, QUIET_LOOK_S: no idle wait), ``measure(cells)`` (the sweep's own cell runner,
    returning its timed seconds) appending new rows (the old ones stay; the newest counts).
    Returns what was done, or why not, in words, and the timed seconds."""
    notes, timed = [], 0.0
    if retimed[0]:
        notes.append(f"re-timed {retimed[0]} cell(s) of contended cases in place, after a quiet case or at the end "
                     f"of the pass: {retimed[1]} now clean, {retimed[0] - retimed[1]} not")
    wanted = {store.cell_key(n, c): (n, c) for n, c in cells}
    threads = threads or spec.threads or len(cpuload.usable_cpus())
    for i in range(spec.remeasure or 0):
        current = [r for r in store.read_current(run_dir) if store.cell_key(r["variant"], r) in wanted]
        shaky = [wanted[store.cell_key(r["variant"], r)] for r in current if judge.wants_retry(r, {"contended"})]
        if not shaky:
            break
        with spans.span("sweep: a look at the load (re-measure)"):
            quiet, waited = wait_for_quiet(threads, limit_s=0.0, step_s=QUIET_LOOK_S)
        if not quiet:
            notes.append(f"{len(shaky)} contended cell(s) not measured again at the end of the sweep: other processes "
                         f"still used the cores it needs (a quieter machine, or fewer --threads than cores)")
            break
        timed += measure(shaky)
        keys = {store.cell_key(n, c) for n, c in shaky}
        after = [r for r in store.read_current(run_dir) if store.cell_key(r["variant"], r) in keys]
        clean = sum(1 for r in after if r.get("status") == "ok" and not judge.wants_retry(r, {"contended"}))
        notes.append(f"re-measured {len(shaky)} contended cell(s) at the end of the sweep (pass {i + 1} of "
                     f"{spec.remeasure}, the load having dropped): {clean} now clean, {len(after) - clean} not")
    return notes, timed


def unloaded_peak(spec, dtype: str, threads) -> tuple[float, str]:
    """The end-of-sweep matmul peak, measured again when other processes took the cores while it
    ran and one look at the load finds them gone; ('' or what the load was, when it stayed)."""
    from bench.measure.envinfo import measure_peak_tflops, peak_run_ms

    def measure():
        window = cpuload.LoadWindow().start()
        value = measure_peak_tflops(spec.device, dtype, threads, peak_run_ms(spec.device, spec.budget_ms))
        other = window.stop() if spec.device == "cpu" else None
        free = max(0, len(cpuload.usable_cpus()) - (threads or len(cpuload.usable_cpus())))
        return value, (f"other processes used {other:.2f} cores while it ran" if other is not None and
                       other > free + contention.OTHER_CPU_MARGIN else "")

    value, loaded = measure()
    if loaded:  # a peak measured under load would make every % of peak look better than it is
        quiet, _ = wait_for_quiet(threads or len(cpuload.usable_cpus()), limit_s=0.0, step_s=QUIET_LOOK_S)
        if quiet:  # measured again once the load has dropped; else kept as under load (no idle wait)
            value, loaded = measure()
    return value, loaded


def _pass(s: SweepSoFar) -> PassResult:
    """The end-of-sweep re-measurement, with what the workers re-timed in place said first."""
    notes, timed = remeasure(s.cells, s.run_dir, s.spec, s.threads, s.pool.run, (s.pool.retimed, s.pool.retimed_clean))
    return PassResult(timed, tuple(notes), frozenset({"contended"}) if notes else frozenset())


PASS = Pass("re-measure", 10, _pass)
