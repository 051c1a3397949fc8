"""The sweep specification, every setting declared once.

Each field of ``Spec`` is one setting. Its ``setting(...)`` declaration (what it means, how
its value is read and checked, whether it is an axis swept over) is the only place the
setting is written down: the command-line flags (``bench.cli``), the TOML keys of
``--config``, the presets (``bench/model/presets/<device>.toml``), the validation messages
and ``--help`` all come from it. A value is parsed once, where it enters (a flag, a TOML
key, a preset), and the frozen ``Spec`` saved in a run folder is what a resume starts from.

A plain axis (a value of the case swept over and handed to the variant as it is: ``--inputs``,
``--kv-layout``) is one declaration in ``bench.model.axes``, which adds its setting here and its
field to ``Case``; an axis that shapes the others (lengths, batch, masks, alignment, mixes) is a
field here and in ``Case``, with its code in ``Spec.cases``.
How a Spec is built from what a user gives (flags, a TOML file, a preset, a model, a run to
resume) and the checks across settings live in ``bench.model.specbuild``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.errors import UsageError
from bench.model.anchors import NAMES as ANCHOR_NAMES
from bench.model.anchors import select as select_anchors
from bench.model.axes import PLAIN
from bench.model.case import (
    ALIGNS,
    CASE_DTYPES,
    DEVICES,
    DIRECTIONS,
    MAX_DIM,
    MAX_LEN,
    MAX_RANKS,
    Case,
    CaseError,
    normalize_align,
    normalize_dtype,
)
from bench.model.parsers import (  # noqa: F401  (shard_pair: the engine's; the rest declare the settings)
    check_masks,
    choice,
    choices,
    ffn_spelling,
    gpu_list,
    head_dims,
    ints,
    mask_spellings,
    number,
    paths,
    positive,
    ranks,
    scope_names,
    shard_pair,
    shard_text,
    split_dims,
    sweep_name,
    text,
    texts,
    threads_or_auto,
    workload_spellings,
    yes_no,
)


@dataclass(frozen=True)
class Setting:
    """How one ``Spec`` field is given and read: ``parse(raw, name)`` turns flag text, a TOML
    value or a preset value into the field's value, or raises UsageError saying what is
    valid (``name`` is how the user spelt it: ``--seq-lens`` or ``seq_lens``)."""
    help: str
    parse: Callable[[Any, str], Any]
    axis: bool = False  # a list of values swept over
    case: bool = False  # also a flag of the single-case commands (profile, selfcheck)
    metavar: str | None = None
    run: bool = False  # how the sweep runs (workers, shards, a cluster), not what it measures
    switch: bool = False  # a yes/no setting: a flag without a value
    later: bool = False  # added after the first sweeps: at its default, a sweep id is what it was without it


def setting(help: str, parse, *, default=None, axis: bool = False, case: bool = False, metavar: str | None = None,
            run: bool = False, switch: bool = False, later: bool = False):
    return field(default=default, metadata={"setting": Setting(help, parse, axis, case, metavar, run, switch,
                                                               later)})


# --- the specification ---------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    """What a sweep measures and how. Axis fields are lists; ``cases()`` is their product.
    ``Spec`` is this with a setting for each plain axis (bench.model.axes)."""
    variants: list[str] = setting("comma-separated variant names (default: all registered; the context-parallel "
                                  "ones only with --ranks beyond 1)", texts,
                                  axis=True, case=True)
    seq_lens: list[int] = setting("query lengths, e.g. 512,1024,2048", ints(MAX_LEN), axis=True, case=True)
    kv_lens: list[int] | None = setting("key/value lengths for cross-attention (default: = seq len)",
                                        ints(MAX_LEN), axis=True, case=True)
    heads: list[int] = setting("query heads", ints(MAX_DIM), axis=True, case=True)
    kv_heads: list[int] | None = setting("key/value heads for GQA (must divide heads; default: = heads)",
                                         ints(MAX_DIM), axis=True, case=True)
    head_dims: list = setting("head dimensions: 64, or QK/V such as 192/128 (MLA: v's head dim apart)",
                              head_dims(MAX_DIM), axis=True, case=True)
    batch: list[int] = setting("batch sizes", ints(MAX_DIM), axis=True, case=True)
    dtypes: list[str] = setting("float32, float16, bfloat16, float8_e4m3fn (fp32, fp16, bf16, fp8 accepted)",
                                choices("dtype", CASE_DTYPES, normalize_dtype), axis=True, case=True)
    masks: list[str] = setting("masks with their parameters, e.g. none,causal,window:256,document:4,"
                               "causal+softcap:50 (python -m bench list --masks)", mask_spellings,
                               axis=True, case=True)
    window: list[int] = setting("sliding-window sizes for a bare window mask (window:256 names its own)",
                                ints(MAX_LEN), axis=True, case=True)
    directions: list[str] = setting("fwd, bwd, fwd+bwd", choices("direction", DIRECTIONS), axis=True, case=True)
    lengths: list[str] = setting("sequence lengths in a batch: fixed (the default), or a ragged mix averaging n: "
                                 "uniform:LO-HI, lognormal:SIGMA, bimodal[:SHORT/LONG:FRAC] or a list A/B/C",
                                 workload_spellings("lengths"), default=("fixed",), axis=True, case=True,
                                 metavar="DIST", later=True)
    align: list[str] = setting("where the queries sit among the keys: top-left (query i is key i: training, "
                               "prefill; the default) or bottom-right (the queries are the last q_len tokens: decode, "
                               "chunked prefill, draft verification); tl and br for short",
                               choices("alignment", ALIGNS, normalize_align), default=("top-left",), axis=True,
                               case=True, metavar="ALIGN", later=True)
    batch_mix: list[str] = setting("mixed serving batches, each packed into one call: COUNTx(Q/KV) terms joined by "
                                   "'+', COUNT sequences of Q new tokens against KV keys, bottom-right within each, "
                                   "e.g. 2x(512/512)+1x(128/4096)+8x(1/2048) (quote it in a shell); replaces the "
                                   "lengths, batch and alignment axes", workload_spellings("mix"), axis=True,
                                   case=True, metavar="MIX", later=True)
    trace_mixes: int = setting("--batch-mix @FILE reads a JSONL serving trace (one batch a line: each sequence's "
                               "new and cached tokens) and keeps this many representative batches, chosen by total "
                               "tokens and decode share (default 4; bench.model.trace)", number(1, 256, True),
                               default=4, metavar="N", later=True)
    scope: list[str] = setting("where the attention core is timed: core (the call alone; the default), block "
                               "(the seeds' multi-head module: QKV projections, the core, the output projection), "
                               "encoder (the block, Add & Norm, a feed-forward network, Add & Norm) or decoder "
                               "(masked self-attention, cross-attention over an encoder output of --kv-lens tokens "
                               "under its padding mask, the FFN); a layer's row times each part too "
                               "(bench.scopes; a --plugin file may add its own: bench.model.scope)", scope_names,
                               default=("core",), axis=True,
                               case=True, metavar="SCOPE", later=True)
    ranks: list = setting("world sizes: the processes one cell's sequence is split over (1, 2, 4; all: every GPU "
                          "of the node, or every core on the CPU), torch.distributed's gloo on the CPU and NCCL on "
                          "CUDA; a context-parallel variant (cp.ring, cp.alltoall, cp.torch) runs on them, and one "
                          "that does not split the sequence takes ranks 1 only (bench.scopes.context)",
                          ranks(MAX_RANKS), default=(1,), axis=True, case=True, metavar="P", later=True)
    anchors: list[str] | None = setting("GPU: the shapes of published figures (FlashAttention-2/3, cuDNN, FlashMLA, "
                                        "FlashInfer), each with its figure, hardware and source; all, or names "
                                        "(python -m bench list --anchors); replaces the shape axes, and the report "
                                        "gives measured / published (bench.model.anchors)",
                                        choices("anchor", (*ANCHOR_NAMES, "all")), metavar="NAME", later=True)
    ffn_mult: float = setting("a layer scope's FFN width as a multiple of d_model = heads x head_dim (default 4; "
                              "a --model or --ffn gives its own)", number(0.125, 64.0, False), default=4.0,
                              metavar="M", case=True, later=True)
    ffn: str | None = setting("a layer scope's FFN: mlp:D_FF (ReLU between two maps, LayerNorm after each residual, "
                              "as the seeds) or swiglu:D_FF (gate, up and down maps, RMSNorm before each sublayer, "
                              "as llama); default mlp at --ffn-mult x d_model", ffn_spelling, metavar="KIND:D_FF",
                              case=True, later=True)
    device: str = setting("cpu or cuda (default: cuda when present, else cpu)", choice("device", DEVICES),
                          default="cpu", case=True)
    preset: str = setting("quick, default, full, decode or serving (default: default); sized per device; on a "
                          "GPU also anchors (the shapes of published figures)", text,
                          default="default")
    model: str | None = setting("a published model's attention: its heads, KV heads, head dims, masks (alternating "
                                "layers as two) and dtype over the preset's lengths; flags override "
                                "(python -m bench list --models)", text, metavar="NAME", later=True)
    total_tokens: int | None = setting("tokens per cell: the batch at each length n is T // n, so every n does the "
                                       "same tokens of work (replaces --batch)", number(1, MAX_LEN * MAX_DIM, True),
                                       metavar="T", later=True)
    timeout: float = setting("seconds per cell before it is killed (default: 300 CPU, 120 GPU)", positive("seconds"))
    budget_ms: float = setting("timing budget per cell in ms (default: the preset's)", positive("milliseconds"),
                               metavar="MS")
    plugins: list[str] = setting("Python files with more variants", paths, default=())
    threads: int | None = setting("torch threads in the worker: N, or auto (the default: one per core, or only the "
                                  "free ones when other processes load the machine at the start); fewer than the "
                                  "cores leaves room for other processes on a shared machine", threads_or_auto,
                                  metavar="N|auto")
    precision: float = setting("CPU: stop sampling when the 95%% CI of the median is within +-PCT%% of it "
                               "(default 2), or when the budget is spent", number(0.1, 50.0, False), default=2.0,
                               metavar="PCT")
    rounds: int = setting("interleaved rounds per case: its variants take turns, A B C A B C (default 3)",
                          number(1, 100, True), default=3)
    deterministic: bool = setting("run every cell under torch.use_deterministic_algorithms(True): a variant whose "
                                  "kernel has no deterministic form is unsupported, with PyTorch's reason",
                                  yes_no, default=False, switch=True, later=True)
    steps: int = setting("after its timing, each ok cell runs K steps, each with a freshly drawn batch (a ragged "
                         "batch's new lengths, its number of tokens varying) set up again and called once: the wall "
                         "time per step with its preparation and any recompile, and the recompiles (default 0: none)",
                         number(0, 1000, True), default=0, metavar="K", later=True)
    dynamic: bool = setting("variants that compile (flex) compile with dynamic shapes: one graph for every length "
                            "instead of one per shape", yes_no, default=False, switch=True, later=True)
    ceiling_s: float = setting("CPU: the most seconds a cell's timing may take, past --budget-ms, to collect the 6 "
                               "samples a 95%% interval of its median needs (default 2); beyond it the row says "
                               "what its samples support", number(0.0, 3600.0, False), default=2.0, metavar="S",
                               later=True)
    timer: str = setting("GPU timer: events (CUDA events around each call, L2 flushed; the default) or graph (the "
                         "call captured in a CUDA graph and replayed: no launch overhead)",
                         choice("timer", ("events", "graph")), default="events")
    heap: str = setting("CPU: the C heap each worker times under: fixed (glibc's mmap threshold fixed at 64 MiB "
                        "and the heap never trimmed: every worker settles into one state; the default) or system "
                        "(glibc's own, as a default process has: a large buffer can be mapped and its pages faulted "
                        "in again at each call); selfcheck prints the difference (bench/measure/README.md)",
                        choice("heap", ("fixed", "system")), default="fixed", later=True)
    visits: int = setting("visits to each cell, each in a fresh worker process, spread over the sweep: its figure is "
                          "the visits' geometric mean and its interval theirs, which holds what a rerun sees; the "
                          "first visit checks and measures memory, the others only time (default 3; 1: one visit, "
                          "whose interval is one process's)", number(1, 20, True), default=3, metavar="V",
                          run=True)
    remeasure: int = setting("contended cases timed again in place (after the next quiet case), then passes at "
                             "the end of the sweep that measure the cells still contended again if the load has "
                             "dropped (default 1; 0 turns both off); both rows stay, the newest counts",
                             number(0, 10, True), default=1, metavar="N", run=True)
    peak_age: float = setting("hours a cached matmul peak and copy bandwidth of this machine, and a cell's "
                              "recorded memory peak, stay good (default 24); 0 measures them again "
                              "(bench.engine.peaks, bench.engine.memcache)", number(0, 8760, False),
                              default=24.0, metavar="HOURS", run=True, later=True)
    # how the sweep runs: not part of what it measures (bench.engine.placement, bench.features: cost_model, shards)
    workers: int | None = setting("worker processes side by side (default 1): on the CPU each gets its own cores, on "
                                  "GPUs one GPU each; all variants of one case go to one worker",
                                  number(1, 1024, True), metavar="N", run=True)
    gpus: str | None = setting("all, or GPU indices such as 0,1,3: one worker per GPU", gpu_list, run=True)
    shard: str | None = setting("i/N: measure only shard i of N, a deterministic share of the cells balanced by "
                                "predicted cost; each shard writes its own run folder", shard_text, metavar="I/N",
                                run=True)
    shards: int | None = setting("with --executor: the number of shards, one job each (default 1)",
                                 number(1, 100000, True), metavar="N", run=True)
    sweep_id: str | None = setting("the name the shards of one sweep share (default: from the spec)", sweep_name,
                                   metavar="ID", run=True)
    executor: str | None = setting("run the shards as jobs through submitit: slurm, or local (this machine)",
                                   choice("executor", ("local", "slurm")), run=True)
    slurm_partition: str | None = setting("the Slurm partition of the jobs", text, metavar="NAME", run=True)
    slurm_gpus_per_node: int | None = setting("GPUs per job (and node)", number(0, 64, True), metavar="N", run=True)
    slurm_nodes: int | None = setting("nodes per job (default 1): a cell's world of --ranks spans them, a node's GPUs "
                                      "each, or on the CPU spread evenly (with --executor local, tasks of this "
                                      "machine stand in for them)", number(1, 1024, True), metavar="N", run=True)
    slurm_time: int | None = setting("minutes each job may run (default: the projection, doubled, at least 10)",
                                     number(1, 100000, True), metavar="MIN", run=True)
    slurm_array_parallelism: int | None = setting("jobs running at once (default: all)", number(1, 100000, True),
                                                  metavar="N", run=True)

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}

    def replace(self, **changes) -> Spec:
        return dataclasses.replace(self, **changes)

    def cases(self) -> list[Case]:
        """Every case, grouped so that cells sharing inputs run back to back, and ordered
        from small to large n within a group."""
        from bench.model import masks

        if self.anchors:  # each anchor is its own case: no product
            return list(dict.fromkeys(Case(self.device, **a.case_fields()) for a in select_anchors(self.anchors)))
        out, seen = [], set()
        batches = [None] if self.total_tokens else self.batch  # None: T // q_len, per length
        for scope, dtype, direction, spelling, batch_given, heads, dims in itertools.product(
                self.scope or ["core"], self.dtypes, self.directions, self.masks, batches, self.heads,
                self.head_dims):
            head_dim, head_dim_v = split_dims(dims)
            layer = {"scope": scope, **self._scope_fields(scope, heads * head_dim)}
            for kv_heads in self.kv_heads or [heads]:
                for size in (self.window if masks.uses_window_flag(spelling) else [None]):
                    try:
                        mask, window = masks.canonical(spelling, size)
                    except masks.MaskError as exc:
                        raise UsageError(f"--masks {spelling}: {exc}") from None
                    for world, shape in itertools.product(self._world_sizes(), self._shapes(batch_given)):
                        try:
                            case = Case(self.device, dtype, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                        mask=mask, window=window, direction=direction, head_dim_v=head_dim_v,
                                        ranks=world, **shape, **layer)
                            if not case.unsupported_reason:  # else every variant's row says why
                                masks.bind(case).validate()  # parameters that do not fit, definitions that fail
                        except (CaseError, masks.MaskError) as exc:
                            raise UsageError(str(exc)) from None
                        if case not in seen:
                            seen.add(case)
                            out.append(case)
        return out

    def _world_sizes(self) -> list[int]:
        """--ranks as world sizes: ``all`` is every GPU of this node on CUDA (torch asked then, and
        only then) or every core on the CPU."""
        given = list(self.ranks or [1])
        if given != ["all"]:
            return given
        if self.device == "cuda":
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if count < 1:
                raise UsageError("--ranks all on cuda counts this node's GPUs, and it has none; give world sizes "
                                 "such as 1,2")
            return [count]
        return [os.cpu_count() or 1]

    def _scope_fields(self, name: str, d_model: int) -> dict:
        """The case fields the scope's axes set (a layer's FFN: --ffn, or an MLP --ffn-mult times
        d_model wide), once the plugins, which may add a scope, are loaded."""
        from bench.model import scope

        try:
            return scope.named(name).fields(name, self, d_model)
        except scope.ScopeError:
            raise UsageError(f"unknown scope {name!r}; valid: {', '.join(scope.names())}") from None
        except ValueError as exc:  # a field the settings cannot give
            raise UsageError(str(exc)) from None

    def _shapes(self, batch_given: int | None) -> list[dict]:
        """The batch shapes of the sweep, small to large n within each workload: a batch and its
        lengths, inputs, KV layout and alignment; or, with --batch-mix, each mix (its own
        batch, lengths and alignment) under each input kind and KV layout."""
        plain = [a.name for a in PLAIN]
        values = [getattr(self, a.name) or [a.default] for a in PLAIN]  # each plain axis's values, in the product
        if self.batch_mix:
            return [{"mix": mix, **dict(zip(plain, chosen))}
                    for *chosen, mix in itertools.product(*values, self.batch_mix)]
        out = []
        for lengths, *chosen, align, q_len in itertools.product(self.lengths or ["fixed"], *values,
                                                                 self.align or ["top-left"], sorted(self.seq_lens)):
            batch = batch_given or self.total_tokens // q_len
            out += [{"batch": batch, "q_len": q_len, "kv_len": kv_len, "lengths": lengths, **dict(zip(plain, chosen)),
                     "align": align} for kv_len in self.kv_lens or [q_len]]
        return out


def _parser(parse):
    """A plain axis's parser (bench.model.axes.Axis.parse): by name, made by a factory, or itself."""
    import bench.model.parsers as parsers

    if isinstance(parse, str):
        return getattr(parsers, parse)
    if isinstance(parse, tuple):
        return getattr(parsers, parse[0])(*parse[1:])
    return parse


Spec = dataclasses.make_dataclass(  # and a setting for each plain axis (bench.model.axes): --inputs, --kv-layout, ...
    "Spec", [(a.name, list[str], setting(a.help, _parser(a.parse), default=(a.default,), axis=True, case=True,
                                         metavar=a.metavar, later=True)) for a in PLAIN],
    bases=(_Spec,), frozen=True, namespace={"__module__": __name__, "__qualname__": "Spec", "__doc__": _Spec.__doc__})

SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in dataclasses.fields(Spec)}
AXES = tuple(name for name, s in SETTINGS.items() if s.axis)
RUN_SETTINGS = tuple(name for name, s in SETTINGS.items() if s.run)


def measured_part(spec: Spec) -> dict:
    """What a spec measures: every setting but those of how it runs (shards of one sweep agree on
    it), with its plugin files as digests of their contents, not their paths."""
    fields = dataclasses.fields(spec)
    out = {k: v for k, v in spec.to_dict().items() if not _setting_of(fields, k).run}
    for f in fields:
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        if f.metadata["setting"].later and out.get(f.name) in (default, None):
            out.pop(f.name, None)  # a sweep from before the setting existed hashes as it did
    out["plugins"] = sorted(_file_digest(p) for p in spec.plugins or ())
    return out


def _setting_of(fields, name: str) -> Setting:
    return next(f.metadata["setting"] for f in fields if f.name == name)


def sweep_id(spec: Spec) -> str:
    """The name the shards of one sweep share: ``spec.sweep_id``, or one made from what the spec
    measures: its axes and settings, the variant names it lists, and the contents of its
    plugin files (not their paths), so the same spec gives the same name on any machine."""
    if spec.sweep_id:
        return spec.sweep_id
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(measured_part(spec), sort_keys=True, default=str).encode()).hexdigest()
    return f"sweep-{spec.device}-{digest[:10]}"


def _file_digest(path: str) -> str:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return f"missing:{Path(path).name}"


def flag(name: str) -> str:
    return "--plugin" if name == "plugins" else "--" + name.replace("_", "-")


def spec_from_dict(saved: dict) -> Spec:
    """A Spec saved in a run folder's env.json, as it was (keys it lacks take their defaults)."""
    names = {f.name for f in dataclasses.fields(Spec)}
    return Spec(**{k: v for k, v in saved.items() if k in names})
