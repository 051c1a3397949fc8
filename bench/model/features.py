"""The core and the features that hang off it, each declared once.

The core is what every sweep does: a case of the spec's axes, the variants of the registry, the
masks, the timers and their statistics, the float64 reference, the worker, the pool (its workers
placed side by side) and the sweep, the run folder and the judge.  A feature adds to it through
nine hooks, each optional:

- ``settings``: the ``Spec`` fields it adds (bench.model.spec);
- ``groups``: its namespaced groups of the stored row (bench.model.row.GROUPS);
- ``steps``: its steps in a timed cell's life, as ``"module:NAME"`` of a ``Step`` (the protocol is
  bench.measure.cellsteps); the cell runs the declared steps and knows none by name;
- ``kept``: what it keeps in a worker across its cells, as ``"module:NAME"`` of a ``Keep`` (the
  same protocol): made at the worker's start, handed to the steps, told of each setup, case and job;
- ``preps``: its steps of a sweep's preparation, as ``"module:NAME"`` of a ``Prep`` (the protocol is
  bench.engine.prepare): a shard's share of the cells, their costs, the projection of the wall time;
- ``passes``: its passes of a sweep after the first, as ``"module:NAME"`` of a ``Pass`` (the
  protocol is bench.engine.passes); the sweep runs the declared passes and knows none by name;
- ``section``: its part of the report, a module of ``reports/sections/`` whose ``sections(ctx)`` returns
  its parts of the page (the protocol is ``reports.sections``); the report calls each in this
  file's order;
- ``scopes``: its scopes, as ``"module:NAME"`` of a ``Scope`` (the protocol is bench.model.scope): what
  a cell times around a variant's attention call, for the ``--scope`` values it names; the cell asks
  the case's scope and knows none by name;
- ``commands``: its subcommands, modules of ``bench/cli/`` with ``add_parser(sub)``;
  ``python -m bench`` builds its parser from them, in this file's order.

``modules`` names the modules that hold its code (a step or a pass lives in one of them).
bench/README.md's table of features and the settings table's owner column are generated from
these declarations (``python -m bench.cli.reference --write``), and ``tests/test_layout.py``
checks that every setting and row group has exactly one owner, the core or one feature, that
every step and pass in bench/ is declared once and runs, and that each named module exists.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str
    what: str
    settings: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    preps: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    section: str | None = None
    commands: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


CORE = Feature(
    "core", "cases of the spec's axes, timed in interleaved rounds, checked against float64, judged",
    settings=("variants", "seq_lens", "kv_lens", "heads", "kv_heads", "head_dims", "batch", "dtypes", "masks", "window",
              "directions", "scope", "device", "preset", "timeout", "budget_ms", "plugins", "threads", "precision",
              "rounds", "ceiling_s", "timer", "heap", "deterministic", "dynamic", "peak_age", "workers", "gpus"),
    groups=("work", "check"), steps=("bench.engine.cell:DETERMINISM",), scopes=("bench.scopes.core:SCOPE",),
    commands=("bench.cli.listing", "bench.cli.sweep", "bench.cli.report"),
    modules=("bench/model/spec.py", "bench/model/case.py", "bench/model/scope.py", "bench/scopes/core.py",
             "bench/model/ffn.py", "bench/model/axes.py", "bench/model/registry.py",
             "bench/model/masks.py", "bench/measure/probe.py", "bench/measure/timing.py", "bench/measure/stats.py",
             "bench/measure/correctness.py", "bench/measure/cellsteps.py", "bench/measure/cpuload.py",
             "bench/engine/runner.py", "bench/engine/cell.py", "bench/engine/pool.py", "bench/engine/placement.py",
             "bench/engine/prepare.py", "bench/engine/passes.py",
             "bench/engine/sweep.py", "bench/runs/store.py", "bench/runs/judge/__init__.py", "reports/build.py",
             "reports/trust.py"))

FEATURES: tuple[Feature, ...] = (
    Feature("compare and ab", "two runs' verdicts; two builds timed in turn",
            commands=("bench.cli.compare", "bench.cli.ab"),
            modules=("bench/features/ab.py", "reports/compare.py")),
    Feature("contention and leftovers", "the load around each cell, contended cells timed again",
            settings=("remeasure",), groups=("load",), steps=("bench.features.contention.contention:STEP",),
            kept=("bench.features.contention.leftovers:KEEP", "bench.features.contention.retime:KEEP"),
            passes=("bench.features.contention.remeasure:PASS",),
            modules=("bench/features/contention/contention.py", "bench/features/contention/leftovers.py",
                     "bench/features/contention/remeasure.py", "bench/features/contention/retime.py")),
    Feature("visits", "each cell in fresh worker processes, its figure over the visits",
            settings=("visits",), passes=("bench.engine.visits:PASS",),
            modules=("bench/engine/visits.py", "bench/runs/visits.py", "bench/engine/revisit.py")),
    Feature("GPU state", "NVML clocks, power and energy; the kernels that ran; a CUDA-graph timer",
            groups=("gpu", "kernels"),
            steps=("bench.features.gpu_state.nvml:STEP", "bench.features.gpu_state.kernels:STEP"),
            modules=("bench/features/gpu_state/nvml.py", "bench/features/gpu_state/kernels.py")),
    Feature("memory", "each cell's peak, recorded per machine; the memory model",
            groups=("memory",), steps=("bench.measure.memory:STEP",), kept=("bench.engine.memcache:KEEP",),
            modules=("bench/measure/memory.py", "bench/engine/memcache.py", "bench/runs/memmodel.py")),
    Feature("frontier", "the largest n that fits in memory and a time budget",
            section="reports.sections.frontier", commands=("bench.cli.frontier",),
            modules=("bench/features/frontier.py",)),
    Feature("layer scope", "the core inside the seeds' multi-head block, encoder and decoder layers",
            settings=("ffn_mult", "ffn"), steps=("bench.scopes.layer_run:STEP",), scopes=("bench.scopes.layer:SCOPE",),
            section="reports.sections.layer",
            modules=("bench/scopes/layer.py", "bench/scopes/layer_run.py")),
    Feature("context parallelism", "a cell's sequence split over ranks of a torch.distributed group, per-rank figures",
            settings=("ranks",), groups=("per_rank",), section="reports.sections.ranks",
            modules=("bench/scopes/context.py", "bench/engine/group.py", "bench/engine/rank.py",
                     "bench/engine/ranked.py")),
    Feature("anchors", "the shapes of published figures, measured against them",
            settings=("anchors",), section="reports.sections.anchors",
            modules=("bench/model/anchors.py",)),
    Feature("steps", "what a training or serving step costs beyond the kernel",
            settings=("steps",), steps=("bench.features.steps:STEP",), section="reports.sections.steps",
            modules=("bench/features/steps.py",)),
    Feature("workloads", "ragged batches, structured inputs, a paged KV cache, alignment, serving mixes, models",
            settings=("lengths", "inputs", "kv_layout", "align", "batch_mix", "trace_mixes", "total_tokens", "model"),
            section="reports.sections.mixes",
            modules=("bench/model/workload.py", "bench/model/trace.py", "bench/model/models.py",
                     "bench/measure/inputs.py")),
    Feature("shards, jobs and merge", "a sweep's shards, cluster jobs, merged run folders",
            settings=("shard", "shards", "sweep_id", "executor", "slurm_partition", "slurm_gpus_per_node",
                      "slurm_nodes", "slurm_time", "slurm_array_parallelism"),
            preps=("bench.features.shards.jobs:SHARD",),
            commands=("bench.cli.merge",),
            modules=("bench/features/shards/jobs.py", "bench/features/shards/merge.py")),
    Feature("cost model", "the projection of a sweep's time, learnt from the machine's history",
            preps=("bench.features.cost_model.plan:PRICE", "bench.features.cost_model.plan:PROJECT"),
            passes=("bench.features.cost_model.plan:PASS",),
            modules=("bench/features/cost_model/plan.py", "bench/features/cost_model/compiled.py")),
    Feature("status and repro", "what a run folder holds, and each cell's command", commands=("bench.cli.status",),
            modules=("bench/features/repro.py",)),
    Feature("profile", "torch.profiler's categories of each cell's time",
            passes=("bench.features.profile.profiled:PASS",),
            commands=("bench.cli.profile",),
            modules=("bench/features/profile/profiler.py", "bench/features/profile/profiled.py")),
    Feature("selfcheck", "the timer against torch.utils.benchmark on this machine", commands=("bench.cli.selfcheck",),
            modules=("bench/features/selfcheck.py",)),
    Feature("export", "rows as pytest-benchmark and torch.utils.benchmark read them", commands=("bench.cli.export",),
            modules=("bench/features/export.py",)),
    Feature("gpu-check", "the checks a GPU machine runs once, with their acceptance thresholds",
            commands=("bench.cli.gpu_check",), modules=("bench/runs/judge/acceptance.py",)),
)


def owner_of(kind: str, name: str) -> list[str]:
    """The features (the core among them) that declare ``name`` among their ``kind``
    (settings, groups or steps): exactly one for a name the harness knows."""
    return [f.name for f in (CORE, *FEATURES) if name in getattr(f, kind)]


def declared(hook: str) -> list:
    """What the core and every feature declare for ``hook`` (``steps``, ``kept``, ``preps``,
    ``passes`` or ``scopes``: ``"module:NAME"`` each), imported, in the declarations' order."""
    import importlib

    found = []
    for ref in (ref for f in (CORE, *FEATURES) for ref in getattr(f, hook)):
        module, _, name = ref.partition(":")
        found.append(getattr(importlib.import_module(module), name))
    return found
