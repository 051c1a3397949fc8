"""One measured cell: a typed row.

This module declares every column a row can have, grouped by what it says, once, and what each
holds (``COLUMN_TYPES``: a number, a flag, a text, a list, a table; None where it is not
measured): the writer validates names and types against it (``make_row``), and the readers (reports,
compare, export) take their column lists from these groups.  The worker keeps its results
typed (``bench.measure.timing.TimingSummary``, ``bench.measure.correctness.CheckResult``) until
they become a row's columns.  ``status`` is a ``Status``; ``reason_kind`` says what kind of reason
``reason`` gives, so no layer has to read the words.  A variant's own figures
(``Prepared.info``) live in ``extra``, their own namespace: they never replace a column.

On disk (``results.jsonl``) a row stores what was measured (``to_record``, format ``FORMAT``):
the case, the outcome, the settings and the raw timing (every sample, each round's median, the
calls per sample, the warm-up) at the top level, and the rest in namespaced groups (``GROUPS``:
``work``, ``load``, ``check``, ``memory``, ``kernels``, ``gpu``; ``layer``; ``extra``).  The figures
the samples give (``DERIVED``: median, spread, interval, rates) are not stored: a reader computes
them in one place (``bench.measure.stats.row_figures``).  ``from_disk`` turns a stored record of
any format back into the flat row every reader uses; env.json's ``row_formats`` says which
lines of a folder have which format (``formats``).
"""

from __future__ import annotations

import enum
from typing import get_args, get_type_hints

from bench.model.case import CASE_ADDED, CASE_DEFAULTS, CASE_FIELDS, Case


class Status(str, enum.Enum):
    """What became of a cell.  A ``str``: ``Status.OK == "ok"`` and JSON writes ``"ok"``."""
    OK = "ok"
    MISMATCH = "mismatch"  # ran, but its output is not the reference's
    UNSUPPORTED = "unsupported"  # cannot run here; the reason says why
    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    CRASH = "crash"

    def __str__(self) -> str:
        return self.value

    @property
    def failed(self) -> bool:
        """A failure to look at (unsupported and ok are not)."""
        return self not in (Status.OK, Status.UNSUPPORTED)

    @property
    def word(self) -> str:
        """How tables show it where a number would be."""
        return self.value.upper()


STATUSES = tuple(s.value for s in Status)
FAILED = tuple(s.value for s in Status if s.failed)


class ReasonKind(str, enum.Enum):
    """What kind of reason a row's ``reason`` is."""
    NONE = ""  # an ok row
    CAPABILITY = "capability"  # the variant's declared capabilities exclude the case
    ENVIRONMENT = "environment"  # a required module, or CUDA, is missing on this machine
    LIBRARY = "library"  # the library refused the case (its probe, or its own error)
    MISMATCH_SHAPE = "mismatch-shape"  # the output has the wrong shape or non-finite values
    MISMATCH_VALUES = "mismatch-values"  # the output (or a gradient) is beyond the tolerance
    OOM = "oom"
    ERROR = "error"  # an exception of the variant or the harness
    TIMEOUT = "timeout"
    CRASH = "crash"  # the worker died

    def __str__(self) -> str:
        return self.value


# the column groups, in the order a row's columns are written
IDENTITY = ("variant", *CASE_FIELDS)
OUTCOME = ("status", "reason", "reason_kind")
WORKLOAD = ("mask_params", "density", "flops", "bytes", "approximate", "seq_lengths", "padding_waste",
            "layout", "phases")  # a ragged batch: each sequence's length, padded over real FLOPs, how the variant
# held it; a mixed batch: each phase's sequences, tokens, FLOPs and bytes (bench.measure.flops.mix_phases)
SETTING_COLUMNS = ("threads", "budget_ms", "precision", "worker", "heap")  # worker: where it ran (cpu, cpu:0-3,
# cuda:1); heap: the worker's C heap (--heap: fixed or system)
TIMING = ("median_ms", "iqr_ms", "min_ms", "mean_ms", "q1_ms", "q3_ms", "samples", "rel_iqr", "ci_halfwidth",
          "noisy", "few_samples", "median_confidence", "ci_lo_ms", "ci_hi_ms", "number", "warmup_calls", "timer",
          "samples_ms", "round_medians_ms", "rounds", "timed_s", "bwd_forward", "interleave_id")
# few_samples: fewer than a 95% interval of the median needs, and median_confidence what they support (the
# min-max of 3 covers it with 0.75); bwd_forward: "per turn" when each turn ran its own forward;
# interleave_id: the rows timed together in interleaved rounds (only they pair round by round)
SPREAD = ("median_ms", "q1_ms", "q3_ms", "iqr_ms", "min_ms")  # a cell's time and its spread (compare's verdict)
CONTENTION = ("cpu_util", "other_cpu", "quantum_ms", "contended", "contended_why", "retimed")
# retimed: a contended cell timed again in place, and why its first timing was contended (contention.retime.Held)
ACCURACY = ("max_abs_err", "max_err_over_max_ref", "grad_max_abs_err", "rel_err", "cosine", "grad_rel_err",
            "grad_cosine", "max_logit", "deterministic", "nondeterminism", "reference_skipped")
# reference_skipped: why the cell is timed unchecked; deterministic: the timer's calls (the CPU) or two more
# calls (a GPU) gave the checked call's bits (else nondeterminism, the largest difference)
FIGURES = ("setup_ms", "peak_mem_bytes", "peak_mem_cached", "tflops", "gbps", "pct_peak")
# peak_mem_cached: the peak came from this machine's record of the same cell (bench.engine.memcache)
KERNELS = ("kernels", "backend_ran", "kernel_mismatch", "kernel_sum_ms", "graph_median_ms", "timer_mismatch",
           "kernels_error", "graph_error")  # GPU cells: what ran (bench.features.gpu_state.kernels), the timers
# held against each other, and why a check after the timing could not be made (the timing stays)
GPU_STATE = ("sm_clock_start_mhz", "sm_clock_end_mhz", "power_start_w", "power_end_w", "power_limit_w", "temp_start_c",
             "temp_end_c",
             "throttle_reasons", "energy_j_per_call", "energy_j_per_token", "energy_why", "throttled",
             "throttled_why")  # NVML
LAYER = ("layer",)  # a layer scope (bench.scopes.layer): each part's time, FLOPs, interval; their sum; the core's share
RANK_MEASURED = ("rank_samples_ms", "rank_comm_ms", "rank_bytes_sent", "rank_peak_mem_bytes", "rank_collective_ms",
                 "rank_collective_wait_ms")
RANK_FIGURES = ("rank_median_ms", "comm_ms", "comm_share", "wait_ms", "bytes_sent", "collective_ms", "comm_hidden")
RANKS = (*RANK_MEASURED, *RANK_FIGURES)
# a cell of several ranks (--ranks, bench.scopes.context): each rank's own step times and time in its collectives
# (one list per rank, sample by sample), the bytes it sent per step and its peak memory; on read, each rank's
# median, the communication time and share of the slowest step, the wait of the fastest rank for the slowest,
# and the most bytes a rank sent; of one profiled step, each rank's time inside its collectives and its wait for
# them, and on read the most time inside and the share of it hidden (samples_ms: the slowest rank's, step by step)
COLUMNS = (*IDENTITY, *OUTCOME, *WORKLOAD, *SETTING_COLUMNS, *TIMING, *CONTENTION, *ACCURACY, *FIGURES, *KERNELS,
           *GPU_STATE, *LAYER, *RANKS)
NUMERIC = (*(c for c in TIMING if c.endswith("_ms") and c not in ("samples_ms", "round_medians_ms")), "samples",
           "rel_iqr", "ci_halfwidth", "median_confidence", "timed_s", "cpu_util", "other_cpu", "density", "flops",
           "bytes", "padding_waste",
           *(c for c in ACCURACY if c not in ("deterministic", "reference_skipped")), *FIGURES, "kernel_sum_ms",
           "graph_median_ms", "sm_clock_start_mhz", "sm_clock_end_mhz",
           "power_start_w", "power_end_w", "power_limit_w",
           "temp_start_c", "temp_end_c", "energy_j_per_call", "energy_j_per_token", "comm_ms", "comm_share",
           "wait_ms", "bytes_sent", "collective_ms", "comm_hidden")
FLAGS = ("few_samples", "noisy", "contended", "throttled")  # booleans that make an ok row shaky (runs.judge)
MEASURED = ("median_ms", "iqr_ms", "min_ms", "samples", "peak_mem_bytes", "tflops", "max_abs_err")
ALWAYS = (*IDENTITY, *OUTCOME, "mask_params", "density", "flops", "bytes", *MEASURED)  # written even when None


# what each column holds (None aside, which any column may: not measured, or not applicable)
Number = float  # an int is a number too (samples, flops, threads)
TEXT = ("reason", "layout", "worker", "timer", "heap", "bwd_forward", "interleave_id", "contended_why", "retimed",
        "reference_skipped",
        "backend_ran", "kernel_mismatch", "timer_mismatch", "kernels_error", "graph_error", "throttle_reasons",
        "throttled_why", "energy_why")
YES_NO = (*FLAGS, "approximate", "deterministic", "peak_mem_cached")
LISTS = ("seq_lengths", "samples_ms", "round_medians_ms", "kernels", *RANK_MEASURED, "rank_median_ms")
TABLES = ("mask_params", "phases", "layer")  # mask_params: a mask's parameters; phases: {phase: its figures}
COLUMN_TYPES: dict = {
    **{name: t for name, t in get_type_hints(Case).items() if name in CASE_FIELDS},
    **dict.fromkeys(NUMERIC, Number), "number": int, "warmup_calls": int, "rounds": int, "threads": int,
    "nondeterminism": Number, "quantum_ms": Number,
    **dict.fromkeys(TEXT, str), **dict.fromkeys(YES_NO, bool), **dict.fromkeys(LISTS, list),
    **dict.fromkeys(TABLES, dict), "reason_kind": ReasonKind, "precision": Number, "budget_ms": Number,
}
_ACCEPTS = {Number: (int, float), int: (int,), bool: (bool,), str: (str,), list: (list, tuple), dict: (dict,),
            ReasonKind: (ReasonKind,)}


def _base(t):
    """``int | None`` -> int: the type a value of a column must have when it is not None."""
    args = [a for a in get_args(t) if a is not type(None)]
    return args[0] if args else t


def wrong_types(values: dict) -> list[str]:
    """The columns of ``values`` whose value is not of the column's declared type, each with what
    it holds and what it must hold (a bool is not a number; an int is)."""
    out = []
    for name, value in values.items():
        if value is None or name not in COLUMN_TYPES or name == "reason_kind":
            continue
        want = _base(COLUMN_TYPES[name])
        ok = isinstance(value, _ACCEPTS.get(want, (want,)))
        if ok and want in (Number, int) and isinstance(value, bool):
            ok = False
        if not ok:
            out.append(f"{name}={value!r} ({type(value).__name__}; a row's {name} is {want.__name__})")
    return out


class RowError(ValueError):
    """A row with a column that is not declared, or a status that is not a Status."""


def make_row(values: dict) -> dict:
    """A dict of columns (and ``extra``), checked: every column declared and of its type, the
    status a ``Status`` and the reason's kind a ``ReasonKind``; every column comes back (None
    where it is not given), then ``extra``.  An undeclared column is an error."""
    values = dict(values)
    extra = dict(values.pop("extra", None) or {})
    unknown = sorted(set(values) - set(COLUMNS))
    if unknown:
        raise RowError(f"undeclared row column(s) {unknown}: declare them in bench.model.row, or report a "
                       f"variant's figure in Prepared.info (a row's extra)")
    try:
        values["status"] = Status(values.get("status"))
    except ValueError:
        raise RowError(f"row status {values.get('status')!r}; valid: {', '.join(STATUSES)}") from None
    kind = values.get("reason_kind")
    values["reason_kind"] = ReasonKind(kind) if kind else default_kind(values["status"])
    wrong = wrong_types(values)
    if wrong:
        raise RowError(f"row column(s) of the wrong type: {'; '.join(wrong)}")
    return {c: values.get(c) for c in COLUMNS} | {"extra": extra}


def default_kind(status: Status) -> ReasonKind:
    return {Status.OK: ReasonKind.NONE, Status.MISMATCH: ReasonKind.MISMATCH_VALUES,
            Status.UNSUPPORTED: ReasonKind.LIBRARY, Status.OOM: ReasonKind.OOM, Status.ERROR: ReasonKind.ERROR,
            Status.TIMEOUT: ReasonKind.TIMEOUT, Status.CRASH: ReasonKind.CRASH}[status]


# -- on disk ---------------------------------------------------------------------------------------

FORMAT = 2  # results.jsonl's row format (1: every column flat, the derived figures stored)
DERIVED = ("median_ms", "iqr_ms", "min_ms", "mean_ms", "q1_ms", "q3_ms", "samples", "rel_iqr", "ci_halfwidth", "noisy",
           "few_samples", "median_confidence", "ci_lo_ms", "ci_hi_ms", "rounds", "tflops", "gbps", "pct_peak",
           *RANK_FIGURES)
# what samples_ms, round_medians_ms and the workload give: computed on read (pct_peak by the report, from env.json)
GROUPS = {"work": WORKLOAD, "load": CONTENTION, "check": ACCURACY, "memory": ("peak_mem_bytes", "peak_mem_cached"),
          "kernels": KERNELS, "gpu": GPU_STATE,
          "per_rank": RANK_MEASURED}  # a record's namespaced groups: {group: {column: value}}
_GROUP_OF = {c: g for g, cols in GROUPS.items() for c in cols}
STORED = tuple(c for c in COLUMNS if c not in DERIVED and c not in _GROUP_OF)  # a record's top-level columns
WRITTEN = (*IDENTITY, *OUTCOME)  # in every record, even when None
_ALWAYS = frozenset(ALWAYS)


def to_record(row: dict) -> dict:
    """The row as written to results.jsonl (format ``FORMAT``): its stored columns at the top
    level (a None one only where every record has it, ``WRITTEN``), each group's columns that
    are not None under the group's name, then ``extra`` when it has any.  The derived figures
    are left out; a row that has them must have the samples they come from."""
    if row.get("median_ms") is not None and not row.get("samples_ms"):
        raise RowError("a row's median and spread are computed from its samples_ms when it is read: give the "
                       "samples, not the figures")
    out: dict = {}
    for name in COLUMNS:
        value = row.get(name)
        if isinstance(value, enum.Enum):
            value = value.value
        if name in DERIVED or (value is None and name not in WRITTEN):
            continue
        group = _GROUP_OF.get(name)
        if group:
            out.setdefault(group, {})[name] = value
        else:
            out[name] = value
    if row.get("extra"):
        out["extra"] = dict(row["extra"])
    return out


RENAMED = {"max_rel_err": "max_err_over_max_ref"}  # format 1's old column name: the name it has now


def formats(env: dict) -> list[tuple[int, int]]:
    """env.json's ``row_formats``: (first line, format) pairs in line order; a folder written
    before formats were recorded is format 1 throughout."""
    pairs = env.get("row_formats") if isinstance(env, dict) else None
    try:
        return [(int(line), int(fmt)) for line, fmt in pairs] or [(1, 1)]
    except (TypeError, ValueError):
        return [(1, 1)]


def shape_format(record: dict) -> int:
    """A record's format from its shape, for a folder whose env.json is missing or unreadable: a
    format-1 record always has its median (None where it was not measured), a later one never."""
    return 1 if "median_ms" in record else FORMAT


def format_of(pairs, line: int) -> int:
    """The format of a folder's ``line`` (1-based), from ``formats``."""
    return next((fmt for first, fmt in reversed(pairs) if first <= line), pairs[0][1])


def with_case_defaults(record: dict) -> dict:
    """A record of a case field it predates at the default it was measured with (``CASE_ADDED``)."""
    return record | {f: CASE_DEFAULTS[f] for f in CASE_ADDED if f not in record}


def from_disk(record: dict, fmt: int, figures=None) -> dict:
    """A stored record as the flat row every reader uses: the one converter between formats.
    Format 1: the columns of older rows under a former name (``RENAMED``) under the name they
    have now, and a case field the row predates at the default it was measured with.  Format 2:
    the groups' columns at the top level in ``COLUMNS`` order, with the derived figures that
    ``figures(row)`` gives (``bench.measure.stats.row_figures``), and ``ALWAYS``'s columns even
    when None, as a format-1 row has them.  Either way, ``extra``'s figures become columns of
    their own (a figure named like a column comes as ``extra.<name>``)."""
    if fmt == 1:
        for old, new in RENAMED.items():
            if old in record and new not in record:
                record = {(new if k == old else k): v for k, v in record.items()}
        record = with_case_defaults(record)
    else:
        stored = {k: v for k, v in record.items() if k not in GROUPS and k != "extra"}
        for group in GROUPS:
            members = record.get(group)
            stored.update(members if isinstance(members, dict) else {})
        stored |= (figures(stored) if figures else {})
        flat = {}
        for c in COLUMNS:
            value = stored.get(c)
            if value is not None or c in _ALWAYS:
                flat[c] = value
        record = flat | {k: v for k, v in stored.items() if k not in flat and k not in COLUMNS} | (
            {"extra": record["extra"]} if "extra" in record else {})
    extra = record.get("extra")
    if not isinstance(extra, dict):
        return record
    out = {k: v for k, v in record.items() if k != "extra"}
    for k, v in extra.items():
        out[f"extra.{k}" if k in out or k in COLUMNS else k] = v
    return out


def cell_key(variant: str, case) -> tuple:
    """What identifies a cell: its variant and its case (a Case, or a row's case columns; a
    column a row lacks takes the default it was measured with)."""
    d = case.to_dict() if hasattr(case, "to_dict") else case
    return (variant,) + tuple(CASE_DEFAULTS[f] if f in CASE_ADDED and d.get(f) is None else d.get(f, CASE_DEFAULTS[f])
                              for f in CASE_FIELDS)


def current_rows(rows) -> list[dict]:
    """The row that counts for each cell: its newest.  Rows are appended and never rewritten,
    so a cell measured again (``--retry``, a resume) has several, and the last one written
    decides its status and figures.  Every reader of rows asks this helper (the summary,
    resume and retry, merge, compare, export, the plan's history, the report, the judging in
    ``bench.runs.judge``).  The cells come in the order they were first measured."""
    newest: dict = {}
    for r in rows:
        newest[cell_key(r.get("variant"), r)] = r
    return list(newest.values())
