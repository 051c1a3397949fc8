"""Registry-driven pytest-benchmark suite at small sizes.

    pytest tests/benchmarks --benchmark-only                      # run
    pytest tests/benchmarks --benchmark-only --benchmark-autosave # keep a baseline
    pytest tests/benchmarks --benchmark-only --benchmark-compare  # compare with it

Skipped in the default test run (``--benchmark-skip`` in pyproject.toml).  On a GPU each
round ends with torch.cuda.synchronize(), so the figure covers the kernels, not the launch.
"""

import pytest
import torch

from bench.api import discover
from bench.case import Case
from bench.measure.bound import bind_variant
from bench.measure.correctness import run_and_check
from bench.registry import available

REGISTRY = discover(entry_points=False)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = "float32" if DEVICE == "cpu" else "bfloat16"
N = 256 if DEVICE == "cpu" else 2048


def _params():
    for v in REGISTRY:
        if v.shard:  # context-parallel: its ranks are processes of a group, which a sweep starts (--ranks)
            continue
        mask = "causal" if "causal" in v.masks or "any" in v.masks else v.masks[0]
        for direction in ("fwd", "fwd+bwd"):
            case = Case(DEVICE, DTYPE, 1, 4, 4, N, N, 64, mask, 64 if mask == "window" else None, direction)
            yield pytest.param(v.name, case, id=f"{v.name}-{mask}-{direction}")


@pytest.mark.parametrize("name, case", list(_params()))
def test_variant(benchmark, name, case):
    v = REGISTRY[name]
    ok, why = available(v, case)
    if not ok:
        pytest.skip(why)
    bound = bind_variant(v, case)
    benchmark.group = f"{DEVICE} {DTYPE} n={N} {case.mask} {case.direction}"
    benchmark.extra_info.update(case.to_dict())
    with bound.scope():  # e.g. the pinned SDPA backend, held open around the rounds
        checked = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out, error_budget=v.error_budget,
                                approximate=v.approximate)  # the sweep's verdict: a wrong answer is not timed
        if v.approximate and not checked.ok:  # an approximation's verdict on these inputs, as a sweep gives it
            pytest.skip(f"not timed, as in a sweep: mismatch: {checked.reason}")
        assert checked.ok, f"{name} on {case.label()}: {checked.reason}"
        call = bound.timed()
        if DEVICE == "cuda":
            inner = call

            def call():
                out = inner()
                torch.cuda.synchronize()
                return out

        benchmark(call)
