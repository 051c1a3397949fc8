"""``python -m bench selfcheck``: our timer next to the field's tools, in one process.

For each cell the harness's median is printed beside torch.utils.benchmark's
blocked_autorange median (and triton.testing.do_bench's on a GPU, when triton is
installed), with the ratios; the tools take turns over a few rounds so that drift on a
shared machine falls on both.  It reports; it asserts no time.
"""

from __future__ import annotations

import importlib.util
import statistics

import torch
import torch.utils.benchmark as tub

from bench.case import Case
from bench.inputs import make_grad_out, make_inputs
from bench.timing import time_call, timed_call

ROUNDS = 3
DEFAULT_CELLS = {
    "cpu": [("sdpa.flash", dict(q_len=2048, kv_len=2048)), ("naive", dict(q_len=1024, kv_len=1024)),
            ("sdpa.math", dict(q_len=512, kv_len=512, mask="causal"))],
    "cuda": [("sdpa.flash", dict(q_len=4096, kv_len=4096)), ("naive", dict(q_len=2048, kv_len=2048)),
             ("sdpa.math", dict(q_len=1024, kv_len=1024, mask="causal"))],
}


def default_cases(device: str) -> list[tuple[str, Case]]:
    dtype = "float32" if device == "cpu" else "bfloat16"
    return [(name, Case(device=device, dtype=dtype, batch=1, heads=8, kv_heads=8, head_dim=64, **kw))
            for name, kw in DEFAULT_CELLS[device]]


def check_cell(variant, case: Case, budget_ms: float = 1000.0) -> dict:
    prepared = variant.prepare(case)
    with prepared.scope():
        return _compare_timers(variant.name, case, prepared.fn, budget_ms)


def _compare_timers(name: str, case: Case, fn, budget_ms: float, rounds: int = ROUNDS) -> dict:
    """The tools take turns, ``rounds`` times, so that drift on a shared machine (another
    tenant, clocks) lands on both; each figure is the median over its rounds."""
    q, k, v = make_inputs(case)
    call = timed_call(case, fn, q, k, v, make_grad_out(case) if case.needs_grad else None)
    timer = tub.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    do_bench = None
    if case.device == "cuda" and importlib.util.find_spec("triton") is not None:
        from triton.testing import do_bench
    ours, theirs, triton_ms, iqrs, samples = [], [], [], [], 0
    for _ in range(rounds):
        t = time_call(case.device, call, budget_ms / rounds)
        ours.append(t.stats.median)
        iqrs.append(t.stats.iqr)
        samples += t.stats.count
        theirs.append(timer.blocked_autorange(min_run_time=max(0.1, budget_ms / rounds / 1e3)).median * 1e3)
        if do_bench is not None:
            triton_ms.append(float(do_bench(call, return_mode="median")))
    med = statistics.median
    row = {"variant": name, "case": case.label(), "harness_ms": med(ours), "harness_iqr_ms": med(iqrs),
           "harness_samples": samples, "tub_ms": med(theirs), "ratio_tub": med(ours) / med(theirs)}
    if triton_ms:
        row["do_bench_ms"] = med(triton_ms)
        row["ratio_do_bench"] = med(ours) / med(triton_ms)
    return row
