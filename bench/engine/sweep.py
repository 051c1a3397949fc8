"""The sweep engine: expand a Spec, run every cell in the isolated workers (bench.engine.pool), and
append each row to the run folder (bench.engine.runfolder keeps its env.json) as soon as it is
known.  Plain values in, a RunSummary out: the command line (``bench.cli.sweep``) decides what
to print and whether to build the report."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine import events, runfolder, runner, spans
from bench.engine.passes import SweepSoFar, sweep_passes
from bench.engine.placement import worker_slots  # noqa: F401  (where the command line takes it)
from bench.engine.pool import WorkerPool
from bench.engine.prepare import FOLDER, Prepared, prepare
from bench.measure import cpuload
from bench.model.row import current_rows
from bench.model.spec import Spec
from bench.runs import judge, store

log = logging.getLogger(__name__)  # printed by the handler the command line installs (bench.engine.events)


@dataclass(frozen=True)
class SweepOptions:
    """How one invocation runs a spec into a run folder (the spec says what is measured)."""
    resume: bool = False  # the folder holds an earlier run: measure only the cells it lacks
    retry: frozenset = frozenset()  # with resume: statuses whose cells are measured again
    allow_env_change: bool = False  # with resume: go on on a machine whose fingerprint differs
    profile: bool = False  # a profiled pass over every ok cell after the timing
    progress: bool = True  # progress through ``bars`` (False: none, whatever ``bars`` is)
    bars: events.Bars = events.silent  # makes the progress of each pass (the command line gives tqdm's)
    given: dict = field(default_factory=dict)  # the settings as the user gave them (env.json)
    command: str = ""  # the command line, for env.json's history
    projected_s: float | None = None  # the plan's projected wall time of the command (env.json's history)
    model_rest_s: float | None = None  # the cost model's time for the cells less their setups (plans learn from it)
    model: int | None = None  # the version of the cost model that gave model_rest_s (a plan learns from its own)
    keep_workers: bool = False  # leave the workers idle for the next sweep of this process (bench.engine.runner.park)
    others_cores_start: float | None = None  # cores' worth of CPU other processes used at the start (the plan's)


@dataclass(frozen=True)
class RunSummary:
    run_dir: Path
    rows: list  # every row in the folder, this invocation's and earlier ones
    counts: dict  # status: cells of this invocation
    cells: int  # cells run by this invocation
    already: int  # cells the folder had before
    elapsed_s: float
    timed_s: float  # of elapsed_s, in timed samples
    remeasured: list = field(default_factory=list)  # what the passes after the first did, in words (engine.passes)
    idle: int = 0  # of ``cells``, those that cannot run here by their variant's declaration: rows, never swept
    settled: frozenset = frozenset()  # shaky flags the passes tried to settle (contended, after a re-measurement)


def run_sweep(spec: Spec, run_dir: Path, options: SweepOptions = SweepOptions(), registry=None,
              prepared: Prepared | None = None) -> RunSummary:
    """Measure every cell of ``spec`` that ``run_dir`` lacks, appending each row as soon as
    it is known; returns what was done. One sweep at a time writes a folder (a lock).

    ``registry`` and ``prepared`` (bench.engine.prepare): what the caller prepared already (the
    command line, to print its plan), so that the variants are discovered and the cells expanded
    once; the folder's rows are read here, under its lock, where a torn last line may be cut."""
    if registry is None:
        registry = prepared.registry if prepared is not None else None
    if registry is None:
        from bench.engine.discovery import discover

        registry = discover(spec.plugins)
    if prepared is None:
        prepared = prepare(spec, registry, until=FOLDER)
    run_dir = store.writable_dir(run_dir)
    with store.locked(run_dir), spans.span("sweep: run folder opened, cells read"):
        # the plan's probe, when it made one
        auto, note = cpuload.auto_threads(spec, options.others_cores_start, runner.wait_prestarted)
        if note:
            log.info(note)
        saved, spec = spec, spec.replace(threads=spec.threads or auto)  # the folder keeps 'auto'; cells run with it
        slots = worker_slots(spec)
        env = runfolder.open_run(run_dir, options.resume, saved, options.given, registry, options.allow_env_change,
                                 options.command, slots, auto, dict.fromkeys(case for _, case in prepared.cells))
        done = store.done_keys(store.read_rows(run_dir, repair=True), options.retry)
        cells = [(name, case) for name, case in prepared.cells if store.cell_key(name, case) not in done]
        _say_plan(run_dir, spec, env, slots, len(cells), len(done))
        t0 = time.perf_counter()
        pool = WorkerPool(run_dir, spec, registry, slots, bars=options.bars if options.progress else events.silent,
                          keep_workers=options.keep_workers, costs=prepared.costs)
        try:
            with spans.span("sweep: first visits, the rest"):
                timed_s = pool.run(cells)
            idle = pool.idle
            counts = dict(pool.counts)  # this invocation's cells; a re-measured cell is counted once
            so_far = SweepSoFar(cells, run_dir, spec, slots[0].threads, pool, options,
                                lambda name: store.ResultWriter(run_dir, name))
            notes, settled, again_s = [], frozenset(), 0.0
            for p in sweep_passes():  # the features' passes after the first (bench.engine.passes)
                with spans.span(f"sweep: {p.name}, the rest"):
                    out = p.run(so_far)
                notes, settled, again_s = notes + list(out.notes), settled | out.settled, again_s + out.timed_s
        finally:
            with spans.span("sweep: workers stopped"):
                pool.close()
        with spans.span("sweep: run folder closed (rows read, env.json, end peak)"):
            rows = store.read_rows(run_dir)
            measured = runfolder.measured_times(cells, rows, time.perf_counter() - t0, len(slots), options) \
                if cells else {}
            runfolder.close_run(run_dir, spec, rows, pool.devices, measured)
    return RunSummary(run_dir, rows, counts, len(cells), len(done), time.perf_counter() - t0, timed_s + again_s,
                      notes, idle, settled)


def _say_plan(run_dir: Path, spec: Spec, env: dict, slots: list, todo: int, done: int) -> None:
    """The notes a sweep starts with: the folder, the cells to run and already there, where they
    run, the model's shapes, and on several CPU workers what they share."""
    where = f"{len(slots)} workers ({', '.join(s.label for s in slots)})" if len(slots) > 1 else \
        f"{env['threads']} threads"
    shard = f"; shard {spec.shard} of sweep {env['sweep_id']}" if spec.shard else ""
    log.info("run folder: %s  (%d cells to run, %d already there; device %s, %s%s)", run_dir, todo,
             done, spec.device, where, shard)
    if spec.model:
        from bench.model.models import model

        log.info(model(spec.model).summary(spec))
    if len(slots) > 1 and spec.device == "cpu":
        log.info("note: the workers have cores of their own but share the memory bandwidth and the caches: a "
                 "memory-bound cell can run slower beside another than alone")


def spec_cells(spec: Spec, registry) -> list:
    """(variant, case) of every cell of ``spec`` this invocation owns, in order (with ``spec.shard``
    only the shard's share): the preparation's cells (bench.engine.prepare), before the folder."""
    return prepare(spec, registry, until=FOLDER).cells


def contention_warning(rows: list[dict], spec) -> str:
    """A warning that counts the contended cells (of the rows that count) and says what to do, or ''."""
    ok = [r for r in current_rows(rows) if r.get("status") == "ok"]
    bad = [r for r in ok if "contended" in judge.shaky_flags(r)]
    if not bad:
        return ""
    return (f"warning: {len(bad)} of {len(ok)} ok cells were timed while the CPU was shared (contended: "
            f"e.g. {bad[0].get('contended_why')}). Their numbers are kept but flagged, drawn hollow and weighed "
            f"down in fits. For numbers you can trust, rerun on a quieter machine, or with fewer threads than "
            f"cores (--threads {max(1, len(cpuload.usable_cpus()) - 1)}) so that other processes have a core of "
            f"their own.")
