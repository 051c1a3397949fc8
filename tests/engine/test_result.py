"""A cell's result stays typed in the worker (bench.engine.result.CellResult) and becomes a row
at one boundary, ``row()``; its rates come where every reader's do (bench.runs.store.measured):
real checks and timings of a real variant, written as the sweep writes them."""

import torch
import torch.nn.functional as F

from bench.engine.result import CellResult
from bench.measure.correctness import run_and_check
from bench.measure.inputs import make_inputs
from bench.measure.settings import MeasureSettings
from bench.measure.timing import Timing
from bench.model.case import Case
from bench.model.row import ACCURACY, CONTENTION, TIMING, ReasonKind, Status, make_row
from bench.runs import store

CASE = Case("cpu", "float32", 1, 2, 2, 32, 32, 16, "causal", None, "fwd+bwd")


def _checked(fn=None) -> CellResult:
    q, k, v = make_inputs(CASE)
    grad_out = torch.randn(1, 2, 32, 16)
    check = run_and_check(CASE, fn or (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                          q, k, v, grad_out)
    assert check.outputs is not None  # the tensors the determinism check compares against
    return CellResult("sdpa", CASE, MeasureSettings(budget_ms=5.0, threads=1)).checked(check)


def _timing(median_ms: float):
    return Timing([median_ms * f for f in (0.98, 1.0, 1.0, 1.02, 1.01)] * 3, 1, 2, "cpu-perf-counter",
                  threads=1, timed_s=0.01, cpu_s=0.01).summary()


def test_a_timed_result_becomes_a_typed_row_whose_rates_come_on_read():
    result = _checked()
    assert result.check.ok and result.check.outputs is None  # its figures kept, not the tensors it compared
    result.timing, result.peak_mem_bytes, result.interleave_id = _timing(0.5), 123_456, "abc"
    result.contention = {"cpu_util": 0.99, "other_cpu": 0.0, "quantum_ms": None, "contended": False,
                         "contended_why": ""}
    sent = result.decide(Status.OK).row()
    assert sent.get("tflops") is None and sent.get("gbps") is None  # the worker sends measurements; rates come on read
    row = store.measured(sent)
    written = make_row(row)  # the types the writer checks
    assert written["status"] is Status.OK and written["reason_kind"] is ReasonKind.NONE
    assert written["median_ms"] == 0.5 and written["samples"] == 15 and written["peak_mem_bytes"] == 123_456
    assert written["tflops"] == row["flops"] / 0.5e-3 / 1e12 and written["gbps"] == row["bytes"] / 0.5e-3 / 1e9
    assert written["budget_ms"] == 5.0 and written["threads"] == 1 and written["precision"] is not None  # the settings'
    assert written["rel_err"] is not None and written["rel_err"] < 1e-5 and written["grad_rel_err"] < 1e-5
    approx = _checked()
    approx.approximate, approx.timing = True, _timing(0.5)
    row = store.measured(approx.decide(Status.OK).row())
    assert row.get("tflops") is None and row["gbps"] is not None  # an approximation does not do exact attention's FLOPs


def test_a_failure_after_the_timing_keeps_the_check_and_no_figure_of_the_timing():
    result = _checked()
    result.timing, result.interleave_id, result.bwd_forward = _timing(0.5), "abc", "per turn"
    result.contention = {"cpu_util": 0.99, "contended": False}
    result.fail(torch.OutOfMemoryError("CPU ran out"), "memory pass")
    row = result.row()
    written = make_row(row)
    assert written["status"] is Status.OOM and row["reason"].startswith("memory pass: OutOfMemoryError: CPU ran out")
    assert all(row.get(c) is None for c in (*TIMING, *CONTENTION, "tflops", "gbps", "peak_mem_bytes")), \
        {c: row[c] for c in (*TIMING, *CONTENTION) if row.get(c) is not None}
    assert row["max_abs_err"] is not None and row["cosine"] > 0.999  # the check did finish


def test_a_wrong_kernel_is_a_mismatch_with_the_checks_own_kind_and_reason():
    result = _checked(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))  # not causal
    row = result.row()
    assert result.status is Status.MISMATCH and row["status"] == "mismatch"
    assert row["reason_kind"] == result.check.kind and row["reason"] == result.check.reason
    assert all(c in row for c in ACCURACY if c not in ("deterministic", "nondeterminism", "reference_skipped"))
    assert make_row(row)["median_ms"] is None
