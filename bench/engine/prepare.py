"""A sweep prepared once, before anything is measured: the protocol through which a feature adds
to a sweep's preparation.

The core expands the spec's axes into its cells ((variant, case) pairs, in order), takes off the
cells the run folder holds already, and returns one ``Prepared`` sweep: the command line prints
it and hands it to the sweep, which runs it, so that the variants are discovered and the cells
expanded once per process.  A feature adds a ``Prep``, declared in bench/model/features.py as
``"module:NAME"`` among its ``preps``; the core runs the declared ones in ``order`` and names none.

- Below ``FOLDER`` (50), a prep sees every cell of the spec in ``cells``: it may narrow them (a
  shard's share, the same at every invocation of the spec) or price their cases (``costs``, which
  order the cases over several workers, largest first).
- The core then takes the folder's done cells off (``todo``).
- From ``FOLDER`` up, a prep sees what is left: the projection of the wall time (``projection``:
  ``lines()``, ``wall_s``, ``model_rest_s`` and ``model``, which env.json's history records).

``prepare(..., until=FOLDER)`` stops before the folder is read: the cells a spec owns, for a
sweep that reads its folder under its own lock (bench.engine.sweep) and for the commands that
count a folder's cells (status, the jobs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine import spans
from bench.engine.placement import worker_slots
from bench.model.features import declared
from bench.runs import store

FOLDER = 50  # the order at which the core takes the folder's done cells off


@dataclass
class Prepared:
    """A sweep as it is prepared (the module's docstring has the protocol)."""
    spec: object  # bench.model.spec.Spec
    registry: object
    workers: int  # the sweep's workers (bench.engine.placement)
    report: bool = True  # a report is built at the end
    others: float | None = None  # cores' worth of CPU other processes used at the start (the load probe)
    cells: list = field(default_factory=list)  # the spec's cells this invocation owns, in order
    todo: list = field(default_factory=list)  # of those, the ones the run folder lacks
    done: int = 0  # of those, the ones it holds
    costs: dict = field(default_factory=dict)  # case -> seconds, where a prep priced them
    projection: object = None  # where a prep projected the wall time


@dataclass(frozen=True)
class Prep:
    """One step of a sweep's preparation (the module's docstring has the protocol)."""
    name: str
    order: int
    run: Callable[[Prepared], None]


@functools.cache
def preps() -> tuple[Prep, ...]:
    """The declared steps of the preparation (bench.model.features), in their order."""
    return tuple(sorted(declared("preps"), key=lambda p: p.order))


def prepare(spec, registry, run_dir: Path | None = None, retry: frozenset = frozenset(), *, report: bool = True,
            others: float | None = None, until: int | None = None) -> Prepared:
    """``spec``'s sweep prepared into ``run_dir`` (None: a new folder): its cells, those the folder
    lacks (a cell whose newest row has a status in ``retry`` counts as lacking), and what the
    declared preps add; with ``until``, only the preps below it (and no folder read)."""
    with spans.span("start-up: the cells"):
        p = Prepared(spec, registry, len(worker_slots(spec)), report, others)
        p.cells = [(name, case) for case in spec.cases() for name in spec.variants]
    steps = preps()
    _run(p, [s for s in steps if s.order < FOLDER])
    if until is not None and until <= FOLDER:
        return p
    with spans.span("start-up: the cells the folder lacks"):
        done = set()
        if run_dir is not None and (Path(run_dir) / store.RESULTS).exists():
            done = store.done_keys(store.read_rows(run_dir), retry)
        p.todo = [(n, c) for n, c in p.cells if store.cell_key(n, c) not in done]
        p.done = len(p.cells) - len(p.todo)
    _run(p, [s for s in steps if s.order >= FOLDER and (until is None or s.order < until)])
    return p


def _run(p: Prepared, steps) -> None:
    for step in steps:
        with spans.span(f"start-up: {step.name}"):
            step.run(p)
