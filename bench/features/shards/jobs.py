"""Shards as jobs, through submitit: Slurm on a cluster, or submitit's local executor.

A sweep folder holds one run folder per shard, submitit's own folder and ``sweep.json``:

    <sweep>/sweep.json           the sweep id, the executor, each shard's job id and folder
    <sweep>/shard-1-of-N/        an ordinary run folder (results.jsonl, env.json, ...)
    <sweep>/submitit/            submitit's pickles and each job's logs

Each job runs the ordinary sweep (``bench.engine.sweep.run_sweep``) of its shard in its
folder, resuming when the folder already holds rows: a resubmitted or requeued job
measures only the cells its shard still lacks.  No scheduler of our own: submitit submits,
Slurm (or the local executor) runs, and the shards' split is ``bench.features.cost_model.plan``'s.

submitit's pitfalls, handled here: its local executor shows every job the GPUs 0..n-1, so
each job is given its own GPU; and it kills a local job after 2 minutes when no timeout
is set, so a timeout is always set.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import replace
from pathlib import Path

from bench.engine.prepare import Prep, Prepared
from bench.errors import UsageError
from bench.model.spec import Spec, shard_pair, spec_from_dict
from bench.runs import store

SWEEP_FILE = "sweep.json"
SUBMITIT_DIR = "submitit"
INSTALL_HINT = "pip install -e '.[slurm]' (or pip install submitit)"


def require_submitit(executor: str):
    try:
        import submitit
    except ImportError:
        raise UsageError(f"--executor {executor} runs the shards through submitit, which is not installed: "
                         f"{INSTALL_HINT}") from None
    return submitit


def run_shard(spec_dict: dict, folder: str, cuda_device: int | str | None = None, listen=None,
              span: dict | None = None) -> dict:
    """A job's work: the shard's sweep in its folder (resumed when it holds rows already).
    Returns its status counts.  ``cuda_device``: the one GPU this job may use, as the
    submitting process's CUDA_VISIBLE_DEVICES names it; ``listen``: what the submitter gave to
    hear the sweep's notes in the job's log (a picklable function, called first); ``span``: a job
    of several nodes (``nodes``, the job's ``key``): task 0 runs the sweep, the others are rank
    hosts for the cells whose ranks span nodes (bench.engine.hosts)."""
    if listen is not None:
        listen()
    if cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(cuda_device)
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    from bench.engine.sweep import SweepOptions, run_sweep

    folder = Path(folder)
    spec = spec_from_dict(spec_dict)
    leading = contextlib.nullcontext()
    if span and span["nodes"] > 1:
        import socket

        import submitit

        from bench.engine import hosts

        job = submitit.JobEnvironment()
        where = folder.parent / SUBMITIT_DIR / "hosts" / str(job.job_id)
        name = "127.0.0.1" if span.get("local") else socket.gethostname()
        if job.global_rank > 0:
            groups = hosts.serve(where, job.global_rank, span["key"], name)
            return {"shard": spec.shard, "folder": str(folder), "node": job.global_rank, "groups": groups}
        leading = hosts.leading(where, span["key"], span["nodes"], name)
    resumed = (folder / store.ENV).exists()
    with leading:
        summary = run_sweep(spec, folder, SweepOptions(resume=resumed, progress=False,
                                                       command=f"job: shard {spec.shard} in {folder}"))
    return {"shard": spec.shard, "folder": str(folder), "counts": summary.counts, "cells": summary.cells,
            "already": summary.already}


def submit(spec: Spec, sweep_dir: Path, shards: int, per_shard_s: float, listen=None) -> dict:
    """Submit one job per shard of ``spec``; returns (and writes) the sweep record.  ``listen``: a
    picklable function each job calls first, so that its log holds the sweep's notes (run_shard)."""
    from bench.model.spec import sweep_id

    submitit = require_submitit(spec.executor)
    if spec.executor == "slurm":
        import shutil

        if shutil.which("sbatch") is None:
            raise UsageError("--executor slurm: no Slurm here (sbatch is not on the PATH); --executor local runs "
                             "the same jobs on this machine")
    nodes = spec.slurm_nodes or 1
    if nodes > 1:
        from bench.engine.hosts import check_world

        if spec.executor == "local" and spec.device == "cuda":
            raise UsageError(f"--executor local --slurm-nodes {nodes} on a GPU: the tasks standing in for nodes would "
                             f"share this machine's GPUs; give --slurm-nodes 1, or --executor slurm")
        check_world(spec.ranks, nodes, spec.slurm_gpus_per_node, spec.device)
    gpus = _local_gpus(spec) if spec.executor == "local" else []
    if gpus and shards > len(gpus):
        raise UsageError(f"--executor local --shards {shards}: this machine has {len(gpus)} GPU(s) for them, and "
                         f"shards beyond that would share a GPU and time each other; give --shards {len(gpus)} or "
                         f"fewer")
    sweep_dir = store.writable_dir(sweep_dir)
    minutes = spec.slurm_time or max(10, math.ceil(2 * per_shard_s / 60))
    if spec.executor == "slurm":
        ex = submitit.AutoExecutor(folder=sweep_dir / SUBMITIT_DIR, cluster="slurm")
        params = {"timeout_min": minutes, "name": sweep_id(spec), "slurm_partition": spec.slurm_partition,
                  "gpus_per_node": spec.slurm_gpus_per_node, "nodes": nodes if nodes > 1 else None,
                  "tasks_per_node": 1 if nodes > 1 else None,
                  "slurm_array_parallelism": spec.slurm_array_parallelism or shards}
        ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
    else:  # the local executor itself: AutoExecutor does not pass visible_gpus through
        ex = submitit.LocalExecutor(folder=sweep_dir / SUBMITIT_DIR)
        ex.update_parameters(timeout_min=minutes, tasks_per_node=nodes)  # (a task for each node)
    from bench.engine import placement

    visible = placement.visible_ids()
    jobs = []
    import secrets

    span = {"nodes": nodes, "key": secrets.token_hex(16), "local": spec.executor == "local"} if nodes > 1 else None
    for i in range(1, shards + 1):
        shard_spec = replace(spec, shard=f"{i}/{shards}", executor=None, shards=None, slurm_nodes=None)
        folder = store.shard_folder(sweep_dir, i, shards)
        device = placement.device_id(gpus[i - 1], visible) if gpus else None
        jobs.append((i, folder, device, shard_spec.to_dict()))
    if spec.executor == "slurm":
        with ex.batch():  # one job array
            handles = [ex.submit(run_shard, d, str(f), None, listen, span) for _, f, _, d in jobs]
    else:
        handles = []
        for _, f, device, d in jobs:  # every local job would see GPUs 0..n-1: each gets its own, or none
            ex.update_parameters(gpus_per_node=1 if device is not None else 0,
                                 visible_gpus=(device,) if device is not None else ())
            handles.append(ex.submit(run_shard, d, str(f), device, listen, span))
    record = {"sweep_id": sweep_id(spec), "executor": spec.executor, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "timeout_min": minutes, "submitit_folder": str(sweep_dir / SUBMITIT_DIR),
              "spec": replace(spec, executor=None, shards=None).to_dict(),
              "jobs": [{"shard": f"{i}/{shards}", "job_id": str(h.job_id), "folder": str(f)}
                       for (i, f, _, _), h in zip(jobs, handles)]}
    store.write_json(sweep_dir, SWEEP_FILE, record, indent=2)
    return record | {"handles": handles}


def _local_gpus(spec: Spec) -> list[int]:
    if spec.device != "cuda":
        return []
    from bench.engine import placement

    return placement.parse_gpus(spec.gpus or "all", placement.visible_gpus()) or []


def read_sweep(sweep_dir: Path) -> dict:
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise UsageError(f"{sweep_dir}: not a sweep folder (no readable {SWEEP_FILE}; a sweep with --executor "
                         f"writes one)") from None


def find_sweep(name: str, root: Path) -> Path:
    """A sweep folder from its id (under ``root``) or its path."""
    for candidate in (Path(name), Path(root) / name):
        if (candidate / SWEEP_FILE).is_file():
            return candidate
    known = sorted(p.parent.name for p in Path(root).glob(f"*/{SWEEP_FILE}"))
    raise UsageError(f"no sweep {name!r} (a sweep id under {root}/ or a sweep folder); known: "
                     f"{', '.join(known) or 'none'}")


def job_states(record: dict) -> list[dict]:
    """Each job of a sweep: its state (from submitit; a local job by its process) and the
    cells its shard folder holds against the cells of its shard."""
    from bench.engine.discovery import discover
    from bench.engine.sweep import spec_cells

    spec = spec_from_dict(record["spec"])
    registry = discover(spec.plugins)
    out = []
    for job in record["jobs"]:
        wanted = {store.cell_key(name, case) for name, case in spec_cells(replace(spec, shard=job["shard"]), registry)}
        rows = store.read_rows(Path(job["folder"])) if Path(job["folder"], store.RESULTS).exists() else []
        done = store.done_keys(rows) & wanted
        out.append({"shard": job["shard"], "job_id": job["job_id"], "state": _state(record, job["job_id"]),
                    "cells_done": len(done), "cells": len(wanted), "folder": job["folder"]})
    return out


def _state(record: dict, job_id: str) -> str:
    folder = Path(record["submitit_folder"])
    try:
        import submitit
    except ImportError:
        return "unknown (submitit not installed)"
    if record["executor"] == "slurm":
        try:
            return submitit.SlurmJob(folder, job_id).state
        except Exception as exc:  # sacct unreachable: say so, do not fail the command
            return f"unknown ({type(exc).__name__})"
    paths = submitit.core.utils.JobPaths(folder, job_id)
    if _alive(int(job_id)):
        return "RUNNING"
    if paths.result_pickle.exists():
        try:
            outcome, _ = submitit.core.utils.pickle_load(paths.result_pickle)
        except Exception:
            return "FINISHED"
        return "COMPLETED" if outcome == "success" else "FAILED"
    return "INTERRUPTED"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _shard(p: Prepared) -> None:
    """``--shard i/N``: the shard's share of the spec's cells, the static split of its cases by
    their cost (bench.features.cost_model.plan.shard_cells: the same at every invocation of the spec)."""
    if p.spec.shard:
        from bench.features.cost_model import plan

        p.cells = plan.shard_cells(p.cells, p.registry, p.spec.budget_ms, shard_pair(p.spec.shard))


SHARD = Prep("the shard's share", 20, _shard)
