"""What the CPU timer costs next to torch.utils.benchmark, on the same callables.

    python tests/benchmarks/timer_cost.py [--repeats 3]

For naive and sdpa (fp32 forward, b=1, h=8, d=64) at n = 256, 1024 and 2048, the harness's
CpuTimer (stopping when the median's 95% CI is within +-2%) and
``torch.utils.benchmark.Timer.adaptive_autorange(threshold=0.05)`` time the same call at the
same thread count, taking turns; the harness's budget defaults to adaptive_autorange's
10 s max_run_time, its target to +-2% (``--precision``).  Printed per callable: the wall time each spent (median
over the repeats), their ratio, both medians and how far apart they are, and the precision
each reached (the half-width of its median's 95% CI where it has one), and how many calls
each made, warm-up and estimates included.
It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.utils.benchmark as tub
from tabulate import tabulate

from bench.api import discover
from bench.case import Case
from bench.measure.inputs import make_inputs
from bench.measure.stats import ci_halfwidth, median_ci_ranks
from bench.measure.timing import CpuTimer

FEWEST = next(n for n in range(1, 100) if median_ci_ranks(n) is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--precision", type=float, default=2.0, help="the harness's target, +-%% (default 2)")
    ap.add_argument("--budget-ms", type=float, default=10_000.0,
                    help="the harness's budget per callable (default 10 s, adaptive_autorange's max_run_time)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    registry = discover()
    rows, ours_total, theirs_total = [], 0.0, 0.0
    for name in ("naive", "sdpa"):
        for n in (256, 1024, 2048):
            case = Case("cpu", "float32", 1, 8, 8, n, n, 64, "none", None, "fwd")
            fn = registry[name].prepare(case).fn
            q, k, v = make_inputs(case)
            call = lambda: fn(q, k, v)  # noqa: E731
            call()
            walls_ours, walls_theirs, med_ours, med_theirs, hw_ours, hw_theirs = [], [], [], [], [], []
            calls_ours, calls_theirs = [], []
            for _ in range(args.repeats):
                counted = Counted(call)
                t0 = time.perf_counter()
                timer = CpuTimer(counted, precision=args.precision / 100)
                timer.run_round(budget_ms=args.budget_ms, min_samples=3)
                walls_ours.append(time.perf_counter() - t0)
                calls_ours.append(counted.calls)
                ours = timer.result()
                med_ours.append(ours.stats.median)
                hw_ours.append(ci_halfwidth(ours.samples_ms))
                counted = Counted(call)
                t0 = time.perf_counter()
                m = tub.Timer(stmt="call()", globals={"call": counted}, num_threads=args.threads
                              ).adaptive_autorange(threshold=0.05)
                walls_theirs.append(time.perf_counter() - t0)
                calls_theirs.append(counted.calls)
                med_theirs.append(m.median * 1e3)
                hw_theirs.append(ci_halfwidth([t * 1e3 / m.number_per_run for t in m.raw_times]))
            w_o, w_t = statistics.median(walls_ours), statistics.median(walls_theirs)
            ours_total += w_o
            theirs_total += w_t
            mo, mt = statistics.median(med_ours), statistics.median(med_theirs)
            rows.append([name, n, w_o * 1e3, w_t * 1e3, w_o / w_t, statistics.median(calls_ours),
                         statistics.median(calls_theirs), mo, mt, 100 * (mo / mt - 1),
                         _pct(statistics.median(hw_ours)), _pct(statistics.median(hw_theirs))])
    print(tabulate(rows, headers=["variant", "n", "harness wall ms", "tub wall ms", "wall ratio", "harness calls",
                                  "tub calls", "harness median ms", "tub median ms", "medians differ %",
                                  "harness CI +-%", "tub CI +-%"], floatfmt=".3g"))
    print(f"total wall: harness {ours_total:.2f} s, adaptive_autorange {theirs_total:.2f} s, "
          f"ratio {ours_total / theirs_total:.2f}  ({args.threads} threads, {args.repeats} repeats, medians; "
          f"harness target +-{args.precision:g}%, budget {args.budget_ms:g} ms)")
    print(f"a 95% order-statistic interval of the median needs at least {FEWEST} samples "
          f"(median_ci_ranks); adaptive_autorange may stop after 4 blocks, and on a call longer than "
          f"its 0.05 ms block target one block is one call")


class Counted:
    """The callable, counting its calls (warm-up and block-size estimates included)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self):
        self.calls += 1
        return self.fn()


def _pct(x: float) -> str:
    return "none" if x == float("inf") else f"{100 * x:.1f}"


if __name__ == "__main__":
    main()
