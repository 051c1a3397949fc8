"""The context-parallel cells of a case (variants declared with ``shard=``), in the worker: each
variant's ranks measure it in the worker's process group (bench.engine.group), the case's scope
puts their measurements together (``reduce``: bench.scopes.context), and the worker checks the
gathered output and gradients against the float64 reference of the whole sequence, as every
cell's are, and writes one row per variant with each rank's figures beside the step's."""

from __future__ import annotations

import os
import time
import uuid

from bench.engine import group
from bench.engine.result import CellResult
from bench.errors import first_line
from bench.measure.correctness import check, check_form
from bench.measure.timing import Timing
from bench.model import scope
from bench.model.registry import probe_reason
from bench.model.row import ReasonKind, Status
from bench.model.shards import shard_reason


def rank_threads(case, settings) -> int:
    """A rank's torch threads: one on the CPU (P ranks share the cores; beyond them the cell is
    contended), the worker's on a GPU (each rank drives its own device)."""
    return 1 if case.device == "cpu" else int(settings.threads or 1)


def contention(case, threads: int) -> dict:
    """The CPU's verdict on a cell of several ranks: contended when the threads of its ranks on this
    node outnumber the cores this worker may use."""
    if case.device != "cpu":
        return {}
    from bench.engine.hosts import split

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    here = split(case.ranks, "cpu", case.ranks)[0]  # this node's ranks (a job of several nodes spreads them)
    if here * threads > cores:
        return {"contended": True, "contended_why": f"{here} ranks of {threads} thread(s) on {cores} core(s)"}
    return {"contended": False, "contended_why": ""}


def run_ranked(variants, case, settings, emit, at, cache, inputs, skip_reference: str = "") -> None:
    """Measure the context-parallel ``variants`` on ``case``, one row each (every path ends in one)."""
    where = scope.of(case)
    for var in variants:
        at(var.name)
        started = time.monotonic()
        threads = rank_threads(case, settings)  # the row records each rank's threads
        result = CellResult(var.name, case, settings.replace(threads=threads), approximate=var.approximate)
        try:
            why = shard_reason(case, var.shard)
            if why:
                emit(result.decide(Status.UNSUPPORTED, why, ReasonKind.CAPABILITY).row())
                continue
            why = probe_reason(var, case)
            if why:
                emit(result.decide(Status.UNSUPPORTED, why, ReasonKind.LIBRARY).row())
                continue
            ranks = group.group_for(where.processes(case), case.device, group.WORKER["plugins"], threads,
                                    group.answer_within(started))
            measured = ranks.run(group.RankJob(var.name, case.to_dict(), settings), group.answer_within(started))
            m = where.reduce(measured, case, var.shard)
        except group.GroupFault as fault:
            emit(result.decide(Status(fault.status), fault.reason, fault.kind or None).row())
            continue
        except Exception as exc:  # the harness's side: the group could not be had, or its answers read
            emit(result.fail(exc, "the ranks' measurement").row())
            continue
        result.setup_ms, result.extra = m["setup_ms"], dict(m["info"])
        try:
            _check(result, var, case, where, m, inputs, cache, skip_reference)
        except Exception as exc:
            result.decide(Status.ERROR, f"checking the gathered shards: {type(exc).__name__}: {first_line(exc)}")
        if result.status is None:
            samples = m["samples_ms"]
            result.timing = Timing(samples, 1, m["warmup_calls"], m["timer"], threads=threads,
                                   timed_s=sum(samples) / 1e3, cpu_s=None).summary()
            result.peak_mem_bytes, result.ranked = m["peak_mem_bytes"], m["columns"]
            result.interleave_id = uuid.uuid4().hex[:12]
            result.contention = contention(case, threads)
            result.decide(Status.OK)
        emit(result.row())


def _check(result, var, case, where, m, inputs, cache, skip_reference: str) -> None:
    out, grads = m["out"], m["grads"]
    if skip_reference or inputs is None:
        result.reference_skipped = skip_reference or "the scope gives no shared inputs"
        result.checked(check_form(case, out))
        return
    ref = where.reference(case, inputs, cache)
    device = ref.out.device
    out = out.to(device) if hasattr(out, "to") else out
    grads = tuple(None if g is None else g.to(device) for g in grads) if grads else None
    form = check_form(case, out)
    if not form.ok:
        result.checked(form)
        return
    out, grads = ref.select(out, grads)
    checked = check(case, out, ref.out, grads, ref.grads, var.error_budget, var.approximate, ref.atol_scale)
    checked.max_logit = ref.max_logit
    result.checked(checked)
