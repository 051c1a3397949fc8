"""Contended cells measured again rather than only flagged: the end-of-sweep re-measurement of
the cells still contended once the load has dropped (a ``Pass``, after the workers timed theirs
again in place: bench.features.contention.retime.Held).  It reads the load on this process's CPUs
(bench.measure.cpuload: its one look, ``wait_for_quiet``), as the contention check does."""

from __future__ import annotations

from pathlib import Path

from bench.engine import spans
from bench.engine.passes import Pass, PassResult, SweepSoFar
from bench.measure import cpuload
from bench.measure.cpuload import QUIET_LOOK_S, wait_for_quiet  # noqa: F401  (QUIET_LOOK_S: this pass's one look)
from bench.runs import judge, store


def remeasure(cells, run_dir: Path, spec, threads: int | None, measure, retimed: tuple[int, int] = (0, 0)
              ) -> tuple[list[str], float]:
    """The cells still contended once the workers re-timed theirs in place (bench.features.contention.retime.Held;
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


def _pass(s: SweepSoFar) -> PassResult:
    """The end-of-sweep re-measurement, with what the workers re-timed in place said first."""
    notes, timed = remeasure(s.cells, s.run_dir, s.spec, s.threads, s.pool.run, (s.pool.retimed, s.pool.retimed_clean))
    return PassResult(timed, tuple(notes), frozenset({"contended"}) if notes else frozenset())


PASS = Pass("re-measure", 10, _pass)
