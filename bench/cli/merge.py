"""``python -m bench merge A B ... --out RUN``: the shards of one sweep as one run folder, and its report;
and ``python -m bench sweep --executor``, which the sweep command hands to ``sweep_instead``: one job
per shard through submitit, the local executor's waited for and merged."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.errors import UsageError


def add_parser(sub) -> None:
    mp = sub.add_parser("merge", help="join the shard folders of one sweep into one run folder and build its report")
    mp.add_argument("runs", nargs="+", metavar="RUN", help="the shards' run folders")
    mp.add_argument("--out", metavar="DIR", required=True, help="the merged run folder (new)")
    mp.add_argument("--no-report", dest="no_report", action="store_true", help="skip the report")
    mp.set_defaults(func=command)


def command(args) -> int:
    from bench.features.shards.merge import merge_runs
    from bench.runs import store

    out = merge_runs(args.runs, Path(args.out))
    rows = store.read_rows(out)
    print(f"merged {len(rows)} rows of {len(args.runs)} run folders into {out}")
    if not args.no_report:
        from reports.build import build_report

        print(f"report: {build_report([out])}")
    return 0


def sweep_instead(spec, registry, args, resume) -> int | None:
    """The sweep command's settings of the jobs (bench.model.features: a command module may run a
    sweep its own way): ``--executor`` submits the shards and returns the exit code; None (after
    the settings' checks) where the sweep runs in this process as usual."""
    _check(spec, resume)
    return _submit(spec, registry, args) if spec.executor else None


def _check(spec, resume) -> None:
    if spec.shards and not spec.executor:
        raise UsageError("--shards N submits N jobs: give it with --executor local or --executor slurm (one shard "
                         "here is --shard i/N)")
    if spec.executor and spec.shard:
        raise UsageError("--executor submits every shard itself: give --shards N, not --shard i/N")
    if spec.executor and resume is not None:
        raise UsageError("--executor resumes by itself: run the same command again and each shard measures only "
                         "the cells its folder lacks")
    slurm = [k for k in ("slurm_partition", "slurm_gpus_per_node", "slurm_nodes", "slurm_time",
                         "slurm_array_parallelism") if getattr(spec, k) is not None]
    if spec.executor == "local":  # minutes and nodes (tasks of this machine) mean something to the local executor
        slurm = [k for k in slurm if k not in ("slurm_time", "slurm_nodes")]
    if slurm and spec.executor != "slurm":
        raise UsageError(f"--{slurm[0].replace('_', '-')} is a setting of --executor slurm")


def _submit(spec, registry, args) -> int:
    """--executor: one job per shard through submitit; the local executor's jobs are waited
    for, then merged into one run folder with its report."""
    from bench.engine.runner import release_prestarted
    from bench.engine.sweep import spec_cells, worker_slots
    from bench.features.cost_model import plan
    from bench.features.shards import jobs
    from bench.features.shards.merge import merge_runs
    from bench.model.spec import sweep_id
    from bench.runs import store

    jobs.require_submitit(spec.executor)
    shards = spec.shards or 1
    sweep_dir = Path(args.out) if args.out else store.DEFAULT_ROOT / sweep_id(spec)
    cells = spec_cells(spec, registry)
    history = plan.load_history(store.DEFAULT_ROOT, spec.device, registry=registry, machine=True)
    projection = plan.project(cells, registry, spec, workers=len(worker_slots(spec)), shards=shards,
                              history=history, report=False)
    if args.dry_run:
        print("\n".join(projection.lines()))
        return 0
    release_prestarted()  # the jobs start their own workers
    print("plan: " + "; ".join(projection.lines()), file=sys.stderr)
    from bench.cli.common import listen

    record = jobs.submit(spec, sweep_dir, shards, max(projection.per_shard_s), listen)
    print(f"sweep {record['sweep_id']}: {shards} job(s) through submitit ({spec.executor}), "
          f"{record['timeout_min']} min each")
    print(f"  {sweep_dir}/{jobs.SWEEP_FILE}     the jobs")
    for job in record["jobs"]:
        print(f"  {job['folder']}/   shard {job['shard']}, job {job['job_id']}")
    print(f"  {record['submitit_folder']}/   submitit's files and the jobs' logs")
    print(f"follow it with: python -m bench status {sweep_dir if args.out else record['sweep_id']}")
    if spec.executor != "local":
        print(f"when the jobs are done: python -m bench merge {sweep_dir}/shard-* --out {sweep_dir}/merged")
        return 0
    failed = []
    for job, handle in zip(record["jobs"], record["handles"]):
        try:
            handle.results()  # (every task's: a job of several nodes has one a node)
        except Exception as exc:  # its rows are kept; running the command again resumes it
            failed.append(f"shard {job['shard']}: {type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
    if failed:
        print("error: " + "; ".join(failed) + ". Run the same command again: each shard resumes from its folder",
              file=sys.stderr)
        return 1
    merged = sweep_dir / "merged"
    if merged.exists():
        import shutil

        shutil.rmtree(merged)
    out = merge_runs([j["folder"] for j in record["jobs"]], merged)
    rows = store.read_rows(out)
    print(f"merged {len(rows)} rows into {out}")
    if not args.no_report:
        from reports.build import build_report

        print(f"report: {build_report([out])}")
    return 0
