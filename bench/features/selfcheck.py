"""``python -m bench selfcheck``: our timer next to the field's tools, in one process.

For each cell the harness's median is printed beside torch.utils.benchmark's
blocked_autorange median (and triton.testing.do_bench's on a GPU, when triton is
installed).  The tools take turns in interleaved rounds, the same mechanism the sweep uses
for the variants of a case (``bench.measure.timing.interleave``), and the ratio is the median of
the per-round ratios with its spread.  The machine's load is measured meanwhile: two
timers hit alike by a busy machine agree with each other and are both wrong, so a
contended check says so.  It reports; it asserts no time.

On the CPU each cell is checked twice, each time in a fresh interpreter: under the heap the
sweep's workers keep (``--heap fixed``: ``bench.engine.runner.steady_heap``) and under glibc's own
(``system``, as a default process has), both tools under the same heap each time (``under_heaps``).
Across the two, the sweep's figure over a default process's (the harness under the fixed heap,
torch.utils.benchmark under the system one) is what the page faults of a default process cost.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pickle
import statistics
import subprocess
import sys

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


HEAPS = ("fixed", "system")  # bench.model.spec's --heap
CHILD = r"""
import base64, json, pickle, sys
heap, plugins, cells, budget = pickle.loads(base64.b64decode(sys.stdin.read()))
if heap == "fixed":  # before torch is imported, as a sweep's worker does
    from bench.engine.runner import steady_heap
    steady_heap()
from bench.engine.discovery import discover
from bench.features.selfcheck import check_cell
registry = discover(plugins)
rows = [check_cell(registry[name], case, budget) | {"heap": heap} for name, case in cells]
print("selfcheck-rows " + json.dumps(rows), flush=True)
"""


def under_heap(heap: str, cells: list, budget_ms: float, plugins=()) -> list[dict]:
    """``check_cell`` of each (variant name, case) in a fresh interpreter whose C heap is ``heap``
    (the heap cannot be put back once fixed, so each heap has a process of its own)."""
    from bench.errors import UsageError

    payload = base64.b64encode(pickle.dumps((heap, list(plugins), cells, budget_ms))).decode()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = os.environ | {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", CHILD], input=payload, capture_output=True, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("selfcheck-rows "):
            return json.loads(line.removeprefix("selfcheck-rows "))
    last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    raise UsageError(f"selfcheck: the check under the {heap} heap stopped: {last}")


def under_heaps(cells: list, budget_ms: float, plugins=()) -> list[dict]:
    """Each cell's rows under both heaps (``HEAPS``), the fixed one with ``default_process``: the
    harness's median under the fixed heap over torch.utils.benchmark's under the system heap (what
    the sweep reports against what a default process's call takes)."""
    got = {heap: under_heap(heap, cells, budget_ms, plugins) for heap in HEAPS}
    rows = []
    for fixed, system in zip(got["fixed"], got["system"]):
        cross = fixed["harness_ms"] / system["tub_ms"] if system.get("tub_ms") else float("nan")
        rows += [fixed | {"default_process": cross}, system]
    return rows


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
