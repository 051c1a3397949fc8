"""The sweep's workers and what they have done: cases dealt out to the workers, each cell's row
appended as soon as it is known, and a group re-run one variant at a time after a crash.  The
passes after the first (re-measurement, later visits, the profiled pass) are the features'
(bench.engine.passes), run on this pool's workers."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from bench.engine import events
from bench.engine.cell import REFERENCE
from bench.engine.result import base_row
from bench.engine.runner import Worker, WorkerSettings, park, release_prestarted, reuse
from bench.measure.settings import MeasureSettings
from bench.model.case import Case
from bench.model.registry import available
from bench.model.row import STATUSES, ReasonKind
from bench.model.spec import Spec
from bench.runs import store

log = logging.getLogger(__name__)  # printed by the handler the command line installs (bench.engine.events)


class WorkerPool:
    """The sweep's workers and what they have done.  Each cell becomes a row, appended as soon as
    it is known; an unavailable cell is recorded as 'unsupported' without launching it.  The
    variants of one case go to one worker together, to be timed in interleaved rounds; when
    the worker dies or overruns in a group, the variants still without a row run again one at
    a time, so that the cell that crashed is the one marked, and only that worker restarts.
    With several workers (``slots``, one thread each here), cases are dealt out largest first (by
    ``costs``, case: seconds, as the sweep's preparation priced them; in order without) to
    whichever worker is free; every row goes through the one writer.

    After ``run(cells)``: ``counts`` (status: cells), ``timed_s`` (seconds in timed samples),
    ``measured`` (case: variants measured ok) and ``devices`` (worker label: its device)."""

    def __init__(self, run_dir: Path, spec: Spec, registry, slots: list, bars: events.Bars = events.silent,
                 keep_workers: bool = False, costs: dict | None = None):
        self.run_dir, self.spec, self.registry, self.slots = run_dir, spec, registry, slots
        self.costs = costs or {}
        self.bars = bars  # makes the progress of each pass (bench.engine.events; the command line's draw bars)
        self.keep_workers = keep_workers  # leave the workers idle for the next sweep of this process
        many = len(slots) > 1
        self.settings = {s.label: MeasureSettings.from_spec(spec, s.threads) for s in slots}
        self.workers = [reuse(WorkerSettings(measure=self.settings[slot.label], plugins=spec.plugins,
                                             env=dict(slot.env), cpus=tuple(slot.cpus), device=spec.device,
                                             log_path=str(run_dir / (f"worker-{i}.log" if many else "worker.log"))))
                        for i, slot in enumerate(slots)]
        self.counts = dict.fromkeys(STATUSES, 0)
        self.retimed = self.retimed_clean = 0  # rows timed again in place (contention.retime.Held), clean ones
        self.idle = 0  # of the cells of the last run(), those that cannot run here (never launched)
        self.timed_s = 0.0
        self.measured: dict = {}
        self.together: dict = {}  # cell key: the interleave_id of its newest ok row (its later visits' ``of``)
        self._lock = threading.Lock()
        self._queue: list = []
        self._raised: list = []  # an exception in a worker's thread: the others stop, run() raises it
        self._writer = self._bar = None

    @property
    def devices(self) -> dict:
        return {s.label: w.device_name for s, w in zip(self.slots, self.workers) if w.device_name}

    def run(self, cells) -> float:
        """Measure ``cells`` ((variant name, case) pairs); returns the seconds timed in this call."""
        before = self.timed_s
        groups = list(_by_case(cells))
        if len(self.slots) > 1 and self.costs:  # largest first, each to the next free worker
            groups.sort(key=lambda item: -self.costs.get(item[0], 0.0))
        self._queue = list(reversed(groups))
        self._writer = store.ResultWriter(self.run_dir)
        self.idle = sum(1 for name, case in cells if self.registry[name].static_reason(case) is not None)
        self._bar = self.bars(total=len(cells) - self.idle, unit="cell")  # a cell that cannot run here: not swept
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

    def close(self) -> None:
        if not self.keep_workers:
            for w in self.workers:  # all at once: each takes a moment to exit
                w.ask_to_stop()
        for w in self.workers:
            if self.keep_workers:  # idle for the next sweep of this process (gpu-check's steps)
                park(w)
            else:
                w.stop()
        release_prestarted()

    # -- inside the worker threads -----------------------------------------------------------
    def _record(self, row: dict, label: str, swept: bool = True) -> None:
        if row.get("budget_ms") is None:  # a row made here, for a cell that never ran in a worker
            self.settings[label].stamp(row, row["device"])
        with self._lock:
            row["worker"] = label
            self._writer.write(row)
            again = bool(row.get("retimed"))  # a cell timed again in place: counted once, at its first row
            if row["status"] == "ok":
                names = self.measured.setdefault(Case.from_dict(row), [])
                if row["variant"] not in names:
                    names.append(row["variant"])
                self.together[store.cell_key(row["variant"], row)] = row.get("interleave_id")
            if again:
                self.retimed += 1
                self.retimed_clean += not row.get("contended")
            else:
                self.counts[row["status"]] += 1
                if swept:
                    self._bar.update(1)
            self.timed_s += row.get("timed_s") or 0.0

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
                    if self._raised:
                        return
                    if not self._queue:
                        break
                    case, names = self._queue.pop()
                    self._bar.describe(case.label())
                runnable = []
                for name in names:
                    ok, why = available(self.registry[name], case, probe=False)  # probes run in the worker
                    if ok:
                        runnable.append(name)
                    else:
                        static = self.registry[name].static_reason(case)
                        kind = ReasonKind.CAPABILITY if static else ReasonKind.ENVIRONMENT
                        self._record(base_row(name, case, "unsupported", why, kind.value), label, swept=not static)
                if runnable:
                    self._run_group(worker, label, runnable, case)
            # the contended cases it still holds: timed again now, with no case after them
            worker.flush(self.spec.timeout, lambda row: self._record(row, label))
        except BaseException as exc:
            self._raised.append(exc)


def _by_case(cells):
    """(case, [variant names]) in the order the cells come."""
    groups: dict = {}
    for name, case in cells:
        groups.setdefault(case, []).append(name)
    return groups.items()
