"""``python -m bench export RUN --format pytest-benchmark``: a sweep as pytest-benchmark JSON,
so that ``pytest-benchmark compare`` (and its storage tools) read it."""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

from bench.measure.stats import Stats
from bench.model.case import Case
from bench.model.row import ACCURACY, CONTENTION, FIGURES, SETTING_COLUMNS, WORKLOAD
from bench.runs import store


def _stats_seconds(samples_ms: list[float], number: int) -> dict:
    data = [x / 1e3 for x in samples_ms]
    s = Stats.of(data)
    lo, hi = s.q1 - 1.5 * s.iqr, s.q3 + 1.5 * s.iqr
    inside = [x for x in data if lo <= x <= hi]
    iqr_out = len(data) - len(inside)
    std_out = sum(1 for x in data if abs(x - s.mean) > s.std) if s.std else 0
    return {"min": s.min, "max": s.max, "mean": s.mean, "stddev": s.std, "rounds": s.count,
            "median": s.median, "iqr": s.iqr, "q1": s.q1, "q3": s.q3, "iqr_outliers": iqr_out,
            "stddev_outliers": std_out, "outliers": f"{std_out};{iqr_out}",
            "ld15iqr": min(inside) if inside else s.min, "hd15iqr": max(inside) if inside else s.max,
            "ops": 1.0 / s.mean if s.mean else 0.0, "total": sum(data) * number, "data": data,
            "iterations": number}


def _peak_share(row: dict, env: dict) -> dict:
    share = store.pct_peak(row.get("tflops"), row.get("dtype"), env)
    return {} if share is None else {"pct_peak": share}


def to_pytest_benchmark(run_dir: Path) -> dict:
    env = store.read_env(run_dir)
    benchmarks = []
    for row in store.read_current(run_dir):
        if row.get("status") != "ok" or not row.get("samples_ms"):
            continue
        case = Case.from_dict(row)
        param = case.label().replace(" ", "-")
        benchmarks.append({
            "group": f"{case.device} {case.dtype} {case.mask} {case.direction}",
            "name": f"{row['variant']}[{param}]",
            "fullname": f"attnbench::{row['variant']}[{param}]",
            "params": case.to_dict(), "param": param,
            "extra_info": {k: row[k] for k in (*WORKLOAD, *SETTING_COLUMNS, *FIGURES, *ACCURACY, *CONTENTION)
                           if row.get(k) is not None and k != "pct_peak"}
                          | _peak_share(row, env),
            "options": {"disable_gc": False, "timer": row.get("timer", "perf_counter"),
                        "min_rounds": 5, "max_time": None, "min_time": None, "warmup": True},
            "stats": _stats_seconds(row["samples_ms"], int(row.get("number") or 1)),
        })
    commit = env.get("git_commit") or "unversioned"
    return {
        "machine_info": {"node": platform.node(), "processor": env.get("cpu", ""),
                         "machine": platform.machine(), "python_compiler": platform.python_compiler(),
                         "python_implementation": platform.python_implementation(),
                         "python_implementation_version": env.get("python", ""),
                         "python_version": env.get("python", ""), "python_build": list(platform.python_build()),
                         "release": platform.release(), "system": platform.system(),
                         "cpu": {"brand_raw": env.get("cpu", "")}, "device_name": env.get("device_name"),
                         "torch": env.get("torch")},
        "commit_info": {"id": commit.removesuffix("-dirty"), "time": None, "author_time": None,
                        "dirty": commit.endswith("-dirty"), "project": "attnbench", "branch": "(unknown)"},
        "benchmarks": benchmarks,
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": "5.2.3",
    }


def export(run_dir: Path, out: Path | None = None) -> Path:
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "pytest-benchmark.json"
    out.write_text(json.dumps(to_pytest_benchmark(run_dir), indent=2))
    return out
