"""The sweep engine: expand a Spec, run every cell in the isolated worker, and append each
row to the run folder as soon as it is known.  Plain values in, a RunSummary out: the
command line (``bench.cli.sweep``) decides what to print and whether to build the report."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine import judge, maskfile, peaks, store
from bench.engine import remeasure as again
from bench.engine.cell import REFERENCE, base_row
from bench.engine.runner import Worker, WorkerSettings, park, release_prestarted, reuse
from bench.errors import UsageError
from bench.measure import contention
from bench.measure.settings import MeasureSettings
from bench.model.case import Case
from bench.model.registry import available
from bench.model.row import STATUSES, ReasonKind
from bench.model.spec import Spec, shard_pair


@dataclass(frozen=True)
class SweepOptions:
    """How one invocation runs a spec into a run folder (the spec says what is measured)."""
    resume: bool = False  # the folder holds an earlier run: measure only the cells it lacks
    retry: frozenset = frozenset()  # with resume: statuses whose cells are measured again
    allow_env_change: bool = False  # with resume: go on on a machine whose fingerprint differs
    profile: bool = False  # a profiled pass over every ok cell after the timing
    progress: bool = True  # a progress bar on stderr
    given: dict = field(default_factory=dict)  # the settings as the user gave them (env.json)
    command: str = ""  # the command line, for env.json's history
    projected_s: float | None = None  # the plan's projected wall time of the command (env.json's history)
    model_rest_s: float | None = None  # the cost model's time for the cells less their setups (plans learn from it)
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
    remeasured: list = field(default_factory=list)  # what the end-of-sweep re-measurement did, in words


def run_sweep(spec: Spec, run_dir: Path, options: SweepOptions = SweepOptions()) -> RunSummary:
    """Measure every cell of ``spec`` that ``run_dir`` lacks, appending each row as soon as
    it is known; returns what was done. One sweep at a time writes a folder (a lock)."""
    from bench.engine.discovery import discover

    registry = discover(spec.plugins)
    run_dir = store.writable_dir(run_dir)
    with store.locked(run_dir):
        auto, note = again.auto_threads(spec)
        if note:
            print(note, file=sys.stderr)
        saved, spec = spec, spec.replace(threads=spec.threads or auto)  # the folder keeps 'auto'; cells run with it
        slots = worker_slots(spec)
        env = _open_run(run_dir, options.resume, saved, options.given, registry, options.allow_env_change,
                        options.command, slots, auto)
        done = store.done_keys(store.read_rows(run_dir, repair=True), options.retry)
        cells = [(name, case) for name, case in spec_cells(spec, registry) if store.cell_key(name, case) not in done]
        where = f"{len(slots)} workers ({', '.join(s.label for s in slots)})" if len(slots) > 1 else \
            f"{env['threads']} threads"
        print(f"run folder: {run_dir}  ({len(cells)} cells to run, {len(done)} already there; "
              f"device {spec.device}, {where}" + (f"; shard {spec.shard} of sweep {env['sweep_id']}" if spec.shard
                                                  else "") + ")", file=sys.stderr)
        if spec.model:
            from bench.model.models import model

            print(model(spec.model).summary(spec), file=sys.stderr)
        if len(slots) > 1 and spec.device == "cpu":
            print("note: the workers have cores of their own but share the memory bandwidth and the caches: a "
                  "memory-bound cell can run slower beside another than alone", file=sys.stderr)
        t0 = time.perf_counter()
        pool = WorkerPool(run_dir, spec, registry, options, slots)
        try:
            timed_s = pool.run(cells)
            counts = dict(pool.counts)  # this invocation's cells; a re-measured cell is counted once
            notes, again_s = again.remeasure(cells, run_dir, spec, slots[0].threads, pool.run)
            if options.profile:
                pool.profile()
        finally:
            pool.close()
        rows = store.read_rows(run_dir)
        measured = _measured_times(cells, rows, time.perf_counter() - t0, len(slots), options) if cells else {}
        _close_run(run_dir, spec, rows, pool.devices, measured)
    return RunSummary(run_dir, rows, counts, len(cells), len(done), time.perf_counter() - t0, timed_s + again_s,
                      notes)


def _measured_times(cells, rows, wall_s: float, workers: int, options) -> dict:
    """This invocation's times for env.json's history: its cells' wall time, their setups
    (per worker), and the rest, next to what the plan projected and modelled."""
    keys = {store.cell_key(n, c) for n, c in cells}
    mine = [r for r in store.current_rows(rows) if store.cell_key(r["variant"], r) in keys]
    setup = sum((r.get("setup_ms") or 0.0) / 1e3 for r in mine) / max(1, workers)
    ok = [r for r in rows if r.get("status") == "ok" and store.cell_key(r["variant"], r) in keys]  # re-measured too
    contended = sum(1 for r in ok if "contended" in judge.shaky_flags(r))
    return {"cells_wall_s": round(wall_s, 3), "setup_s": round(setup, 3),
            "measured_rest_s": round(max(0.0, wall_s - setup), 3), "projected_s": options.projected_s,
            "model_rest_s": options.model_rest_s, "others_cores_start": options.others_cores_start,
            "contended_share": round(contended / len(ok), 3) if ok else None}


def spec_cells(spec: Spec, registry) -> list:
    """(variant, case) of every cell of ``spec``, in order; with ``spec.shard`` only the
    shard's share (bench.engine.plan: the same for every invocation of the spec)."""
    cells = [(name, case) for case in spec.cases() for name in spec.variants]
    if spec.shard:
        from bench.engine import plan

        cells = plan.shard_cells(cells, registry, spec.budget_ms, shard_pair(spec.shard))
    return cells


def worker_slots(spec: Spec) -> list:
    """Where the sweep's workers run (bench.engine.placement)."""
    from bench.engine import placement

    if spec.gpus and spec.device != "cuda":
        gpus = []  # refused by place(), with what to give instead
    else:
        gpus = placement.parse_gpus(spec.gpus, placement.visible_gpus()) if spec.gpus else None
    cpus = placement.available_cpus() if spec.device == "cpu" else []
    return placement.place(spec.device, spec.workers, gpus, cpus, spec.threads, placement.visible_ids())


def contention_warning(rows: list[dict], spec) -> str:
    """A warning that counts the contended cells (of the rows that count) and says what to do, or ''."""
    ok = [r for r in store.current_rows(rows) if r.get("status") == "ok"]
    bad = [r for r in ok if "contended" in judge.shaky_flags(r)]
    if not bad:
        return ""
    return (f"warning: {len(bad)} of {len(ok)} ok cells were timed while the CPU was shared (contended: "
            f"e.g. {bad[0].get('contended_why')}). Their numbers are kept but flagged, drawn hollow and left "
            f"out of fits. For numbers you can trust, rerun on a quieter machine, or with fewer threads than "
            f"cores (--threads {max(1, len(contention.usable_cpus()) - 1)}) so that other processes have a core of "
            f"their own.")


def _open_run(run_dir: Path, resumed: bool, spec, given: dict, registry, allow_env_change: bool = False,
              command: str = "", slots=(), auto: int | None = None):
    """The run folder with its env.json written: the fingerprint, the spec, the load
    average, the matmul peak of every dtype the spec uses and the copy bandwidth (measured
    once per run, at the sweep's thread count), and a history entry for this invocation.  A resume on a machine
    whose fingerprint differs is refused unless ``allow_env_change``; then env.json says
    the run is mixed."""
    from bench.measure.envinfo import fingerprint, peak_run_ms

    here = fingerprint(spec.device)
    here["threads"] = spec.threads or auto or here["threads"]
    env = store.read_env(run_dir) if resumed else {}
    if env:
        before = (env.get("history") or [{}])[-1].get("fingerprint") or {k: env.get(k) for k in judge.FINGERPRINT}
        changed = judge.fingerprint_changes(before, here)
        chosen = spec.threads is None and all(c.startswith("threads:") for c in changed)
        if changed and chosen:  # --threads auto chose another count under another load: noted, not refused
            changed = [f"{c} (--threads auto)" for c in changed]
            print(f"note: {changed[0]}: the load differs from the run's last invocation; env.json's history "
                  f"keeps both and the report says the folder mixes conditions", file=sys.stderr)
        elif changed and not allow_env_change:
            raise UsageError(f"--resume {run_dir}: this machine differs from the run's ({'; '.join(changed)}); its "
                             f"rows would not compare. --allow-env-change resumes anyway and marks the run mixed")
        if changed:
            env.setdefault("mixed_env", []).extend(changed)
        old = env.get("spec") or {}
        differs = sorted(k for k, v in spec.to_dict().items() if k in old and old[k] != v)
        if differs:
            print(f"note: the spec differs from the run's in {', '.join(differs)}; both stay in env.json's "
                  f"history, and every row records its own settings", file=sys.stderr)
        env.setdefault("resumed", []).append(command)
    else:
        env = here | {"peaks_tflops": {}}
    env["threads"] = here["threads"]
    import torch

    # what the workers run under (--deterministic sets it in each, per job)
    env["deterministic_algorithms"] = bool(spec.deterministic) or torch.are_deterministic_algorithms_enabled()
    baseline = registry.baseline()
    from bench.model.spec import sweep_id

    env |= {"given": given, "spec": spec.to_dict(), "baseline": baseline.name if baseline else None,
            "loadavg_start": contention.load_average(), "sweep_id": sweep_id(spec), "shard": spec.shard,
            "workers": [s.label for s in slots]}
    threads = slots[0].threads if len(slots) > 1 else (spec.threads or auto)  # the peak at one worker's threads
    env["peak_threads"] = threads
    env["peak_run_ms"] = run_ms = peak_run_ms(spec.device, spec.budget_ms)
    env.setdefault("history", []).append({
        "command": command, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "spec": spec.to_dict(), "fingerprint": {k: here.get(k) for k in judge.FINGERPRINT},
        "loadavg_start": env["loadavg_start"]})
    peaks.fill(env, here, spec, threads, run_ms)  # the matmul peaks and the copy bandwidth: cached or measured
    store.write_env(run_dir, env)
    _write_mask_pictures(run_dir, spec)
    return env


def _write_mask_pictures(run_dir: Path, spec) -> None:
    """masks.json: every mask of the sweep, its definition and keep pattern at n = 256 (the report's pictures)."""
    pictures = store.read_masks(run_dir)
    for case in spec.cases():
        name = maskfile.label(case.mask, case.window)
        if name not in pictures:
            pictures[name] = maskfile.picture(case)
    store.write_json(run_dir, store.MASKS, pictures)


def _close_run(run_dir: Path, spec, rows: list[dict], devices: dict | None = None,
               measured: dict | None = None) -> None:
    """The end of a sweep in env.json: the load average, and the matmul peak measured again.
    The peak kept is the higher of the two; a cell above it means the peak is still wrong,
    and env.json says so, with the figure (``peak_unreliable``; the report finds the same
    from the rows).  Approximate variants have no TFLOP/s of their own and do not count.
    The end peak is measured again, after a wait for quiet, when other processes took the
    cores while it ran (``peak_checks[dtype]["end_under_load"]`` when they still did)."""
    env = store.read_env(run_dir)
    env["loadavg_end"] = contention.load_average()
    this = (env.get("history") or [{}])[-1]  # this invocation's conditions, beside the folder's
    this["loadavg_end"] = env["loadavg_end"]
    this.update(measured or {})  # its projected and measured times (bench.engine.plan learns from them)
    env["worker_devices"] = (env.get("worker_devices") or {}) | (devices or {})  # worker: what it measured on
    checks = env.setdefault("peak_checks", {})
    best_cell = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("tflops") and not r.get("approximate"):  # an older row may have one
            best_cell[r["dtype"]] = max(best_cell.get(r["dtype"], 0.0), float(r["tflops"]))
    unreliable = env.setdefault("peak_unreliable", {})
    threads = env.get("peak_threads", spec.threads)
    sources = env.get("peaks_source") or {}
    for dtype in spec.dtypes:
        start = env["peaks_tflops"].get(dtype, 0.0)
        if str(sources.get(dtype, "")).startswith("cached"):  # measured recently on this machine: not again
            end, loaded = start, ""
        else:
            end, loaded = again.unloaded_peak(spec, dtype, threads)
            peaks.PeakCache(spec.peak_age).put(peaks.key(env, "tflops", dtype, threads, env.get("peak_run_ms", 0.0)),
                                               end)
        checks[dtype] = {"start": start, "end": end} | ({"end_under_load": loaded} if loaded else {})
        this.setdefault("peaks_end", {})[dtype] = end
        env["peaks_tflops"][dtype] = peak = max(start, end)
        top = best_cell.get(dtype, 0.0)
        if peak and top > peak:  # a dtype with no matmul here (fp8 on the CPU) has no peak: 0
            unreliable[dtype] = (f"a cell reached {100 * top / peak:.0f}% of the measured {dtype} matmul peak "
                                 f"({peak:.3g} TFLOP/s, measured at the start and again at the end): the peak "
                                 f"is too low for this machine, so % of peak is not reliable for {dtype}")
        else:
            unreliable.pop(dtype, None)
    store.write_env(run_dir, env)


class WorkerPool:
    """The sweep's workers and what they have done.  Each cell becomes a row, appended as soon as
    it is known; an unavailable cell is recorded as 'unsupported' without launching it.  The
    variants of one case go to one worker together, to be timed in interleaved rounds; when
    the worker dies or overruns in a group, the variants still without a row run again one at
    a time, so that the cell that crashed is the one marked, and only that worker restarts.
    With several workers (``slots``, one thread each here), cases are dealt out largest first
    to whichever worker is free; every row goes through the one writer.

    After ``run(cells)``: ``counts`` (status: cells), ``timed_s`` (seconds in timed samples),
    ``measured`` (case: variants measured ok) and ``devices`` (worker label: its device)."""

    def __init__(self, run_dir: Path, spec: Spec, registry, options: SweepOptions, slots: list):
        self.run_dir, self.spec, self.registry, self.options, self.slots = run_dir, spec, registry, options, slots
        many = len(slots) > 1
        self.settings = {s.label: MeasureSettings.from_spec(spec, s.threads) for s in slots}
        self.workers = [reuse(WorkerSettings(measure=self.settings[slot.label], plugins=spec.plugins,
                                             env=dict(slot.env), cpus=tuple(slot.cpus),
                                             log_path=str(run_dir / (f"worker-{i}.log" if many else "worker.log"))))
                        for i, slot in enumerate(slots)]
        self.counts = dict.fromkeys(STATUSES, 0)
        self.timed_s = 0.0
        self.measured: dict = {}
        self._lock = threading.Lock()
        self._queue: list = []
        self._raised: list = []  # an exception in a worker's thread: the others stop, run() raises it
        self._writer = self._bar = None

    @property
    def devices(self) -> dict:
        return {s.label: w.device_name for s, w in zip(self.slots, self.workers) if w.device_name}

    def run(self, cells) -> float:
        """Measure ``cells`` ((variant name, case) pairs); returns the seconds timed in this call."""
        from tqdm import tqdm

        from bench.engine import plan

        before = self.timed_s
        groups = list(_by_case(cells))
        if len(self.slots) > 1:  # largest first, each to the next free worker
            rounds, ceiling_ms = plan.timing_of(self.spec)
            cost = {g.case: g.cost_s for g in plan.groups(cells, self.registry, self.spec.budget_ms, rounds=rounds,
                                                          ceiling_ms=ceiling_ms)}
            groups.sort(key=lambda item: -cost[item[0]])
        self._queue = list(reversed(groups))
        self._writer = store.ResultWriter(self.run_dir)
        self._bar = tqdm(total=len(cells), unit="cell", dynamic_ncols=True, file=sys.stderr,
                         disable=not self.options.progress)
        try:
            if len(self.slots) == 1:
                self._serve(self.workers[0], self.slots[0].label)
            else:
                threads = [threading.Thread(target=self._serve, args=(w, s.label), daemon=True)
                           for w, s in zip(self.workers, self.slots)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            if self._raised:
                raise self._raised[0]
        finally:
            self._bar.close()
            self._writer.close()
        return self.timed_s - before

    def profile(self) -> None:
        """sweep --profile: every cell measured ok, profiled again after all the timing."""
        if self.measured:
            _profile_pass(self.workers[0], self.run_dir, self.measured, self.spec.timeout, self.options.progress)

    def close(self) -> None:
        if not self.options.keep_workers:
            for w in self.workers:  # all at once: each takes a moment to exit
                w.ask_to_stop()
        for w in self.workers:
            if self.options.keep_workers:  # idle for the next sweep of this process (gpu-check's steps)
                park(w)
            else:
                w.stop()
        release_prestarted()

    # -- inside the worker threads -----------------------------------------------------------
    def _record(self, row: dict, label: str) -> None:
        if row.get("budget_ms") is None:  # a row made here, for a cell that never ran in a worker
            self.settings[label].stamp(row, row["device"])
        with self._lock:
            row["worker"] = label
            self._writer.write(row)
            if row["status"] == "ok":
                self.measured.setdefault(Case.from_dict(row), []).append(row["variant"])
            self.counts[row["status"]] += 1
            self.timed_s += row.get("timed_s") or 0.0
            self._bar.update(1)

    def _run_group(self, worker: Worker, label: str, names: list[str], case, skip_reference: str = "") -> None:
        got = []
        tag, why = worker.run_group(names, case, self.spec.timeout,
                                    lambda row: (got.append(row["variant"]), self._record(row, label)),
                                    skip_reference=skip_reference)
        missing = [n for n in names if n not in got]
        if tag == "done" or not missing:
            return
        if tag == "restart":  # a variant left work running (its row says so): the rest on a fresh worker
            self._run_group(worker, label, missing, case, skip_reference)
            return
        if worker.last_started == REFERENCE:  # the reference overran its own deadline or took the worker down:
            # the variants are timed all the same, unchecked, on a fresh worker (no variant is blamed)
            self._run_group(worker, label, missing, case, f"the float64 reference {tag}: {why}"[:300])
            return
        culprit = worker.last_started if worker.last_started in missing else None
        if culprit is None and len(missing) == 1:
            culprit = missing[0]
        if culprit is None:
            for name in missing:  # find the culprit: one at a time
                self._run_group(worker, label, [name], case)
            return
        self._record(base_row(culprit, case, tag, why), label)  # it was running when the worker died or hung
        rest = [n for n in missing if n != culprit]
        if rest:
            self._run_group(worker, label, rest, case)

    def _serve(self, worker: Worker, label: str) -> None:
        try:
            while True:
                with self._lock:
                    if not self._queue or self._raised:
                        return
                    case, names = self._queue.pop()
                    self._bar.set_postfix_str(f"{case.label()}", refresh=False)
                runnable = []
                for name in names:
                    ok, why = available(self.registry[name], case, probe=False)  # probes run in the worker
                    if ok:
                        runnable.append(name)
                    else:
                        static = self.registry[name].static_reason(case)
                        kind = ReasonKind.CAPABILITY if static else ReasonKind.ENVIRONMENT
                        self._record(base_row(name, case, "unsupported", why, kind.value), label)
                if runnable:
                    self._run_group(worker, label, runnable, case)
        except BaseException as exc:
            self._raised.append(exc)


def _profile_pass(worker, run_dir: Path, measured: dict, timeout: float, progress: bool) -> None:
    """sweep --profile: every cell measured ok, profiled again after all the timing (a
    profiler must not run just before a timed loop), into profile.jsonl."""
    from tqdm import tqdm

    writer = store.ResultWriter(run_dir, store.PROFILE)
    bar = tqdm(total=len(measured), unit="case", dynamic_ncols=True, file=sys.stderr, disable=not progress)
    try:
        for case, names in measured.items():
            bar.set_postfix_str(f"profiling {case.label()}", refresh=False)
            tag, why = worker.run_group(names, case, timeout, writer.write, profile=True)
            if tag != "done":
                print(f"warning: the profiled pass of {case.label()} ended early: {why}", file=sys.stderr)
            bar.update(1)
    finally:
        bar.close()
        writer.close()


def _by_case(cells):
    """(case, [variant names]) in the order the cells come."""
    groups: dict = {}
    for name, case in cells:
        groups.setdefault(case, []).append(name)
    return groups.items()
