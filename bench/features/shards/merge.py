"""Shards of one sweep joined into one run folder: ``python -m bench merge A B ... --out RUN``.

The shards must measure the same thing (their specs agree on everything but how they ran:
shard, workers, executor) and no cell may be measured in two of them.  The merged folder
holds every row once (each cell's current row), its worker named with its shard, the masks
of all, and an env.json that keeps every shard's environment (``shards``) and maps each
worker to the hardware it measured on (``worker_devices``: the report facets by it when
the shards ran on different machines)."""

from __future__ import annotations

from pathlib import Path

from bench.errors import UsageError
from bench.model.row import current_rows
from bench.model.spec import measured_part, spec_from_dict
from bench.runs import judge, store, visits


def merge_runs(run_dirs, out) -> Path:
    """Join ``run_dirs`` (shards of one spec) into the new run folder ``out``; returns it."""
    dirs = [store.require_run(d) for d in run_dirs]
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise UsageError("merge: a run folder is named twice")
    envs = [store.read_env(d) for d in dirs]
    for d, env in zip(dirs, envs):
        if not env.get("spec"):
            raise UsageError(f"merge: {d} has no spec in its env.json; only run folders of a sweep merge")
    first = _measured(envs[0]["spec"])
    for d, env in zip(dirs[1:], envs[1:]):
        other = _measured(env["spec"])
        differs = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
        if differs:
            raise UsageError(f"merge: {dirs[0]} and {d} measure different things (their specs differ in "
                             f"{', '.join(differs)}); only shards of one sweep merge")
    seen: dict = {}
    rows: list = []
    devices: dict = {}  # worker label in the merged run: the hardware it measured on
    for d, env in zip(dirs, envs):
        tag = f"shard {env['shard']}" if env.get("shard") else d.name
        for row in current_rows(store.read_rows(d, with_visits=False)):  # as written: visits come apart
            key = store.cell_key(row["variant"], row)
            if key in seen:
                raise UsageError(f"merge: the cell {row['variant']} {_label(row)} is measured in both {seen[key]} "
                                 f"and {d}; shards of one sweep never share a cell")
            seen[key] = d
            worker = row.get("worker") or env.get("device") or "?"
            label = f"{tag}: {worker}"  # workers of two shards may share a name, never their hardware
            devices[label] = (env.get("worker_devices") or {}).get(worker) or env.get("device_name")
            rows.append(row | {"worker": label})
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: exists and is not empty; merge writes a new run folder")
    out = store.writable_dir(out)
    writer = store.ResultWriter(out)
    try:
        for row in rows:
            writer.write(_unflatten(row))
    finally:
        writer.close()
    for name in (store.PROFILE, visits.VISITS):  # the profiled pass and the later visits, tied to their rows
        extra = [r for d in dirs for r in store.read_rows(d, name=name)]
        if extra:
            w = store.ResultWriter(out, name)
            try:
                for r in extra:
                    w.write(r)
            finally:
                w.close()
    pictures: dict = {}
    for d in dirs:
        pictures |= store.read_masks(d)
    store.write_json(out, store.MASKS, pictures)
    store.write_env(out, merged_env(dirs, envs) | {"worker_devices": devices, "row_formats": [[1, store.FORMAT]]})
    return out


def _measured(spec: dict) -> dict:
    """What a saved spec measures (the settings of how it ran left out, as for the sweep id)."""
    return measured_part(spec_from_dict(spec))


def _label(row: dict) -> str:
    return f"n={row.get('q_len')} {row.get('mask')} {row.get('direction')} {row.get('dtype')}"


def _unflatten(row: dict) -> dict:
    """A row as read (a variant's figures as columns) back into its written form."""
    from bench.model.row import COLUMNS

    extra = {k.removeprefix("extra."): v for k, v in row.items() if k not in COLUMNS}
    return {k: v for k, v in row.items() if k in COLUMNS} | ({"extra": extra} if extra else {})


def merged_env(dirs, envs) -> dict:
    env = dict(envs[0])
    env["merged_from"] = [{"path": str(d), "shard": e.get("shard"), "sweep_id": e.get("sweep_id"),
                           "workers": e.get("workers")} for d, e in zip(dirs, envs)]
    env["shards"] = [dict(e) for e in envs]  # every shard's own environment, whole
    env["spec"] = dict(envs[0]["spec"]) | {"shard": None}
    peaks: dict = {}
    for e in envs:  # the best of each dtype's measured peaks: a peak measured too low is the usual error
        for dtype, value in (e.get("peaks_tflops") or {}).items():
            peaks[dtype] = max(peaks.get(dtype, 0.0), value or 0.0)
    env["peaks_tflops"] = peaks
    env["peak_gbps"] = max((e.get("peak_gbps") or 0.0) for e in envs) or None
    changed = sorted({k for e in envs[1:] for k in judge.FINGERPRINT if e.get(k) != envs[0].get(k)})
    if "threads" in changed and (env["spec"].get("threads") is None):  # --threads auto chose per shard, by its load:
        changed.remove("threads")  # noted, as a resume notes it, not a machine that differs
        env["threads_by_shard"] = [e.get("threads") for e in envs]
    if changed:  # shards that ran on different machines: the report says the run is mixed
        env["mixed_env"] = list(env.get("mixed_env") or []) + [
            f"{k}: " + " / ".join(str(e.get(k)) for e in envs) for k in changed]
    return env
