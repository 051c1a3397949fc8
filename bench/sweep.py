"""``python -m bench sweep``: expand the spec, run every cell in the isolated worker, and
append each row to the run folder as soon as it is known."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench import masks, store
from bench.case import Case
from bench.cell import STATUSES, base_row
from bench.errors import UsageError
from bench.registry import available, discover, plugin_module
from bench.runner import Worker, WorkerSettings
from bench.spec import AXES, as_list, build_spec, load_config

FLAG_KEYS = AXES + ("device", "timeout", "budget_ms", "preset", "threads", "precision", "rounds")


def collect_given(args) -> dict:
    given = load_config(args.config) if args.config else {}
    for key in FLAG_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            given[key] = value
    for key in AXES:  # lists from here on, whether from a flag ("a,b") or the file
        if given.get(key) is not None:
            given[key] = as_list(key, given[key])
    listed = given.get("plugins") or []
    if isinstance(listed, str):
        listed = [listed]  # plugins = "x.py" is one file, not four characters
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        raise UsageError(f"--config: plugins takes a list of paths, got {listed!r}")
    plugins = list(listed) + list(args.plugin)
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
    if flags.get("window") is not None and not any(masks.uses_window_flag(m) for m in spec.masks):
        print(f"warning: --window {','.join(map(str, flags['window']))} has no effect: no window mask in --masks "
              f"({','.join(spec.masks)}); add window to --masks to use it", file=sys.stderr)
    retry = _retry_statuses(args, resume)
    run_dir = _run_folder(resume, args.out, spec.device)
    with store.locked(run_dir):
        return _sweep_in(run_dir, resume, spec, given, registry, retry, args)


def _retry_statuses(args, resume) -> set:
    raw = getattr(args, "retry", None)
    if raw is None:
        return set()
    if resume is None:
        raise UsageError("--retry re-measures cells of an earlier run: give it with --resume RUN")
    valid = [s for s in STATUSES if s not in ("ok", "unsupported")]
    wanted = [s.strip() for s in str(raw).split(",") if s.strip()]
    bad = [s for s in wanted if s not in valid]
    if bad or not wanted:
        raise UsageError(f"--retry takes statuses from {', '.join(valid)}, got {raw!r}")
    return set(wanted)


def _run_folder(resume: Path | None, out: str | None, device: str) -> Path:
    """The folder to write: the resumed one, a new --out, or a new timestamped one.  An
    existing run is never written to without --resume (its env.json holds its history)."""
    if resume is not None:
        return resume
    if not out:
        return store.new_run_dir(device)
    path = Path(out)
    if path.is_dir() and ((path / store.RESULTS).exists() or (path / store.ENV).exists()):
        raise UsageError(f"--out {out}: already a run folder; --resume {out} measures only the cells it lacks "
                         f"(or choose a new --out)")
    return store.writable_dir(path)


def _sweep_in(run_dir: Path, resume, spec, given: dict, registry, retry: set, args) -> int:
    cases = spec.cases()
    run_dir, env = _open_run(run_dir, resume is not None, spec, given, registry,
                             getattr(args, "allow_env_change", False))
    done = {store.cell_key(r["variant"], r) for r in store.read_rows(run_dir, repair=True)
            if r.get("status") not in retry}
    cells = [(name, case) for case in cases for name in spec.variants
             if store.cell_key(name, case) not in done]
    print(f"run folder: {run_dir}  ({len(cells)} cells to run, {len(done)} already there; "
          f"device {spec.device}, {env['threads']} threads)", file=sys.stderr)
    t0 = time.perf_counter()
    counts, timed_s = _run_cells(cells, run_dir, spec, registry, given["plugins"], env["peaks_tflops"], args)
    rows = store.read_rows(run_dir)
    _close_run(run_dir, spec, rows)
    elapsed = time.perf_counter() - t0
    print(summary_table(rows))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
          + f"  ({len(cells)} cells in {elapsed:.0f} s)")
    warning = contention_warning(rows, spec)
    if warning:
        print(warning, file=sys.stderr)
    if not getattr(args, "no_report", False):
        from reports.build import build_report

        try:
            print(f"report: {build_report([run_dir])}")
        except Exception as exc:  # the rows are measured and kept: a report is rebuilt from them
            print(f"warning: the report could not be built ({type(exc).__name__}: {exc}); the rows are in "
                  f"{run_dir / store.RESULTS}, and `python -m bench report {run_dir}` builds it again",
                  file=sys.stderr)
    print(f"results: {run_dir / store.RESULTS}")
    print(f"timed samples: {timed_s:.1f} s of {elapsed:.1f} s wall ({100 * timed_s / max(elapsed, 1e-9):.0f}%)")
    bad = failures(rows)
    if getattr(args, "strict", False) and bad:
        print(f"strict: {len(bad)} failed cell(s), e.g. {bad[0]}", file=sys.stderr)
        return 1
    return 0


FAILED = ("error", "crash", "timeout", "mismatch", "oom")


def failures(rows: list[dict]) -> list[str]:
    """Cells that failed: an error, crash, timeout, mismatch or oom, or 'unsupported' with no
    reason (a capability or library refusal always gives one)."""
    newest = {store.cell_key(r.get("variant"), r): r for r in rows}  # a cell measured again is its newest row
    out = []
    for r in newest.values():
        status = r.get("status")
        if status in FAILED or (status == "unsupported" and not (r.get("reason") or "").strip()):
            out.append(f"{r.get('variant')} {status} at n={r.get('q_len')} {r.get('mask')} {r.get('direction')}"
                       f" {r.get('dtype')}: {(r.get('reason') or 'no reason given')[:160]}")
    return out


def contention_warning(rows: list[dict], spec) -> str:
    """A warning that counts the contended cells and says what to do, or ''."""
    ok = [r for r in rows if r.get("status") == "ok"]
    bad = [r for r in ok if r.get("contended")]
    if not bad:
        return ""
    return (f"warning: {len(bad)} of {len(ok)} ok cells were timed while the CPU was shared (contended: "
            f"e.g. {bad[0].get('contended_why')}). Their numbers are kept but flagged, drawn hollow and left "
            f"out of fits. For numbers you can trust, rerun on a quieter machine, or with fewer threads than "
            f"cores (--threads {max(1, (os.cpu_count() or 2) - 1)}) so that other processes have a core of "
            f"their own.")


FINGERPRINT_KEYS = ("torch", "xformers", "cuda", "python", "device", "device_name", "cpu", "cpu_count", "threads")


def _open_run(run_dir: Path, resumed: bool, spec, given: dict, registry, allow_env_change: bool = False):
    """The run folder with its env.json written: the fingerprint, the spec, the load
    average, the matmul peak of every dtype the spec uses and the copy bandwidth (measured
    once per run, at the sweep's thread count), and a history entry for this invocation.  A resume on a machine
    whose fingerprint differs is refused unless ``allow_env_change``; then env.json says
    the run is mixed."""
    from bench.contention import load_average
    from bench.envinfo import fingerprint, measure_peak_gbps, measure_peak_tflops

    here = fingerprint(spec.device)
    here["threads"] = spec.threads or here["threads"]
    env = store.read_env(run_dir) if resumed else {}
    if env:
        before = (env.get("history") or [{}])[-1].get("fingerprint") or {k: env.get(k) for k in FINGERPRINT_KEYS}
        changed = [f"{k}: {before.get(k)} -> {here.get(k)}" for k in FINGERPRINT_KEYS if before.get(k) != here.get(k)]
        if changed and not allow_env_change:
            raise UsageError(f"--resume {run_dir}: this machine differs from the run's ({'; '.join(changed)}); its "
                             f"rows would not compare. --allow-env-change resumes anyway and marks the run mixed")
        if changed:
            env.setdefault("mixed_env", []).extend(changed)
        old = env.get("spec") or {}
        differs = sorted(k for k, v in spec.to_dict().items() if k in old and old[k] != v)
        if differs:
            print(f"note: the spec differs from the run's in {', '.join(differs)}; both stay in env.json's "
                  f"history, and every row records its own settings", file=sys.stderr)
        env.setdefault("resumed", []).append(" ".join(["python", "-m", "bench"] + sys.argv[1:]))
    else:
        env = here | {"peaks_tflops": {}}
    env["threads"] = here["threads"]
    baseline = registry.baseline()
    env |= {"given": given, "spec": spec.to_dict(), "baseline": baseline.name if baseline else None,
            "loadavg_start": load_average()}
    env.setdefault("history", []).append({
        "command": " ".join(["python", "-m", "bench"] + sys.argv[1:]), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "spec": spec.to_dict(), "fingerprint": {k: here.get(k) for k in FINGERPRINT_KEYS}})
    from bench.runner import wait_prestarted

    wait_prestarted()  # no import running beside the peak measurement
    for dtype in spec.dtypes:
        if dtype not in env["peaks_tflops"]:
            env["peaks_tflops"][dtype] = measure_peak_tflops(spec.device, dtype, spec.threads)
    if not env.get("peak_gbps"):
        env["peak_gbps"] = measure_peak_gbps(spec.device, spec.threads)
    store.write_env(run_dir, env)
    _write_mask_pictures(run_dir, spec)
    return run_dir, env


def _write_mask_pictures(run_dir: Path, spec) -> None:
    """masks.json: every mask of the sweep, its definition and keep pattern at n = 256 (the report's pictures)."""
    pictures = store.read_masks(run_dir)
    for case in spec.cases():
        name = masks.label(case.mask, case.window)
        if name not in pictures:
            pictures[name] = masks.picture(case)
    store.write_json(run_dir, store.MASKS, pictures)


def _close_run(run_dir: Path, spec, rows: list[dict]) -> None:
    """The end of a sweep in env.json: the load average, and the matmul peak measured again.
    The peak kept is the higher of the two; a cell above it means the peak is still wrong,
    and env.json says so (``peak_unreliable``) for the report to show."""
    from bench.contention import load_average
    from bench.envinfo import measure_peak_tflops

    env = store.read_env(run_dir)
    env["loadavg_end"] = load_average()
    checks = env.setdefault("peak_checks", {})
    best_cell = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("tflops"):
            best_cell[r["dtype"]] = max(best_cell.get(r["dtype"], 0.0), float(r["tflops"]))
    unreliable = env.setdefault("peak_unreliable", {})
    for dtype in spec.dtypes:
        again = measure_peak_tflops(spec.device, dtype, spec.threads)
        start = env["peaks_tflops"].get(dtype, 0.0)
        checks[dtype] = {"start": start, "end": again}
        env["peaks_tflops"][dtype] = peak = max(start, again)
        top = best_cell.get(dtype, 0.0)
        if top > peak:
            unreliable[dtype] = (f"a cell reached {100 * top / peak:.0f}% of the measured {dtype} matmul peak "
                                 f"({peak:.3g} TFLOP/s, measured at the start and again at the end): the peak "
                                 f"is too low for this machine, so % of peak is not reliable for {dtype}")
        else:
            unreliable.pop(dtype, None)
    store.write_env(run_dir, env)


def _run_cells(cells, run_dir: Path, spec, registry, plugins, peaks: dict, args) -> tuple[dict, float]:
    """Each cell to a row, appended as soon as it is known; unavailable cells are recorded
    as 'unsupported' without launching them.  The variants of one case go to the worker
    together, to be timed in interleaved rounds; when the worker dies or overruns in a
    group, the variants still without a row run again one at a time, so that the cell
    that crashed is the one marked.  Returns the status counts and the timed seconds."""
    from tqdm import tqdm

    writer = store.ResultWriter(run_dir)
    worker = Worker(WorkerSettings(plugins=plugins, budget_ms=spec.budget_ms, threads=spec.threads,
                                   precision=spec.precision / 100.0, rounds=spec.rounds,
                                   log_path=str(run_dir / "worker.log")))
    counts = dict.fromkeys(STATUSES, 0)
    timed = [0.0]
    measured: dict = {}  # case: names of the variants measured ok in this invocation
    bar = tqdm(total=len(cells), unit="cell", dynamic_ncols=True, file=sys.stderr,
               disable=getattr(args, "quiet", False))

    def record(row: dict) -> None:
        dtype = row.get("dtype")
        if row.get("tflops") and peaks.get(dtype):
            row["pct_peak"] = 100.0 * row["tflops"] / peaks[dtype]
        writer.write(row)
        if row["status"] == "ok":
            measured.setdefault(Case.from_dict(row), []).append(row["variant"])
        counts[row["status"]] += 1
        timed[0] += row.get("timed_s") or 0.0
        bar.update(1)

    def run(names: list[str], case) -> None:
        got = []
        tag, why = worker.run_group(names, case, spec.timeout, lambda row: (got.append(row["variant"]),
                                                                            record(row)))
        missing = [n for n in names if n not in got]
        if tag == "done" or not missing:
            return
        culprit = worker.last_started if worker.last_started in missing else None
        if culprit is None and len(missing) == 1:
            culprit = missing[0]
        if culprit is None:
            for name in missing:  # find the culprit: one at a time
                run([name], case)
            return
        record(base_row(culprit, case, tag, why))  # it was running when the worker died or hung
        rest = [n for n in missing if n != culprit]
        if rest:
            run(rest, case)

    try:
        for case, names in _by_case(cells):
            bar.set_postfix_str(f"{case.label()}", refresh=False)
            runnable = []
            for name in names:
                ok, why = available(registry[name], case, probe=False)  # probes run in the worker
                if ok:
                    runnable.append(name)
                else:
                    record(base_row(name, case, "unsupported", why))
            if runnable:
                run(runnable, case)
        if getattr(args, "profile", False) and measured:
            _profile_pass(worker, run_dir, measured, spec.timeout, bar)
    finally:
        bar.close()
        worker.stop()
        writer.close()
    return counts, timed[0]


def _profile_pass(worker, run_dir: Path, measured: dict, timeout: float, bar) -> None:
    """sweep --profile: every cell measured ok, profiled again after all the timing (a
    profiler must not run just before a timed loop), into profile.jsonl."""
    writer = store.ResultWriter(run_dir, store.PROFILE)
    try:
        for case, names in measured.items():
            bar.set_postfix_str(f"profiling {case.label()}", refresh=False)
            tag, why = worker.run_group(names, case, timeout, writer.write, mode="profile")
            if tag != "done":
                print(f"warning: the profiled pass of {case.label()} ended early: {why}", file=sys.stderr)
    finally:
        writer.close()


def _by_case(cells):
    """(case, [variant names]) in the order the cells come."""
    groups: dict = {}
    for name, case in cells:
        groups.setdefault(case, []).append(name)
    return groups.items()


def shaky_mask(df):
    """True where an ok row is noisy or contended (a pandas Series over ``df``)."""
    import pandas as pd

    flags = pd.Series(False, index=df.index)
    for col in ("noisy", "contended"):
        if col in df:
            flags |= df[col].fillna(False).astype(bool)
    return flags & (df["status"] == "ok")


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
    shaky = shaky_mask(df)
    df["cell"] = [(f"{m:.3g}" + ("*" if f else "")) if s == "ok" else s
                  for m, s, f in zip(df["median_ms"], df["status"], shaky)]
    never = df.groupby("variant")["status"].agg(lambda s: (s == "unsupported").all())
    skipped = df[df["variant"].isin(never[never].index)]
    df = df[~df["variant"].isin(never[never].index)]
    # rows of a variant in a facet it does not declare (e.g. window.chunked under mask=causal)
    df = df.groupby(facets + ["variant"], dropna=False).filter(
        lambda g: not (g["status"] == "unsupported").all())
    lines = []
    if not df.empty:
        table = df.pivot_table(index=facets + ["variant"], columns="q_len", values="cell",
                               aggfunc="first", sort=True).fillna("")
        table.columns = [f"n={c}" for c in table.columns]
        lines.append("median ms (or status) by sequence length")
        lines.append(tabulate(table.reset_index(), headers="keys", showindex=False))
        if shaky[df.index].any():
            lines.append("* noisy (the median's 95% CI reaches beyond +-5%) or contended (timed while the CPU "
                         "was shared): kept, but flagged and left out of fits")
    for name, g in skipped.groupby("variant"):
        lines.append(f"unsupported here: {name}: {g['reason'].iloc[0]}")
    return "\n".join(lines)
