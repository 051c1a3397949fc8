"""A sweep's run folder around its cells: env.json at the start (the fingerprint, the spec, the
load, the machine's peaks, a history entry for the invocation; a resume on another machine
refused or marked), masks.json, and env.json at the end (the load, the peaks measured again,
this invocation's projected and measured times, which bench.features.cost_model.plan learns from)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from bench.engine import peaks
from bench.errors import UsageError
from bench.measure import cpuload
from bench.model.row import current_rows
from bench.runs import judge, maskfile, store

log = logging.getLogger(__name__)  # printed by the handler the command line installs (bench.engine.events)


def measured_times(cells, rows, wall_s: float, workers: int, options) -> dict:
    """This invocation's times for env.json's history: its cells' wall time, their setups
    (per worker), and the rest, next to what the plan projected and modelled."""
    keys = {store.cell_key(n, c) for n, c in cells}
    mine = [r for r in current_rows(rows) if store.cell_key(r["variant"], r) in keys]
    setup = sum((r.get("setup_ms") or 0.0) / 1e3 for r in mine) / max(1, workers)
    ok = [r for r in rows if r.get("status") == "ok" and store.cell_key(r["variant"], r) in keys]  # re-measured too
    contended = sum(1 for r in ok if "contended" in judge.shaky_flags(r))
    return {"cells_wall_s": round(wall_s, 3), "setup_s": round(setup, 3),
            "measured_rest_s": round(max(0.0, wall_s - setup), 3), "projected_s": options.projected_s,
            "model_rest_s": options.model_rest_s, "model": options.model,
            "others_cores_start": options.others_cores_start,
            "contended_share": round(contended / len(ok), 3) if ok else None}


def open_run(run_dir: Path, resumed: bool, spec, given: dict, registry, allow_env_change: bool = False,
             command: str = "", slots=(), auto: int | None = None, cases=None):
    """The run folder with its env.json written: the fingerprint, the spec, the load
    average, the matmul peak of every dtype the spec uses and the copy bandwidth (measured
    once per run, at the sweep's thread count), and a history entry for this invocation.  A resume on a machine
    whose fingerprint differs is refused unless ``allow_env_change``; then env.json says
    the run is mixed."""
    from bench.measure.envinfo import fingerprint, peak_run_ms

    here = fingerprint(spec.device)
    here["threads"] = spec.threads or auto or here["threads"]
    env = store.read_env(run_dir) if resumed else {}
    if env:
        before = (env.get("history") or [{}])[-1].get("fingerprint") or {k: env.get(k) for k in judge.FINGERPRINT}
        changed = judge.fingerprint_changes(before, here)
        chosen = spec.threads is None and all(c.startswith("threads:") for c in changed)
        if changed and chosen:  # --threads auto chose another count under another load: noted, not refused
            changed = [f"{c} (--threads auto)" for c in changed]
            log.info("note: %s: the load differs from the run's last invocation; env.json's history keeps both and "
                     "the report says the folder mixes conditions", changed[0])
        elif changed and not allow_env_change:
            raise UsageError(f"--resume {run_dir}: this machine differs from the run's ({'; '.join(changed)}); its "
                             f"rows would not compare. --allow-env-change resumes anyway and marks the run mixed")
        if changed:
            env.setdefault("mixed_env", []).extend(changed)
        old = env.get("spec") or {}
        differs = sorted(k for k, v in spec.to_dict().items() if k in old and old[k] != v)
        if differs:
            log.info("note: the spec differs from the run's in %s; both stay in env.json's history, and every row "
                     "records its own settings", ", ".join(differs))
        env.setdefault("resumed", []).append(command)
    else:
        env = here | {"peaks_tflops": {}}
    env["threads"] = here["threads"]
    import torch

    # what the workers run under (--deterministic sets it in each, per job)
    env["deterministic_algorithms"] = bool(spec.deterministic) or torch.are_deterministic_algorithms_enabled()
    env["heap"] = spec.heap or "fixed"  # the workers' C heap (--heap; bench.engine.runner.steady_heap)
    baseline = registry.baseline()
    from bench.model.spec import sweep_id

    colours = {n: registry[n].traits.colour for n in spec.variants if n in registry and registry[n].traits.colour
               is not None}
    env["colours"] = {**env.get("colours", {}), **colours}  # each variant's palette slot, as it declares (reports)
    env |= {"given": given, "spec": spec.to_dict(), "baseline": baseline.name if baseline else None,
            "loadavg_start": cpuload.load_average(), "sweep_id": sweep_id(spec), "shard": spec.shard,
            "workers": [s.label for s in slots]}
    threads = slots[0].threads if len(slots) > 1 else (spec.threads or auto)  # the peak at one worker's threads
    env["peak_threads"] = threads
    env["peak_run_ms"] = run_ms = peak_run_ms(spec.device, spec.budget_ms)
    env.setdefault("history", []).append({
        "command": command, "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "spec": spec.to_dict(), "fingerprint": {k: here.get(k) for k in judge.FINGERPRINT},
        "loadavg_start": env["loadavg_start"]})
    peaks.fill(env, here, spec, threads, run_ms)  # the matmul peaks and the copy bandwidth: cached or measured
    env["row_formats"] = store.row_formats(run_dir, env)  # an older folder resumed: its lines keep their format
    store.write_env(run_dir, env)
    write_mask_pictures(run_dir, spec.cases() if cases is None else cases)
    return env


def write_mask_pictures(run_dir: Path, cases) -> None:
    """masks.json: every mask of the sweep's ``cases``, its definition and keep pattern at n = 256 (the
    report's pictures)."""
    pictures = store.read_masks(run_dir)
    for case in cases:
        name = maskfile.label(case.mask, case.window)
        if name not in pictures:
            pictures[name] = maskfile.picture(case)
    store.write_json(run_dir, store.MASKS, pictures)


def close_run(run_dir: Path, spec, rows: list[dict], devices: dict | None = None,
              measured: dict | None = None) -> None:
    """The end of a sweep in env.json: the load average, and the matmul peak measured again.
    The peak kept is the higher of the two; a cell above it means the peak is still wrong,
    and env.json says so, with the figure (``peak_unreliable``; the report finds the same
    from the rows).  Approximate variants have no TFLOP/s of their own and do not count.
    The end peak is measured again when other processes took the cores while it ran and one
    look at the load finds them gone (``peak_checks[dtype]["end_under_load"]`` when they stayed)."""
    env = store.read_env(run_dir)
    env["loadavg_end"] = cpuload.load_average()
    this = (env.get("history") or [{}])[-1]  # this invocation's conditions, beside the folder's
    this["loadavg_end"] = env["loadavg_end"]
    this.update(measured or {})  # its projected and measured times (bench.features.cost_model.plan learns from them)
    env["worker_devices"] = (env.get("worker_devices") or {}) | (devices or {})  # worker: what it measured on
    checks = env.setdefault("peak_checks", {})
    best_cell = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("tflops") and not r.get("approximate"):  # an older row may have one
            best_cell[r["dtype"]] = max(best_cell.get(r["dtype"], 0.0), float(r["tflops"]))
    unreliable = env.setdefault("peak_unreliable", {})
    threads = env.get("peak_threads", spec.threads)
    sources = env.get("peaks_source") or {}
    for dtype in spec.dtypes:
        start = env["peaks_tflops"].get(dtype, 0.0)
        if str(sources.get(dtype, "")).startswith("cached"):  # measured recently on this machine: not again
            end, loaded = start, ""
        else:
            end, loaded = peaks.unloaded_peak(spec, dtype, threads)
            peaks.PeakCache(spec.peak_age).put(peaks.key(env, "tflops", dtype, threads, env.get("peak_run_ms", 0.0)),
                                               end)
        checks[dtype] = {"start": start, "end": end} | ({"end_under_load": loaded} if loaded else {})
        this.setdefault("peaks_end", {})[dtype] = end
        env["peaks_tflops"][dtype] = peak = max(start, end)
        top = best_cell.get(dtype, 0.0)
        if peak and top > peak:  # a dtype with no matmul here (fp8 on the CPU) has no peak: 0
            unreliable[dtype] = (f"a cell reached {100 * top / peak:.0f}% of the measured {dtype} matmul peak "
                                 f"({peak:.3g} TFLOP/s, measured at the start and again at the end): the peak "
                                 f"is too low for this machine, so % of peak is not reliable for {dtype}")
        else:
            unreliable.pop(dtype, None)
    store.write_env(run_dir, env)
