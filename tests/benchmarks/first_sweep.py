"""README's first sweep as a newcomer runs it: ``python -m bench sweep`` (the default preset, with its
report) in a fresh folder, quiet or beside busy loops.

    python tests/benchmarks/first_sweep.py [--busy N] [--cold] [--dry-run-only]

It runs the command in a new temporary folder (no earlier run in its ``runs/`` to learn from), so
the projection is the cost model's first one. ``--cold`` also gives it an empty compiler cache and
peak cache (``TORCHINDUCTOR_CACHE_DIR``, ``ATTNBENCH_CACHE_DIR``): what a fresh machine pays.
``--busy N`` starts N busy loops (``python -c "while True: pass"``) before it and kills them after.
It prints the command's wall time from outside, the plan's projection, the statuses and how many
(variant, mask) series have a time exponent in the report. Nothing else of yours should run
meanwhile. It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECTED = re.compile(r"projected wall time: ([\d.]+) (s|min)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", type=int, default=0, help="busy loops beside the sweep (default 0)")
    p.add_argument("--cold", action="store_true", help="an empty compiler cache and peak cache")
    p.add_argument("--dry-run-only", action="store_true", help="print the plan only")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="first-sweep-") as tmp:
        env = dict(os.environ)
        if args.cold:
            env |= {"TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "ATTNBENCH_CACHE_DIR": f"{tmp}/cache"}
        plan = subprocess.run([sys.executable, "-m", "bench", "sweep", "--dry-run"], cwd=tmp, env=env,
                              capture_output=True, text=True)
        found = PROJECTED.search(plan.stdout)
        projected_s = float(found[1]) * (60 if found[2] == "min" else 1) if found else None
        print(plan.stdout.strip())
        if args.dry_run_only:
            return plan.returncode
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            time.sleep(1.0 if busy else 0.0)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "bench", "sweep"], cwd=tmp, env=env, capture_output=True,
                                  text=True)
            wall = time.perf_counter() - t0
        finally:
            for b in busy:
                b.kill()
                b.wait()
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
        run = (Path(tmp) / "runs" / "latest").resolve()
        from bench.model.row import current_rows
        from bench.runs.store import read_rows

        counts: dict = {}
        for r in current_rows(read_rows(run)):  # a cell's newest row
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        series = 0
        scaling = run / "report" / "scaling.csv"
        if scaling.exists():
            with scaling.open() as f:
                series = sum(1 for r in csv.DictReader(f) if r.get("time_exp") not in (None, ""))
        threads = json.loads((run / "env.json").read_text()).get("threads")
        print(f"busy loops: {args.busy}; cold caches: {'yes' if args.cold else 'no'}; threads: {threads}")
        print(f"wall: {wall:.0f} s ({wall / 60:.1f} min)" + (f"; projected {projected_s:.0f} s, measured "
                                                             f"{wall / projected_s:.2f}x of it" if projected_s else ""))
        print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print(f"series with a time exponent: {series}")
        print(proc.stdout.strip().splitlines()[-2] if proc.stdout.strip() else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
