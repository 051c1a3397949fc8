"""Judging rows, in one place: what failed, what is shaky and why, the trust state of a run,
what a machine's fingerprint is, and gpu-check's acceptance thresholds.

Named constants and plain functions of rows (dicts, as results.jsonl holds them): the
reports, the command line's summary, compare and gpu-check ask here; none decides on its
own.  Nothing here reads the words of a reason: a row's ``status`` and ``reason_kind`` say
what it is (``bench.model.row``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.measure.settings import INTERVAL_SAMPLES
from bench.model.row import FAILED, FLAGS, ReasonKind, Status, current_rows  # noqa: F401  (FLAGS: every raw flag)

# -- the machine --------------------------------------------------------------------------------

# what makes two runs' numbers comparable: a resume on a machine that differs in any of these is
# refused (or marked mixed), and so is a merge of shards that differ
FINGERPRINT = ("torch", "xformers", "cuda", "python", "device", "device_name", "cpu", "cpu_count", "threads")


def fingerprint_changes(before: dict, now: dict) -> list[str]:
    """``key: before -> now`` for each fingerprint key that differs."""
    return [f"{k}: {before.get(k)} -> {now.get(k)}" for k in FINGERPRINT if before.get(k) != now.get(k)]


# -- failed ---------------------------------------------------------------------------------------


def failed(row: dict) -> bool:
    """A cell to look at: an error, crash, timeout, mismatch or oom, or 'unsupported' with no
    reason (a capability or library refusal always gives one)."""
    status = row.get("status")
    return status in FAILED or (status == Status.UNSUPPORTED and not (row.get("reason") or "").strip())


def accuracy_verdict(row: dict) -> bool:
    """An approximate variant's ``mismatch`` on its values: how good the approximation is on
    these inputs, not a failure of the harness (gpu-check does not fail on it)."""
    return bool(row.get("approximate")) and row.get("status") == Status.MISMATCH and \
        row.get("reason_kind") == ReasonKind.MISMATCH_VALUES


def declared_out(row: dict) -> bool:
    """Unsupported because the variant's declared capabilities exclude the case (a mask, a
    direction it does not claim): not something that went wrong, and not listed as one."""
    return row.get("status") == Status.UNSUPPORTED and row.get("reason_kind") == ReasonKind.CAPABILITY


def not_measured(row: dict) -> bool:
    """The report's failed cells: every cell that has no measurement, but those its variant
    declared out (rows written before ``reason_kind`` existed are listed: they cannot be told)."""
    return row.get("status") != Status.OK and not declared_out(row)


def failure_line(row: dict) -> str:
    return (f"{row.get('variant')} {row.get('status')} at n={row.get('q_len')} {row.get('mask')} "
            f"{row.get('direction')} {row.get('dtype')}: {(row.get('reason') or 'no reason given')[:160]}")


def failures(rows, allow_accuracy: bool = False) -> list[str]:
    """The failed cells of ``rows`` (their current rows, ``bench.model.row.current_rows``), one
    line each; ``allow_accuracy``: an approximation's accuracy verdict is not one."""
    return [failure_line(r) for r in current_rows(rows) if failed(r) and not (allow_accuracy and
                                                                               accuracy_verdict(r))]


# -- shaky ----------------------------------------------------------------------------------------

# the flags that make an ok row's figure shaky (kept, but hollow in charts and starred in tables):
# too few samples for a 95% interval of the median (its precision is unknown: few_samples), timed
# while other processes had the cores (contended), on a GPU that slowed itself (throttled): a figure
# whose precision is unknown or which is biased.  A wide interval (noisy) is a flag of its own, kept
# as data and shown with the cell, but not shaky: the interval says how far the figure may be off,
# and what the report concludes from it (a winner, a crossover, a fit, a compare verdict) takes the
# interval into account.  Each is a reason of its own, with its own remedy.
SHAKY = ("few_samples", "contended", "throttled")
RETRY_FLAGS = {**{f: (f,) for f in FLAGS}, "shaky": SHAKY}
WHY = {"few_samples": "with too few samples for an interval", "noisy": "noisy", "contended": "contended",
       "throttled": "throttled"}
REMEDY = {
    "few_samples": "a larger --ceiling-s lets each cell take the 6 samples a 95% interval needs",
    "noisy": "a larger --budget-ms narrows a wide interval",
    "contended": "--resume RUN --retry contended on a quieter machine, or fewer --threads than cores",
    "throttled": "--resume RUN --retry throttled once the GPU has cooled",
}


# two figures closer than this are the same as far as the report says: the charts draw them as one
# ("equal within 3 %"), and no crossover or winner is stated between them
SAME_WITHIN = 0.03


def beyond_same(ratio: float, lo: float, hi: float) -> int:
    """+1 when a ratio's whole spread [lo, hi] is above 1 and the ratio itself beyond SAME_WITHIN,
    -1 when below both, 0 when the two cannot be told apart."""
    if lo > 1 and ratio > 1 + SAME_WITHIN:
        return 1
    if hi < 1 and ratio < 1 / (1 + SAME_WITHIN):
        return -1
    return 0


def remedy(flag: str, run: str | None = None) -> str:
    """What would help cells shaky for ``flag``, naming the run folder ``run`` in its command
    (RUN where there is none, or several)."""
    import shlex

    return REMEDY[flag].replace("RUN", shlex.quote(str(run)) if run else "RUN")


def shaky_flags(row: dict) -> list[str]:
    """The flags of an ok row that make it shaky ([] for a clean one or a failed one).  A cell
    whose visits give its interval (``visit_se``, bench.runs.visits) has a known precision
    however few samples each visit took: few_samples stays a flag of the row, not a shaky one."""
    if row.get("status") != Status.OK:
        return []
    visited = _true(row.get("visit_se"))
    return [f for f in SHAKY if _true(row.get(f)) and not (f == "few_samples" and visited)]


def raw_flags(row: dict) -> list[str]:
    """Every flag an ok row carries (row.FLAGS: noisy too), shown with the cell ([] for a failed one)."""
    if row.get("status") != Status.OK:
        return []
    return [f for f in FLAGS if _true(row.get(f))]


def _true(value) -> bool:
    """A flag as rows hold it: True, or a numpy True from a frame; None and NaN (absent) are not."""
    return value is not None and value == value and bool(value)


def shaky(row: dict) -> bool:
    return bool(shaky_flags(row))


def severity(row: dict) -> float:
    """How far off a contended row's time may be, as the share of its cores it was timed with
    (1: all of them; its cpu_util, or, without one, 1 / (1 + the cores others took beyond
    the free ones)).  The trust line names the worst row by it (reports.trust)."""
    util = row.get("cpu_util")
    if util is not None and util == util:
        return float(util)
    other = row.get("other_cpu") or 0.0
    return 1.0 / (1.0 + max(0.0, float(other)))


def load_share(row: dict) -> float | None:
    """How much a row's time can be off by its load, as the share of its cores it was timed with: 1
    for a clean row, its ``severity`` for one shaky for contention alone (its time is at most 1 / that
    of a quiet machine's: a cell timed at 0.84 of its cores cannot be 2x slower from that alone), None
    when something else makes it shaky (throttled, too few samples) or its load was not read: no
    bound is known."""
    flags = shaky_flags(row)
    if not flags:
        return 1.0
    if flags == ["contended"] and any(_known(row.get(k)) for k in ("cpu_util", "other_cpu")):
        return min(1.0, max(1e-3, severity(row)))
    return None  # a contended row with no reading of its load bounds nothing


def _known(value) -> bool:
    return value is not None and value == value


def load_bounded(lo: float, hi: float, share_a: float | None, share_b: float | None) -> tuple[float, float]:
    """A B/A interval [lo, hi] widened by what the two rows' load can explain: B's time may be up to
    1 / share_b of a quiet one's (the true ratio is at least lo x share_b), A's up to 1 / share_a (at most
    hi / share_a).  An unknown share (None) bounds nothing on its side."""
    low = lo * share_b if share_b is not None else 0.0
    high = hi / share_a if share_a is not None else math.inf
    return low, high


def gate_verdict(verdict: str, lo: float, hi: float, gate: float) -> str:
    """A regression gate's word on one cell: ``regression`` (called slower, and its interval's lower end
    more than ``gate`` above 1), ``clear`` (its upper end at most 1 + gate: no regression of that size),
    or ``unjudged`` (its interval reaches past 1 + gate and it is not a regression, or it has none)."""
    if verdict == "slower" and lo == lo and lo - 1.0 > gate:
        return "regression"
    if hi == hi and hi <= 1.0 + gate:
        return "clear"
    return "unjudged"


GATE_EXIT = {"clear": 0, "regression": 1, "no match": 3, "unjudged": 4}  # --fail-on-regression's exit codes
# (2 is a usage error): 4 when no judged cell regressed but some matched cells could not be judged


def shaky_counts(rows) -> dict:
    """How many of the ok ``rows`` are shaky for each reason (a row may have several), then how many
    carry each other flag (noisy)."""
    ok = [r for r in rows if r.get("status") == Status.OK]
    return {f: sum(1 for r in ok if f in shaky_flags(r)) for f in SHAKY} | \
        {f: sum(1 for r in ok if f in raw_flags(r)) for f in FLAGS if f not in SHAKY}


def reasons_text(counts: dict) -> str:
    """``68 with too few samples for an interval, 9 noisy`` (only the reasons that occur)."""
    return ", ".join(f"{n} {WHY[f]}" for f, n in counts.items() if n) or "none"


def interval_cost(rows) -> tuple[float, float]:
    """For the ok rows with too few samples: (the ceiling, in seconds per cell, that would give
    every one the samples an interval needs; the seconds of timing that would add in all)."""
    need, more = 0.0, 0.0
    for r in rows:
        if "few_samples" not in shaky_flags(r) or not r.get("median_ms"):
            continue
        per = float(r["median_ms"]) / 1e3 * max(1, int(r.get("number") or 1))
        need = max(need, INTERVAL_SAMPLES * per)
        more += max(0, INTERVAL_SAMPLES - int(r.get("samples") or 0)) * per
    return need, more


def fit_sigma(row: dict) -> float | None:
    """The relative uncertainty of an ok row's median in a fit (its weight is 1 / sigma^2); None
    only for a row that has no median to fit.  Every measured cell is fitted: its within-run
    precision (the 95% interval's half-width / 1.96, or a few samples' spread, or FEW_SIGMA with
    none to read) and the between-run drift a rerun shows (BETWEEN_RUN_SIGMA) add in quadrature
    (with --visits, the standard error over the visits, which holds that drift, is taken alone);
    a contended or throttled cell's figure is biased, so it weighs as SHAKY_SIGMA at most."""
    if row.get("status") != Status.OK or not row.get("median_ms"):
        return None
    flags = shaky_flags(row)
    med = float(row["median_ms"])
    half = row.get("ci_halfwidth")
    if _true(half) and math.isfinite(float(half)):
        within = float(half) / 1.96
    else:  # too few samples for an interval: their spread, where there is one
        samples = row.get("samples_ms")
        samples = [float(x) for x in samples] if isinstance(samples, (list, tuple)) and len(samples) > 1 else None
        within = (max(samples) - min(samples)) / 2 / med if samples and med > 0 else FEW_SIGMA
    if _true(row.get("visit_se")):  # --visits: the estimate's own error over fresh processes (bench.runs.visits)
        within = float(row["visit_se"])
        sigma = max(within, MIN_SIGMA)
    else:
        sigma = math.hypot(max(within, MIN_SIGMA), BETWEEN_RUN_SIGMA)
    if {"contended", "throttled"} & set(flags):
        sigma = max(sigma, SHAKY_SIGMA)
    return sigma


def weighted_down(rows) -> str:
    """The fit's cells that weigh less than their precision alone would give, by reason:
    ``2 (contended), 1 (noisy)``."""
    why: dict = {}
    for r in rows:
        if r.get("status") != Status.OK:
            continue
        flags = shaky_flags(r)
        key = next((f for f in ("contended", "throttled", "noisy", "few_samples") if f in flags), None)
        if key:
            key = "too few samples" if key == "few_samples" else key
            why[key] = why.get(key, 0) + 1
    return ", ".join(f"{n} ({k})" for k, n in why.items())


# an exponent whose 95% interval is wider than this either way is uncertain: the report says so
EXPONENT_UNCERTAIN = 0.15
BETWEEN_RUN_SIGMA = 0.12  # a cell's median moves this much (relative, one sd) from one run to the next beyond what
# every cell of the run shares (which only moves a fit's intercept): tests/benchmarks/drift.py measured 12% on the
# 2-core VM; what a single run's samples cannot show
SHAKY_SIGMA = 0.3  # a contended or throttled figure: in the fit, at this weight at most
FEW_SIGMA = 0.2  # a single sample: no spread to read


NOISY = 0.05  # as bench.measure.timing.NOISY_CI: a half-interval beyond 5% of the median is wide
MIN_SIGMA = 0.005  # no cell weighs more than one known to +-0.5%


def wants_retry(row: dict, retry) -> bool:
    """True when ``row``'s status is in ``retry``, or it is ok and carries a flag named there
    (``RETRY_FLAGS``: noisy, contended, throttled, or shaky for any of them)."""
    if row.get("status") in retry:
        return True
    flags = raw_flags(row)
    return any(f in flags for name in retry for f in RETRY_FLAGS.get(name, ()))


# -- the trust state of a run ------------------------------------------------------------------------

CONTENDED_BAD = 0.5  # over this share of the ok cells contended: do not use (contended is biased, not wide)
SHAKY_CARE = 0.1  # over this share shaky: read with care


@dataclass(frozen=True)
class Conclusions:
    """What a report states from its cells, by kind (winners, exponents, crossovers), and how many
    of each rest on a shaky cell: a contended or throttled figure is biased and one with too few
    samples has no known precision, so a statement made from it could be overturned by measuring
    it again.  A wide interval does not put a statement at risk: a winner not told apart, or an
    exponent wider than EXPONENT_UNCERTAIN, is not stated as one."""
    stated: dict  # kind: statements
    at_risk: dict  # kind: of them, those that rest on a shaky cell

    @property
    def total(self) -> int:
        return sum(self.stated.values())

    @property
    def risky(self) -> int:
        return sum(self.at_risk.values())

    def words(self) -> str:
        """``2 winners, 1 exponent`` (the kinds at risk)."""
        return ", ".join(f"{n} {k if n != 1 else k.rstrip('s')}" for k, n in self.at_risk.items() if n) or "none"


def winner_at_risk(margin: float, lo: float, hi: float, shaky_pair: bool) -> tuple[bool, bool]:
    """(stated, at risk) for an overview row: a winner is stated when its margin is told apart
    (beyond_same), and at risk when the fastest or the runner-up is shaky."""
    stated = margin == margin and beyond_same(margin, lo, hi) != 0
    return stated, stated and shaky_pair


def exponent_at_risk(exponent: float, lo: float, hi: float, weighted_down: str) -> tuple[bool, bool]:
    """(stated, at risk) for a time exponent: stated when its 95% interval is within
    EXPONENT_UNCERTAIN either way, at risk when a shaky cell weighed in its fit."""
    stated = exponent == exponent and (hi - lo) / 2 <= EXPONENT_UNCERTAIN
    risky = any(word in (weighted_down or "") for word in ("contended", "throttled", "too few samples"))
    return stated, stated and risky


@dataclass(frozen=True)
class Trust:
    state: str  # clean | care | bad
    heading: str
    reason: str
    ok: int
    shaky: int
    noisy: int
    contended: int
    throttled: int
    unchecked: int  # timed without their reference check
    few_samples: int = 0
    conclusions: Conclusions | None = None  # a report's statements and those at risk (None: judged by cells)

    @property
    def clean(self) -> int:
        return self.ok - self.shaky

    @property
    def counts(self) -> dict:
        """The shaky flags' counts (noisy is not one: the interval is shown, and the report's conclusions use it)."""
        return {"few_samples": self.few_samples, "contended": self.contended, "throttled": self.throttled}

    @property
    def verdict(self) -> str:
        """The trust line's first words."""
        c = self.conclusions
        if c is not None and self.state != "bad":
            if not c.risky:
                return "trustworthy"
            if c.risky <= SHAKY_CARE * max(1, c.total):
                return "mostly trustworthy"
            return f"read with care, {c.risky} of {c.total} conclusions rest on shaky cells ({c.words()})"
        if self.shaky == 0:
            return "trustworthy"
        if self.shaky <= SHAKY_CARE * max(1, self.ok):
            return "mostly trustworthy"
        remedies = "; ".join(remedy(f) for f, n in self.counts.items() if n)
        return f"read with care, {self.shaky} of {self.ok} ok cells are shaky ({remedies})"


def trust(rows, mixed_runs=(), unreliable_peaks=(), conclusions: Conclusions | None = None) -> Trust:
    """The trust state of ``rows`` (the current rows of one or several runs): ``mixed_runs``
    names runs resumed on a machine that differs, ``unreliable_peaks`` the dtypes whose
    matmul peak a cell went above.  With ``conclusions`` (a report's), read with care is decided
    by the statements at risk, not by the shaky cells, which stay counted as data."""
    ok = [r for r in rows if r.get("status") == Status.OK]
    n = len(ok)
    count = shaky_counts(ok)
    n_shaky = sum(1 for r in ok if shaky(r))
    unchecked = sum(1 for r in ok if _true(r.get("reference_skipped")))
    args = dict(ok=n, shaky=n_shaky, noisy=count["noisy"], contended=count["contended"],
                throttled=count["throttled"], unchecked=unchecked, few_samples=count["few_samples"],
                conclusions=conclusions)
    if not ok:
        return Trust("bad", "Do not use", "no cell was measured ok", **args)
    if count["contended"] > CONTENDED_BAD * n:
        return Trust("bad", "Do not use", f"{count['contended']} of {n} ok cells were timed while the CPU was shared",
                     **args)
    if mixed_runs:
        return Trust("bad", "Do not use", f"{', '.join(mixed_runs)} mixes machines (resumed on one that differs)",
                     **args)
    if conclusions is not None and conclusions.risky > SHAKY_CARE * max(1, conclusions.total):
        return Trust("care", "Read with care", f"{conclusions.risky} of {conclusions.total} conclusions rest on "
                                               f"shaky cells ({conclusions.words()})", **args)
    if conclusions is None and n_shaky > SHAKY_CARE * n:
        return Trust("care", "Read with care", f"{n_shaky} of {n} ok cells are shaky "
                                               f"({reasons_text({f: count[f] for f in SHAKY})})",
                     **args)
    if unreliable_peaks or unchecked:
        why = (f"the matmul peak is unreliable for {', '.join(unreliable_peaks)}" if unreliable_peaks else
               f"{unchecked} ok cells were timed without their reference check")
        return Trust("care", "Read with care", why, **args)
    if conclusions is not None:
        return Trust("clean", "Clean", f"none of the {conclusions.total} conclusions rests on a shaky cell"
                     if not conclusions.risky else f"only {conclusions.risky} of {conclusions.total} conclusions "
                     f"rest on shaky cells ({conclusions.words()})", **args)
    return Trust("clean", "Clean", "every ok cell is clean" if not n_shaky else
                 f"only {n_shaky} of {n} ok cells are shaky", **args)


# -- gpu-check's acceptance thresholds and verdicts: bench.runs.judge.acceptance -------------------------------


# -- compare: is B faster or slower than A, cell by cell -------------------------------------------------

COMPARE_MARGIN = 0.05  # a change smaller than 5% is not called: two runs of one build drift by a few percent
AB_MARGIN = 0.02  # ab's: its two builds take turns, so the drift between runs falls on both alike and a smaller change
# can be called (tests/benchmarks/ab_check.py: the A/As it runs call none at this margin)
COMPARE_FDR = 0.05  # Benjamini-Hochberg's false-discovery rate over the cells of one comparison


AB_REPEATS = 3  # ab's first look: pairs of fresh processes, each repeat one more degree of freedom for its t test
AB_BUDGET_S = 120.0  # ab's default budget: more repeats while cells are undecided, for up to 2 minutes


def between_runs(verdict: str, drift: float | None) -> str:
    """A verdict on two separate runs: faster or slower only where this machine's between-run drift
    is known (an A/A ab measured it); otherwise what the runs' own samples cannot show is unknown,
    and the cell is unsure."""
    if drift is None and verdict in ("faster", "slower"):
        return "unsure"
    return verdict


def with_run_shift(verdict: str, shift: dict | None) -> str:
    """A cell's verdict relative to its run, with the whole run's: where B as a whole is slower or
    faster beyond the run-level drift, a cell that did not move against the run moved with it."""
    if shift and shift.get("verdict") in ("faster", "slower") and verdict in ("same", "unsure"):
        return shift["verdict"]
    return verdict


def compare_verdict(evidence, rejected: bool, margin: float = COMPARE_MARGIN) -> str:
    """faster or slower (beyond ``margin``, rejected by Benjamini-Hochberg across the comparison),
    same (the ratio's 95% interval within the margin either way), or unsure."""
    if rejected:
        return "slower" if evidence.p_slower <= evidence.p_faster else "faster"
    if evidence.lo >= 1.0 / (1.0 + margin) and evidence.hi <= 1.0 + margin:
        return "same"
    return "unsure"
