"""The passes of a sweep after its first: the protocol through which a feature adds to a sweep.

The core's sweep (bench.engine.sweep) opens the run folder, gives every cell its first visit
through the worker pool, and closes the folder.  A feature adds a ``Pass`` between the two,
declared in bench/model/features.py as ``"module:NAME"`` among its ``passes``; the sweep runs
each declared pass in ``order``, inside a span of its name, and names none.  A pass reads the
sweep so far (``SweepSoFar``: its cells, its folder, its spec, the pool with its workers alive)
and returns a ``PassResult``: the seconds it timed, what it did in words (the sweep's closing
notes), and the shaky flags it already tried to settle (the remedies then suggest something
else).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.model.features import declared


@dataclass(frozen=True)
class SweepSoFar:
    """A sweep after its first visits: what a pass works from."""
    cells: list  # (variant, case) of this invocation
    run_dir: Path
    spec: object  # bench.model.spec.Spec, with the threads the cells ran with
    threads: int | None
    pool: object  # bench.engine.pool.WorkerPool: run(cells), measured, workers, bars, retimed
    options: object  # bench.engine.sweep.SweepOptions
    writer: Callable[[str], object]  # a file name of the run folder -> its ResultWriter


@dataclass(frozen=True)
class PassResult:
    timed_s: float = 0.0
    notes: tuple = ()
    settled: frozenset = frozenset()  # shaky flags this pass tried to settle (judge.SHAKY's names)


@dataclass(frozen=True)
class Pass:
    """One pass of a sweep after its first (the module's docstring has the protocol)."""
    name: str
    order: int
    run: Callable[[SweepSoFar], PassResult]


@functools.cache
def sweep_passes() -> tuple[Pass, ...]:
    """The declared passes (bench.model.features), in their order."""
    return tuple(sorted(declared("passes"), key=lambda p: p.order))
