"""A sweep's CPU medians next to an independent timer in a fresh process.

    python tests/benchmarks/fresh_process.py [--variants sdpa.flash,naive] [--seq-len 1024] [--repeats 2]

For one shape (batch 1, 8 heads, d = 64, mask none, fwd, float32), in turns:

1. ``torch.utils.benchmark.Timer.blocked_autorange`` on each variant's call, each in a
   fresh interpreter (the reference: nothing else has run in that process), with glibc's heap set
   as the sweep's workers set it (a fixed mmap threshold, no trimming: bench.engine.runner.steady_heap),
   and once more with glibc's defaults, under which a call that allocates a large block pays
   its page faults at every call;
2. ``python -m bench sweep`` of all the variants together (interleaved rounds, as a user runs it);
3. one sweep per variant alone (no other variant between its rounds);
4. the fresh-process timer again.

Prints each median and its ratio to the mean of the two fresh-process medians (steady heap), so that a
gap can be put on the worker itself (3 against 1 and 4) or on the variants sharing the
rounds (2 against 3).  Nothing else of yours should run meanwhile.  It measures; it
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tabulate import tabulate

FRESH = """
import json, sys
if sys.argv[3] == "steady":  # the heap as the sweep's workers keep it (bench.engine.runner.steady_heap)
    from bench.engine.runner import steady_heap
    steady_heap()
import torch, torch.utils.benchmark as tb
from bench.case import Case
from bench.measure.bound import bind_variant
from bench.api import discover
name, n = sys.argv[1], int(sys.argv[2])
case = Case("cpu", "float32", 1, 8, 8, n, n, 64, "none", None, "fwd")
bound = bind_variant(discover(entry_points=False)[name], case)
with bound.scope():
    call = bound.timed()
    timer = tb.Timer("call()", globals={"call": call}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=2)
print(json.dumps({"median_ms": m.median * 1e3, "threads": torch.get_num_threads()}))
"""


def fresh(name: str, n: int, heap: str = "steady") -> float:
    out = subprocess.run([sys.executable, "-c", FRESH, name, str(n), heap], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["median_ms"]


def sweep(names: list[str], n: int, folder: Path) -> dict:
    subprocess.run([sys.executable, "-m", "bench", "sweep", "--device", "cpu", "--variants", ",".join(names),
                    "--seq-lens", str(n), "--heads", "8", "--head-dims", "64", "--batch", "1", "--masks", "none",
                    "--directions", "fwd", "--dtypes", "float32", "--budget-ms", "2000", "--remeasure", "0",
                    "--no-report", "--quiet", "--out", str(folder)], capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    return {r["variant"]: r for r in rows if r["status"] == "ok"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="sdpa.flash,naive")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            before = {v: fresh(v, args.seq_len) for v in names}
            default = {v: fresh(v, args.seq_len, "default") for v in names}
            together = sweep(names, args.seq_len, Path(tmp) / f"together-{rep}")
            alone = {v: sweep([v], args.seq_len, Path(tmp) / f"alone-{v}-{rep}")[v] for v in names}
            after = {v: fresh(v, args.seq_len) for v in names}
            for v in names:
                ref = (before[v] + after[v]) / 2
                table.append([rep + 1, v, f"{before[v]:.3g}", f"{after[v]:.3g}",
                              f"{default[v]:.3g} ({default[v] / ref:.2f}x)",
                              f"{together[v]['median_ms']:.3g} ({together[v]['median_ms'] / ref:.2f}x)",
                              f"{alone[v]['median_ms']:.3g} ({alone[v]['median_ms'] / ref:.2f}x)",
                              together[v].get("contended")])
    print(tabulate(table, headers=["repeat", "variant", "fresh before (ms)", "fresh after (ms)",
                                   "fresh, glibc's default heap",
                                   "sweep, variants together", "sweep, variant alone", "contended"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
