"""One variant's result on one case as the worker holds it, typed (in the spirit of
torch.utils.benchmark's ``Measurement``): the case and the settings it ran under, its outcome,
its check against the reference, its timing, its memory and the checks made after the timing.
``row()`` is the one boundary where it becomes the row the worker sends; the row's types are
checked once more where it is written (``bench.model.row.make_row``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.errors import first_line
from bench.measure import flops as flopcount
from bench.measure.correctness import CheckResult
from bench.measure.origin import classify
from bench.measure.settings import MeasureSettings
from bench.measure.timing import TimingSummary
from bench.model import scope
from bench.model.case import Case
from bench.model.row import MEASURED, ReasonKind, Status, default_kind

REASON_CHARS = 500  # a reason is one line a table can show


def base_row(variant: str, case: Case, status: str = "", reason: str = "", kind: str | None = None) -> dict:
    """The columns every row has, measured or not (None until measured), as a dict to fill;
    ``bench.model.row.make_row`` types it when it is written.  ``kind``: a ReasonKind
    (default: the status's own).  The sweep writes such a row itself for a cell no worker
    finished (a crash, a hang) or none was asked to (a variant that cannot take the case)."""
    kind = kind if kind is not None else (default_kind(Status(status)).value if status else "")
    if case.unsupported_reason:
        workload = {}
    else:  # as its scope counts them (bench.model.scope): a layer's, its self-attention core's mask
        workload = scope.of(case).work(case)
    if case.mixed and workload:  # each phase's share of the work
        workload["phases"] = flopcount.mix_phases(case)
    return {"variant": variant, **case.to_dict(), "status": status, "reason": reason, "reason_kind": kind,
            **workload} | dict.fromkeys(MEASURED)


@dataclass
class CellResult:
    """What one cell came to.  ``status`` is None while the cell waits for its timing (it passed
    its check); every path ends with one.  A failed cell keeps what it finished before the
    failure (its setup, its check) and no figure of the pass that failed or came after it."""
    variant: str
    case: Case
    settings: MeasureSettings  # its budget, threads and precision go on every row, failed ones too
    approximate: bool = False
    status: Status | None = None
    reason: str = ""
    reason_kind: ReasonKind | None = None
    setup_ms: float | None = None
    extra: dict = field(default_factory=dict)  # Prepared.info: the variant's own figures
    layout: str | None = None  # a ragged or mixed batch: how the variant held it (packed, nested, padded, ...)
    check: CheckResult | None = None  # against the float64 reference (its tensors dropped)
    reference_skipped: str | None = None  # why it was timed unchecked
    deterministic: bool | None = None  # later calls on the same inputs gave the checked call's bits
    nondeterminism: float | None = None  # else their largest difference
    timing: TimingSummary | None = None
    bwd_forward: str | None = None  # "per turn": each turn of a backward ran its own forward
    interleave_id: str | None = None  # the cells timed in the same rounds
    contention: dict = field(default_factory=dict)  # the CPU's verdict (bench.features.contention.contention.verdict)
    layer: dict | None = None  # a layer scope's parts (bench.scopes.layer_run.layer_figures)
    gpu_state: dict = field(default_factory=dict)  # clocks, power and energy around its turns (nvml.Cell)
    peak_mem_bytes: int | None = None  # the memory pass: the whole step's peak
    peak_mem_cached: bool | None = None  # True: taken from the machine's record (bench.engine.memcache)
    gpu_checks: dict = field(default_factory=dict)  # the kernels that ran, their backend, the graph timer
    retimed: str | None = None  # timed again in place (contention.retime.Held): why the first timing was contended
    ranked: dict = field(default_factory=dict)  # a cell of several ranks: each rank's figures (bench.model.row.RANKS)

    def decide(self, status: Status, reason: str = "", kind: ReasonKind | str | None = None) -> CellResult:
        self.status, self.reason = status, reason[:REASON_CHARS]
        self.reason_kind = ReasonKind(kind) if kind else default_kind(status)
        return self

    def fail(self, exc: BaseException, during: str = "") -> CellResult:
        """The status and reason from an exception, by where it was raised
        (``bench.measure.origin``), never by its words; ``during`` names the pass it ended."""
        status, kind, where = classify(exc)
        why = f"{type(exc).__name__}: {first_line(exc)}"
        if status == "error":
            why = f"{why} (raised in {where})"
        self.decide(Status(status), f"{during}: {why}" if during else why, kind)
        self.timing, self.bwd_forward, self.interleave_id, self.peak_mem_bytes = None, None, None, None
        self.contention, self.gpu_state, self.gpu_checks = {}, {}, {}
        return self

    def checked(self, check: CheckResult) -> CellResult:
        """Keep the check's figures (not the tensors it compared); a failed check is a mismatch."""
        self.check = replace(check, outputs=None)
        if not check.ok:
            self.decide(Status.MISMATCH, check.reason, check.kind)
        return self

    def row(self) -> dict:
        """The row the worker sends: the case's columns, the settings, and every figure held."""
        row = self.settings.stamp(base_row(self.variant, self.case), self.case.device)
        row.update(approximate=self.approximate, setup_ms=self.setup_ms, extra=dict(self.extra),
                   status=self.status.value if self.status else "", reason=self.reason,
                   reason_kind=self.reason_kind.value if self.reason_kind else "")
        optional = {"layout": self.layout, "reference_skipped": self.reference_skipped,
                    "bwd_forward": self.bwd_forward, "interleave_id": self.interleave_id, "retimed": self.retimed}
        row.update({k: v for k, v in optional.items() if v is not None})
        if self.deterministic is not None:
            row.update(deterministic=self.deterministic, nondeterminism=self.nondeterminism)
        if self.check is not None:
            row.update(self.check.columns())
        if self.timing is not None:
            row.update(self.timing.columns())
        row.update(self.contention, **self.gpu_state, **self.gpu_checks)
        if self.layer is not None:
            row["layer"] = self.layer
        if self.status is Status.OK and self.timing is not None:
            row.update(self.ranked)
            row["peak_mem_bytes"] = self.peak_mem_bytes
            if self.peak_mem_cached is not None:
                row["peak_mem_cached"] = self.peak_mem_cached
        return row
