"""``sweep --profile``: the sweep's profiled pass (a ``Pass``, bench.engine.passes): every cell
measured ok profiled again in the worker after all the timing (bench.features.profile.profiler), into the
run folder's profile.jsonl."""

from __future__ import annotations

import logging

from bench.engine.passes import Pass, PassResult, SweepSoFar
from bench.runs import store

log = logging.getLogger(__name__)  # printed by the handler the command line installs (bench.engine.events)

PROFILE_TASK = "bench.features.profile.profiler:profile_group"  # the worker's part of the profiled pass (Job.task)


def _pass(s: SweepSoFar) -> PassResult:
    """sweep --profile: every cell measured ok, profiled again after all the timing (a
    profiler must not run just before a timed loop), by the first worker, into profile.jsonl."""
    if not s.options.profile or not s.pool.measured:
        return PassResult()
    worker, measured, timeout = s.pool.workers[0], s.pool.measured, s.spec.timeout
    writer = s.writer(store.PROFILE)
    bar = s.pool.bars(total=len(measured), unit="case", desc="profile")
    try:
        for case, names in measured.items():
            names = [n for n in names if not s.pool.registry[n].shard]  # context-parallel: on its ranks only
            bar.describe(f"profiling {case.label()}")
            if not names:
                bar.update(1)
                continue
            tag, why = worker.run_group(names, case, timeout, writer.write, task=PROFILE_TASK)
            if tag != "done":
                log.warning("the profiled pass of %s ended early: %s", case.label(), why)
            bar.update(1)
    finally:
        bar.close()
        writer.close()
    return PassResult()


PASS = Pass("profiled pass", 30, _pass)
