"""``python -m bench selfcheck``: our timer next to the field's tools, in one process.

For each cell the harness's median is printed beside torch.utils.benchmark's
blocked_autorange median (and triton.testing.do_bench's on a GPU, when triton is
installed).  The tools take turns in interleaved rounds, the same mechanism the sweep uses
for the variants of a case (``bench.measure.timing.interleave``), and the ratio is the median of
the per-round ratios with its spread.  The machine's load is measured meanwhile: two
timers hit alike by a busy machine agree with each other and are both wrong, so a
contended check says so.  It reports; it asserts no time.
"""

from __future__ import annotations

import importlib.util
import statistics

import torch
import torch.utils.benchmark as tub

from bench.features.contention import contention
from bench.measure import cpuload
from bench.measure.bound import bind_variant
from bench.measure.timing import CpuTimer, CudaTimer, interleave
from bench.model.case import Case

ROUNDS = 3


def default_cases(registry, device: str) -> list[tuple[str, Case]]:
    """The cells selfcheck times when none is named: each variant's own (``variant(..., selfcheck=)``)."""
    dtype = "float32" if device == "cpu" else "bfloat16"
    cells = []
    for name in registry.names():
        fields = registry[name].traits.selfcheck_case(device)
        if fields is not None:
            cells.append((name, Case(**{"device": device, "dtype": dtype, "batch": 1, "heads": 8, "kv_heads": 8,
                                        "head_dim": 64, **fields})))
    return cells


def check_cell(variant, case: Case, budget_ms: float = 1000.0, rounds: int = ROUNDS) -> dict:
    bound = bind_variant(variant, case)
    with bound.scope():
        return _compare_timers(variant.name, case, bound.timed(), budget_ms, rounds)


class _ToolTimer:
    """Another tool as a timer of the interleave protocol: one median per round."""

    def __init__(self, measure):
        self.measure = measure
        self.rounds: list[list[float]] = []

    def run_round(self, budget_ms: float, min_samples: int = 1) -> None:
        self.rounds.append([self.measure(budget_ms)])


def _ratio(ours: list[float], theirs: list[float]) -> tuple[float, float, float]:
    ratios = sorted(a / b for a, b in zip(ours, theirs) if b > 0)
    return statistics.median(ratios), ratios[0], ratios[-1]


def _compare_timers(name: str, case: Case, call, budget_ms: float, rounds: int = ROUNDS) -> dict:
    timer = tub.Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())
    timers = {"harness": CudaTimer(call) if case.device == "cuda" else CpuTimer(call),
              "tub": _ToolTimer(lambda ms: timer.blocked_autorange(min_run_time=max(0.05, ms / 1e3)).median * 1e3)}
    if case.device == "cuda" and importlib.util.find_spec("triton") is not None:
        from triton.testing import do_bench

        timers["do_bench"] = _ToolTimer(lambda ms: float(do_bench(call, rep=int(max(ms, 10)), return_mode="median")))
    window = cpuload.LoadWindow().start()
    interleave(timers, rounds, budget_ms)
    other = window.stop()
    ours = timers["harness"].result()
    per_round = {k: [statistics.median(r) for r in t.rounds] for k, t in timers.items() if k != "harness"}
    row = {"variant": name, "case": case.label(), "harness_ms": ours.stats.median, "harness_iqr_ms": ours.stats.iqr,
           "harness_samples": ours.stats.count, "rounds": rounds}
    for tool, medians in per_round.items():
        ratio, lo, hi = _ratio(ours.round_medians_ms, medians)
        row |= {f"{tool}_ms": statistics.median(medians), f"ratio_{tool}": ratio,
                f"ratio_{tool}_lo": lo, f"ratio_{tool}_hi": hi}
    if case.device == "cpu":
        verdict = contention.verdict(ours.cpu_util, other, ours.threads, ours.samples_ms)
        row |= {"cpu_util": verdict["cpu_util"], "other_cpu": other, "contended": verdict["contended"]}
    return row
