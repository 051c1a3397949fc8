"""``python -m bench sweep``: expand the spec, run every cell in the isolated worker, and
append each row to the run folder as soon as it is known."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench import store
from bench.cell import STATUSES, base_row
from bench.errors import UsageError
from bench.registry import available, discover, plugin_module
from bench.runner import Worker, WorkerSettings
from bench.spec import AXES, as_list, build_spec, load_config

FLAG_KEYS = AXES + ("device", "timeout", "budget_ms", "preset")


def collect_given(args) -> dict:
    given = load_config(args.config) if args.config else {}
    for key in FLAG_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            given[key] = value
    for key in AXES:  # lists from here on, whether from a flag ("a,b") or the file
        if given.get(key) is not None:
            given[key] = as_list(key, given[key])
    plugins = list(given.get("plugins") or []) + list(args.plugin)
    given["plugins"] = list(dict.fromkeys(str(Path(p).expanduser().resolve()) for p in plugins))
    return given


def _resume_given(run_dir: Path, flags: dict) -> dict:
    old = store.read_env(run_dir).get("given")
    if old is None:
        raise UsageError(f"--resume {run_dir}: not a run folder (no env.json with a spec)")
    given = dict(old)
    given.update({k: v for k, v in flags.items() if k != "plugins"})
    given["plugins"] = list(dict.fromkeys(list(old.get("plugins") or []) + flags["plugins"]))
    return given


def run_sweep(args) -> int:
    flags = collect_given(args)
    resume = Path(args.resume) if args.resume else None
    if resume is not None and not resume.is_dir():
        raise UsageError(f"--resume {args.resume}: no such run folder")
    if resume is not None:
        given = _resume_given(resume, flags)
    else:
        given = flags
    registry = discover(given["plugins"])
    if resume is not None and "variants" not in flags and given.get("variants"):
        new_modules = {plugin_module(p) for p in args.plugin}  # a resumed run adds new plugins
        added = [v.name for v in registry if v.module in new_modules]
        given["variants"] = list(dict.fromkeys(list(given["variants"]) + added))
    spec = build_spec(given, registry)
    cases = spec.cases()

    run_dir, env = _open_run(resume, args.out, spec, given, registry)
    done = {store.cell_key(r["variant"], r) for r in store.read_rows(run_dir, repair=True)}
    cells = [(name, case) for case in cases for name in spec.variants
             if store.cell_key(name, case) not in done]
    print(f"run folder: {run_dir}  ({len(cells)} cells to run, {len(done)} already there; "
          f"device {spec.device}, {env['threads']} threads)", file=sys.stderr)
    t0 = time.perf_counter()
    counts = _run_cells(cells, run_dir, spec, registry, given["plugins"], env["peaks_tflops"], args)
    elapsed = time.perf_counter() - t0
    print(summary_table(store.read_rows(run_dir)))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
          + f"  ({len(cells)} cells in {elapsed:.0f} s)")
    if not getattr(args, "no_report", False):
        from reports.build import build_report

        print(f"report: {build_report([run_dir])}")
    print(f"results: {run_dir / store.RESULTS}")
    return 0


def _open_run(resume: Path | None, out: str | None, spec, given: dict, registry) -> tuple[Path, dict]:
    """The run folder (new, --out, or resumed) with its env.json written: the fingerprint,
    the spec, and the matmul peak of every dtype the spec uses (measured once per run)."""
    from bench.envinfo import fingerprint, measure_peak_tflops

    run_dir = resume or (Path(out) if out else store.new_run_dir(spec.device))
    run_dir.mkdir(parents=True, exist_ok=True)
    env = store.read_env(run_dir) if resume else {}
    if env:
        env.setdefault("resumed", []).append(" ".join(["python", "-m", "bench"] + sys.argv[1:]))
    else:
        env = fingerprint(spec.device) | {"peaks_tflops": {}}
    baseline = registry.baseline()
    env |= {"given": given, "spec": spec.to_dict(), "baseline": baseline.name if baseline else None}
    for dtype in spec.dtypes:
        if dtype not in env["peaks_tflops"]:
            env["peaks_tflops"][dtype] = measure_peak_tflops(spec.device, dtype)
    store.write_env(run_dir, env)
    return run_dir, env


def _run_cells(cells, run_dir: Path, spec, registry, plugins, peaks: dict, args) -> dict:
    """Each cell to a row, appended as soon as it is known; unavailable cells are recorded
    as 'unsupported' without launching them."""
    from tqdm import tqdm

    writer = store.ResultWriter(run_dir)
    worker = Worker(WorkerSettings(plugins=plugins, budget_ms=spec.budget_ms,
                                   profile=bool(getattr(args, "profile", False)),
                                   log_path=str(run_dir / "worker.log")))
    counts = dict.fromkeys(STATUSES, 0)
    bar = tqdm(total=len(cells), unit="cell", dynamic_ncols=True, file=sys.stderr,
               disable=getattr(args, "quiet", False))
    try:
        for name, case in cells:
            bar.set_postfix_str(f"{name} {case.label()}", refresh=False)
            ok, why = available(registry[name], case)
            if not ok:
                row = base_row(name, case, "unsupported", why)
            else:
                tag, why, row = worker.run(name, case, spec.timeout)
                if row is None:
                    row = base_row(name, case, tag, why)
            if row.get("tflops") and peaks.get(case.dtype):
                row["pct_peak"] = 100.0 * row["tflops"] / peaks[case.dtype]
            writer.write(row)
            counts[row["status"]] += 1
            bar.update(1)
    finally:
        bar.close()
        worker.stop()
        writer.close()
    return counts


def summary_table(rows: list[dict]) -> str:
    """variant (x the facets that vary) by seq_len: median ms, or the status as a word.
    Variants with no cell that could run here are listed below the table with the reason."""
    import pandas as pd
    from tabulate import tabulate

    if not rows:
        return "(no rows)"
    df = pd.DataFrame(rows)
    if "median_ms" not in df:
        df["median_ms"] = None
    facets = [c for c in ("device", "dtype", "direction", "mask", "window", "batch", "heads",
                          "kv_heads", "head_dim") if c in df and df[c].astype(str).nunique() > 1]
    if (df["kv_len"] != df["q_len"]).any():
        facets.append("kv_len")
    df["cell"] = [f"{m:.3g}" if s == "ok" else s for m, s in zip(df["median_ms"], df["status"])]
    never = df.groupby("variant")["status"].agg(lambda s: (s == "unsupported").all())
    skipped = df[df["variant"].isin(never[never].index)]
    df = df[~df["variant"].isin(never[never].index)]
    # rows of a variant in a facet it does not declare (e.g. flex.window under mask=causal)
    df = df.groupby(facets + ["variant"], dropna=False).filter(
        lambda g: not (g["status"] == "unsupported").all())
    lines = []
    if not df.empty:
        table = df.pivot_table(index=facets + ["variant"], columns="q_len", values="cell",
                               aggfunc="first", sort=True).fillna("")
        table.columns = [f"n={c}" for c in table.columns]
        lines.append("median ms (or status) by sequence length")
        lines.append(tabulate(table.reset_index(), headers="keys", showindex=False))
    for name, g in skipped.groupby("variant"):
        lines.append(f"unsupported here: {name}: {g['reason'].iloc[0]}")
    return "\n".join(lines)
