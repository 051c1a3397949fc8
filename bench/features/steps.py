"""What a step costs beyond the kernel (``--steps K``): K steps, each with a freshly drawn batch,
each set up again and called once, timed by the wall clock (synchronized on a GPU).

A step is what a training or serving loop pays per batch: the variant's preparation for the
batch's structure (a block mask, a bias, nested-tensor offsets: ``prep_ms``), any compile or
recompile its new shapes cause, and the call (forward, and backward for a case with one).
A variant whose setup makes its first call itself (flex compiles by calling) is not called a
second time.  Recompiles are counted from dynamo's counter of the graphs it compiled.

The batches: a ragged batch (``--lengths``) draws new lengths from its distribution each step,
without holding their mean to n, so the number of tokens varies as a real loader's does (the
shapes a static compile must recompile for); every other case repeats its structure, so its
steps show the cost of preparing it again.  The first compile of the case happened in the
cell's setup; ``compile_warm_ms`` is the same case compiled again after ``torch._dynamo.reset()``,
with inductor's caches warm.
"""

from __future__ import annotations

import statistics
import time

import torch

from bench.errors import first_line
from bench.measure.cellsteps import Step, Timed
from bench.measure.inputs import make_grad_out, make_inputs
from bench.model import scope
from bench.model.case import Case
from bench.model.registry import Variant
from bench.model.workload import free_lengths


def step_cases(case: Case, k: int) -> list[Case]:
    """The K batches of ``case``'s steps."""
    if not case.ragged:
        return [case] * k
    out = []
    for seed in range(1, k + 1):
        lens = free_lengths(case.lengths, case.batch, case.q_len, seed)
        n = sum(lens) // case.batch
        out.append(case.replace(lengths="/".join(map(str, lens)), q_len=n, kv_len=n))
    return out


def _graphs() -> int:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run_steps(variant: Variant, case: Case, k: int) -> dict:
    """The row's step figures: each step's wall ms, its prep ms, the recompiles, the median
    step and the steady one (the median of the second half), and, for a variant that compiles,
    the warm compile.  A layer case (``--scope``) has none: the steps are the core's preparation."""
    if not scope.of(case).core_alone:
        raise ValueError(f"--steps time the core's own preparation per batch: scope core, not {case.scope}")
    steps, preps, recompiled, lengths = [], [], [], []
    for sc in step_cases(case, k):
        q, kk, v = make_inputs(sc)
        grad = make_grad_out(sc) if sc.needs_grad else None
        _sync(sc.device)
        before = _graphs()
        t0 = time.perf_counter()
        prepared = variant.prepare(sc)
        if "compile_ms" not in prepared.info:  # a setup that compiles has made the first call itself
            with prepared.scope():
                out = prepared.fn(q, kk, v)
                if grad is not None:
                    out.backward(grad)
        _sync(sc.device)
        steps.append((time.perf_counter() - t0) * 1e3)
        preps.append(float(prepared.info.get("prep_ms") or 0.0))
        recompiled.append(max(0, _graphs() - before))
        lengths.append(sc.batch * sc.q_len)
    half = steps[len(steps) // 2:]
    out = {"steps": k, "step_ms": [round(s, 4) for s in steps], "step_median_ms": statistics.median(steps),
           "step_steady_ms": statistics.median(half), "step_prep_ms": statistics.median(preps),
           "recompiles": sum(recompiled), "step_recompiles": recompiled, "step_tokens": lengths}
    if variant.compiles:
        out["compile_warm_ms"] = _warm_compile(variant, case)
    return out


def _warm_compile(variant: Variant, case: Case) -> float | None:
    """The case compiled again after dynamo forgets it: inductor's caches hit."""
    torch._dynamo.reset()
    prepared = variant.prepare(case)
    return prepared.info.get("compile_ms")


def _steps(t: Timed) -> None:
    """--steps: what a step costs beyond the kernel; the cell's timing stays when they fail."""
    try:
        t.result.extra.update(run_steps(t.item.variant, t.case, t.settings.steps))
    except Exception as exc:
        t.result.extra["steps_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]


STEP = Step("steps", 70, lambda t: bool(getattr(t.settings, "steps", 0)), _steps)
