"""``python -m bench frontier``: the longest context (or the largest batch at a length) each
variant fits in a memory budget, found with real cells (bench.features.frontier)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from bench.cli.common import add_setting_flags, case_spec
from bench.errors import UsageError
from bench.model.case import MAX_LEN
from bench.model.parsers import number

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20, "g": 2**30,
         "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}
GPU_RESERVE = 0.05  # of the GPU's free memory, kept back for the runtime, the allocator's fragmentation, workspaces
CPU_SPARE = 0.8  # of this machine's available memory: the most a cell may be predicted to use before it is not run
SINGLE = ("dtypes", "masks", "directions", "heads", "kv_heads", "head_dims", "window", "inputs")


def parse_size(text: str) -> float:
    """Bytes from 8GiB, 512MiB, 8G (binary), 8GB (decimal) or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and m.group(2).lower()
    if not m or unit not in UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"--memory-budget {text!r}: give a size such as 8GiB, 512MiB or 8G (binary), 8GB "
                         f"(decimal), or bytes")
    return float(m.group(1)) * UNITS[unit]


def available_memory() -> float | None:
    """This machine's available memory (Linux: MemAvailable), bytes."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def command(args) -> int:
    from bench.features import frontier
    from bench.runs import store

    registry, spec = case_spec(args, {"seq_lens": ",".join(map(str, frontier.PROBES["n"]["cpu"])), "heads": "8",
                                      "head_dims": "64", "batch": "1", "masks": "causal", "directions": "fwd",
                                      "window": "256"})
    many = [f"--{k.replace('_', '-')}" for k in SINGLE if len(getattr(spec, k) or [None]) > 1]
    if many or len(spec.batch) > 1 and args.at_n is None:
        raise UsageError(f"frontier searches one case per variant: give one value of {', '.join(many or ['--batch'])} "
                         f"(--variants may name several)")
    if spec.kv_lens or spec.batch_mix or list(spec.lengths) != ["fixed"] or list(spec.kv_layout) != ["contiguous"]:
        raise UsageError("frontier grows self-attention of one fixed length (q_len = kv_len): --kv-lens, --batch-mix, "
                         "--lengths and --kv-layout are not searched")
    budget, limit, where = _budget(args, spec.device)
    axis = "n" if args.at_n is None else "batch"
    if axis == "batch":
        n = number(1, MAX_LEN, True)(args.at_n, "--at-n")
        probes = frontier.PROBES["batch"]
    else:
        gave = args.seq_lens is not None
        probes = spec.seq_lens if gave or spec.device == "cpu" else frontier.PROBES["n"]["cuda"]
    spec = spec.replace(remeasure=0, visits=1, budget_ms=spec.budget_ms if args.budget_ms else 100.0)
    if args.out and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        raise UsageError(f"--out {args.out}: not empty; a frontier is written into a new or empty folder (an "
                         f"earlier search's frontier.csv and cells are never mixed with or overwritten by another)")
    out = store.writable_dir(args.out) if args.out else store.new_run_dir(f"{spec.device}-frontier", link_latest=False)
    print(f"frontier: {axis} per variant within {frontier.gib(budget)} ({where}); cells in {out}", flush=True)
    base = spec.cases()[0]
    results = []
    for name in spec.variants:
        def make_case(size, name=name):
            return base.replace(q_len=size, kv_len=size) if axis == "n" else base.replace(q_len=n, kv_len=n, batch=size)

        def measure(case, name=name):
            return _measure(spec, registry, name, case, out, axis)

        results.append(frontier.search(name, axis, make_case, measure, budget, probes, spec.timeout,
                                       limit=limit, log=lambda s: print("  " + s, flush=True)))
    _write(results, out, base, axis, {n: registry[n].traits.colour for n in registry.names()
                                      if registry[n].traits.colour is not None})
    return 0


def _budget(args, device: str) -> tuple[float, float | None, str]:
    """(budget bytes, the most a cell may be predicted to use, where the budget came from)."""
    from bench.features import frontier

    if args.memory_budget:
        budget = parse_size(args.memory_budget)
        where = f"--memory-budget {args.memory_budget}"
    elif device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        budget, where = free * (1 - GPU_RESERVE), f"the GPU's free memory less {100 * GPU_RESERVE:g}%"
    else:
        raise UsageError("frontier on the CPU needs --memory-budget SIZE (e.g. 8GiB): the budget a cell's inputs and "
                         "peak must fit")
    if device == "cuda":
        return budget, None, where  # an out-of-memory there is the cell's row
    spare = available_memory()
    limit = spare * CPU_SPARE if spare else None
    if limit is not None and budget > limit:
        raise UsageError(f"--memory-budget {args.memory_budget} is more than this machine can spare "
                         f"({frontier.gib(limit)}: {100 * CPU_SPARE:g}% of its available memory): cells that fill it "
                         f"would take the machine down, not just themselves")
    return budget, limit, where


def _measure(spec, registry, name, case, out: Path, axis: str):
    """One cell in a worker of its own sweep (run folder cells/<variant>-<axis><size>): its row
    and the sweep's wall seconds."""
    from bench.engine.sweep import SweepOptions, run_sweep
    from bench.model.row import current_rows

    size = case.q_len if axis == "n" else case.batch
    cell_spec = spec.replace(variants=[name], seq_lens=[case.q_len], batch=[case.batch])
    folder = out / "cells" / f"{name}-{axis}{size}"
    t0 = time.perf_counter()
    summary = run_sweep(cell_spec, folder, SweepOptions(progress=False, keep_workers=True,
                                                        given={"variants": [name], "seq_lens": [case.q_len]}))
    rows = [r for r in current_rows(summary.rows) if r["variant"] == name]
    return (rows[-1] if rows else {"status": "error", "reason": "the cell wrote no row"}), time.perf_counter() - t0


def shape_text(case, axis: str) -> str:
    """The case a frontier grows, without the size it searches."""
    heads = f"h={case.heads}" + (f"/{case.kv_heads}" if case.is_gqa else "")
    where = f"b={case.batch}" if axis == "n" else f"n={case.q_len}"
    mask = case.mask + (f"({case.window})" if case.window else "")
    return f"{case.device} {case.dtype} {where} {heads} d={case.dims} {mask} {case.direction}"


def _write(results, out: Path, base, axis: str, colours: dict) -> None:
    import pandas as pd
    from tabulate import tabulate

    from bench.features import frontier

    table, cells = [], []
    for r in results:
        at = r.at_largest
        table.append({"variant": r.variant, "axis": axis, "largest": r.largest,
                      "median_ms_at_largest": at.median_ms if at else None,
                      "footprint_gib_at_largest": at.footprint / 2**30 if at and at.footprint else None,
                      "smallest_over": r.smallest_over, "over_why": r.over_why, "predicted": r.predicted,
                      "bracket": r.bracket, "budget_gib": r.budget / 2**30, "cells": len(r.cells), "stop": r.stop,
                      "model_a": r.model[0] if r.model else None, "model_b": r.model[1] if r.model else None,
                      "model_c": r.model[2] if r.model else None, "case": shape_text(base, axis)})
        cells += [{"variant": r.variant, axis: c.size, "status": c.status, "fits": c.fits,
                   "footprint_gib": None if c.footprint is None else c.footprint / 2**30, "median_ms": c.median_ms,
                   "wall_s": round(c.wall_s, 2), "why": c.why} for c in r.cells]
    df = pd.DataFrame(table)
    df.to_csv(out / "frontier.csv", index=False)
    pd.DataFrame(cells).to_csv(out / "frontier-cells.csv", index=False)
    shown = df[["variant", "largest", "median_ms_at_largest", "footprint_gib_at_largest", "smallest_over", "predicted",
                "cells", "stop"]].copy()
    shown["footprint_gib_at_largest"] = [frontier.gib(x * 2**30) if x == x and x is not None else "-"
                                         for x in shown["footprint_gib_at_largest"]]
    print(tabulate(shown, headers=["variant", f"largest {axis}", "ms there", "memory there", f"smallest {axis} over",
                                   "model's first guess", "cells", "stopped"], showindex=False, floatfmt=".4g"))
    from reports.charts import frontier_chart

    path = frontier_chart(df, out / "frontier.png", f"Largest {axis} within {frontier.gib(results[0].budget)}: "
                                                    f"{shape_text(base, axis)}", declared=colours)
    print(f"frontier: {out / 'frontier.csv'} (cells: frontier-cells.csv); "
          + (f"chart {path}" if path else "no chart: no variant fits within the budget at any size searched"))


def add_parser(sub) -> None:
    p = sub.add_parser("frontier", help="the largest n (or batch) each variant fits in a memory budget, by real "
                                        "cells in isolated workers")
    add_setting_flags(p, case_only=True, skip=("kv_lens", "lengths", "kv_layout", "batch_mix", "align"))
    p.add_argument("--memory-budget", dest="memory_budget", metavar="SIZE",
                   help="bytes a cell's inputs and peak must fit: 8GiB, 512MiB (required on the CPU; on a GPU the "
                        "default is its free memory less 5%%)")
    p.add_argument("--at-n", dest="at_n", metavar="N", help="search the largest batch at this length instead of n")
    p.add_argument("--timeout", help="seconds a cell may take; the search stops before a cell predicted to take longer")
    p.add_argument("--budget-ms", dest="budget_ms", help="timing budget per cell in ms (default 100)")
    p.add_argument("--out", metavar="DIR", help="a new or empty folder (default: runs/<timestamp>-<device>-frontier)")
    p.set_defaults(func=command)
