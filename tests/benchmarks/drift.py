"""Where a cell's time moves between runs: per process, per minute, per machine state.

    python tests/benchmarks/drift.py --out DIR [--runs 6] [--passes 3] [--gap-s 60] [--busy] [--visits V]
    python tests/benchmarks/drift.py --out DIR --again   # the runs DIR holds, read again

Three measurements of one 18-cell sweep (naive, sdpa and chunked.online; n = 256, 512, 1024;
none and causal; 4 heads of 64; float32 forward):

- fresh: ``--runs`` sweeps back to back, each its own process (a new worker: another memory
  layout, another start), each with ``--visits V`` (default 1: one worker per run; 3, the
  sweep's default, gives the intervals a user gets);
- kept: one process measuring the same cells ``--passes`` times, ``--gap-s`` seconds apart, with
  its worker kept (the same layout, later minutes; ``--passes 0`` leaves it out);
- ``--busy``: the fresh runs again beside one busy loop (another machine state).

Per cell it takes each run's estimate (the median of its first visit's samples, their minimum,
their 10th percentile, and the row's figure, over every visit) and reports, as the median over
the cells: the spread between fresh runs and between kept passes (the sd of log estimates, about
the relative sd), the within-run precision the rows claim (their 95% half-width / 1.96), and the
coverage: how often one run's 95% interval (with --visits, the interval for a rerun's figure)
holds another run's estimate, as the row gives it and with the between-run drift added to it in
quadrature (bench.runs.judge.BETWEEN_RUN_SIGMA), and with the drift this machine's A/A
recorded (``ab . .``: bench.runs.drift) in its place.  It writes DIR/drift.json and asserts
nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWEEP = {"variants": ["naive", "sdpa", "chunked.online"], "seq_lens": [256, 512, 1024], "heads": [4],
         "head_dims": [64], "masks": ["none", "causal"], "dtypes": ["float32"], "directions": ["fwd"],
         "device": "cpu", "remeasure": 0, "visits": 1}
FLAGS = ["--variants", "naive,sdpa,chunked.online", "--seq-lens", "256,512,1024", "--heads", "4", "--head-dims", "64",
         "--masks", "none,causal", "--dtypes", "float32", "--directions", "fwd", "--device", "cpu", "--remeasure", "0",
         "--no-report", "--quiet"]


def fresh(out: Path, runs: int, visits: int = 1) -> list[Path]:
    folders = []
    for i in range(runs):
        folder = out / f"run-{i + 1}"
        subprocess.run([sys.executable, "-m", "bench", "sweep", *FLAGS, "--visits", str(visits), "--out", str(folder)],
                       check=True, cwd=ROOT,
                       env=os.environ | {"PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
        folders.append(folder)
    return folders


def kept(out: Path, passes: int, gap_s: float) -> list[Path]:
    code = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from bench.api import SweepOptions, build_spec, discover, parse_values, run_sweep
        spec = build_spec(parse_values({SWEEP!r}), discover())
        for i in range({passes}):
            if i:
                time.sleep({gap_s})
            run_sweep(spec, Path({str(out)!r}) / f"pass-{{i + 1}}", SweepOptions(progress=False, keep_workers=True))
    """)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL)
    return [out / f"pass-{i + 1}" for i in range(passes)]


def _rows(folder: Path) -> dict:
    """The ok rows of a run as the harness reads them (with --visits, each cell's visits folded in)."""
    from bench.runs import store

    return {(r["variant"], r["mask"], r["q_len"]): r for r in store.read_current(folder) if r.get("status") == "ok"}


def _quantile(xs, q):
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (pos - lo)


ESTIMATORS = {"median": lambda xs: _quantile(xs, 0.5), "min": min, "q10": lambda xs: _quantile(xs, 0.1)}


def calibration(folder: Path) -> float | None:
    """The between-run sd of a log ratio of two runs that this machine's A/A (``ab . .``) recorded,
    sqrt(2) x (each cell's own drift (+) a run's shift), or None where none was recorded."""
    from bench.runs import drift, store

    known = drift.lookup(store.read_env(folder))
    return math.sqrt(2) * math.hypot(known["cell"], known["run"]) if known else None


def summarize(folders: list[Path], drift: float) -> dict:
    runs = [_rows(f) for f in folders]
    calibrated = calibration(folders[0]) if folders else None
    covered_cal = 0
    cells = sorted(set.intersection(*(set(r) for r in runs)))
    between = {name: [] for name in (*ESTIMATORS, "estimate")}
    within, covered_own, covered_drift, pairs = [], 0, 0, 0
    for cell in cells:
        for name, est in ESTIMATORS.items():  # of the first visit's samples
            logs = [math.log(est(r[cell]["samples_ms"])) for r in runs]
            between[name].append(statistics.stdev(logs))
        between["estimate"].append(statistics.stdev([math.log(r[cell]["median_ms"]) for r in runs]))
        for a, b in itertools.permutations(runs, 2):
            ra, rb = a[cell], b[cell]
            half = ra.get("ci_halfwidth")
            if half is None or ra.get("ci_lo_ms") is None:
                continue
            within.append(half / 1.96)
            pairs += 1
            covered_own += ra["ci_lo_ms"] <= rb["median_ms"] <= ra["ci_hi_ms"]
            d = abs(math.log(rb["median_ms"] / ra["median_ms"]))
            covered_drift += d <= 1.96 * math.hypot(half / 1.96, drift * math.sqrt(2))
            covered_cal += calibrated is not None and d <= 1.96 * math.hypot(half / 1.96, calibrated)
    return {"runs": len(folders), "cells": len(cells),
            "between_sd": {k: statistics.median(v) for k, v in between.items()},
            "between_sd_p90": {k: _quantile(v, 0.9) for k, v in between.items()},
            "within_sd": statistics.median(within) if within else None,
            "coverage_own_interval": covered_own / pairs if pairs else None,
            "coverage_with_drift": covered_drift / pairs if pairs else None,
            "calibrated_sd": calibrated,
            "coverage_with_calibration": covered_cal / pairs if pairs and calibrated is not None else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--gap-s", type=float, default=60.0)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--visits", type=int, default=1, help="each sweep's --visits (the fresh runs)")
    p.add_argument("--again", action="store_true", help="measure nothing: summarize the runs DIR already holds")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.runs.judge import BETWEEN_RUN_SIGMA

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if args.again:  # the folders DIR holds, summarized by this tree's reader (nothing is measured)
        result = {name: summarize(sorted((out / name).glob("*-*")), BETWEEN_RUN_SIGMA)
                  for name in ("fresh", "kept", "busy") if (out / name).is_dir()}
    else:
        result = {"fresh": summarize(fresh(out / "fresh", args.runs, args.visits), BETWEEN_RUN_SIGMA)}
    if args.passes > 1 and not args.again:
        result["kept"] = summarize(kept(out / "kept", args.passes, args.gap_s), BETWEEN_RUN_SIGMA)
    if args.busy and not args.again:
        loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            result["busy"] = summarize(fresh(out / "busy", args.runs, args.visits), BETWEEN_RUN_SIGMA)
        finally:
            loop.kill()
    result["between_run_sigma"] = BETWEEN_RUN_SIGMA
    result["visits"] = "as measured" if args.again else args.visits
    result["wall_s"] = round(time.time() - t0)
    (out / "drift.json").write_text(json.dumps(result, indent=2))
    for name, s in result.items():
        if isinstance(s, dict):
            print(f"{name}: {s['runs']} runs x {s['cells']} cells; between-run sd "
                  + ", ".join(f"{k} {v:.3f} (p90 {s['between_sd_p90'][k]:.3f})" for k, v in s["between_sd"].items())
                  + f"; within-run sd {s['within_sd']:.4f}; coverage of another run's median: own interval "
                    f"{s['coverage_own_interval']:.0%}, with the drift {s['coverage_with_drift']:.0%}"
                  + (f", with this machine's A/A calibration (sd {s['calibrated_sd']:.3f}) "
                     f"{s['coverage_with_calibration']:.0%}" if s["calibrated_sd"] is not None else ""))
    print(f"wall {result['wall_s']} s; {out / 'drift.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
