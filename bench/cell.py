"""One cell, executed inside the worker: setup, reference check, timing, memory pass.

Every path ends in a row with a status and a reason; nothing here raises.
"""

from __future__ import annotations

import gc
import time

import torch

from bench import flops as flopcount
from bench.case import Case
from bench.inputs import make_grad_out, make_inputs
from bench.memory import peak_bytes
from bench.reference import reference, run_and_check
from bench.registry import Variant, first_line
from bench.timing import time_call, timed_call

STATUSES = ("ok", "mismatch", "unsupported", "oom", "error", "timeout", "crash")
UNSUPPORTED_MARKERS = ("No available kernel", "No viable backend", "No operator found",
                       "not supported", "does not support")


MEASURED = ("median_ms", "iqr_ms", "min_ms", "samples", "peak_mem_bytes", "tflops", "max_abs_err")


def base_row(variant: str, case: Case, status: str = "", reason: str = "") -> dict:
    """The columns every row has, measured or not (None until measured)."""
    return {"variant": variant, **case.to_dict(), "status": status, "reason": reason,
            "flops": flopcount.flops(case), "bytes": flopcount.min_bytes(case)} | dict.fromkeys(MEASURED)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text or "can't allocate memory" in text


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class ReferenceCache:
    """The float64 reference of the last case: cells come grouped by case, so every
    variant of a case is checked against one reference computation."""

    def __init__(self):
        self._key = None
        self._value = None

    def get(self, case: Case, q, k, v, grad_out):
        key = (case.replace(direction="fwd"), grad_out is not None)
        if self._key != key:
            self._key, self._value = None, None
            self._value = reference(case, q, k, v, grad_out)
            self._key = key
        return self._value


def run_cell(v: Variant, case: Case, budget_ms: float, cache: ReferenceCache | None = None,
             profile: bool = False) -> dict:
    row = base_row(v.name, case)
    row["threads"] = torch.get_num_threads()
    try:
        t0 = time.perf_counter()
        prepared = v.prepare(case)
        row["setup_ms"] = (time.perf_counter() - t0) * 1e3
        row.update(prepared.info)
        with prepared.scope():
            _measure(row, case, prepared.fn, budget_ms, cache or ReferenceCache(), profile)
    except Exception as exc:  # every failure becomes the row's status
        why = f"{type(exc).__name__}: {first_line(exc)}"
        if _is_oom(exc):
            status = "oom"
        elif isinstance(exc, NotImplementedError) or any(m in str(exc) for m in UNSUPPORTED_MARKERS):
            status = "unsupported"
        else:
            status = "error"
        row.update(status=status, reason=why[:500])
        row.pop("samples_ms", None)
    finally:
        _free(case.device)
    return row


def _measure(row: dict, case: Case, fn, budget_ms: float, cache: ReferenceCache, profile: bool) -> None:
    """Reference check, then (if it passes) timing, the memory pass and the profiled pass."""
    q, k, v = make_inputs(case)
    grad_out = make_grad_out(case) if case.needs_grad else None
    result = run_and_check(case, fn, q, k, v, grad_out, cache.get(case, q, k, v, grad_out))
    row.update(result.to_row())
    if not result.ok:
        row.update(status="mismatch", reason=result.reason)
        return
    call = timed_call(case, fn, q, k, v, grad_out)
    row.update(time_call(case.device, call, budget_ms).to_row())
    del call
    _free(case.device)
    whole = case.replace(direction="fwd+bwd" if case.needs_grad else "fwd")
    row["peak_mem_bytes"] = peak_bytes(case.device, timed_call(whole, fn, q, k, v, grad_out))
    row["tflops"] = row["flops"] / (row["median_ms"] * 1e-3) / 1e12
    row["gbps"] = row["bytes"] / (row["median_ms"] * 1e-3) / 1e9
    if profile:
        from bench.profile import category_shares

        row.update(category_shares(case, fn, q, k, v, grad_out))
    row["status"] = "ok"
