"""Judging rows, in one place: what failed, what is shaky and why, the trust state of a run,
what a machine's fingerprint is, and gpu-check's acceptance thresholds.

Named constants and plain functions of rows (dicts, as results.jsonl holds them): the
reports, the command line's summary, compare and gpu-check ask here; none decides on its
own.  Nothing here reads the words of a reason: a row's ``status`` and ``reason_kind`` say
what it is (``bench.model.row``).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.model.row import FAILED, FLAGS, ReasonKind, Status, current_rows

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

# the flags that make an ok row's figure shaky (kept, but hollow in charts, starred in tables,
# left out of fits and re-measured on request): a median whose interval is wide (noisy), timed
# while other processes had the cores (contended), on a GPU that slowed itself (throttled)
SHAKY = FLAGS
RETRY_FLAGS = {"noisy": ("noisy",), "contended": ("contended",), "throttled": ("throttled",), "shaky": SHAKY}


def shaky_flags(row: dict) -> list[str]:
    """The flags of an ok row that make it shaky ([] for a clean one or a failed one)."""
    if row.get("status") != Status.OK:
        return []
    return [f for f in SHAKY if _true(row.get(f))]


def _true(value) -> bool:
    """A flag as rows hold it: True, or a numpy True from a frame; None and NaN (absent) are not."""
    return value is not None and value == value and bool(value)


def shaky(row: dict) -> bool:
    return bool(shaky_flags(row))


def wants_retry(row: dict, retry) -> bool:
    """True when ``row``'s status is in ``retry``, or it is ok and carries a flag named there
    (``RETRY_FLAGS``: noisy, contended, throttled, or shaky for any of them)."""
    if row.get("status") in retry:
        return True
    flags = shaky_flags(row)
    return any(f in flags for name in retry for f in RETRY_FLAGS.get(name, ()))


# -- the trust state of a run ------------------------------------------------------------------------

CONTENDED_BAD = 0.5  # over this share of the ok cells contended: do not use (contended is biased, not wide)
SHAKY_CARE = 0.1  # over this share shaky: read with care


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

    @property
    def clean(self) -> int:
        return self.ok - self.shaky

    @property
    def verdict(self) -> str:
        """The trust line's first words."""
        if self.shaky == 0:
            return "trustworthy"
        if self.shaky <= SHAKY_CARE * max(1, self.ok):
            return "mostly trustworthy"
        return (f"read with care, {self.shaky} of {self.ok} ok cells are shaky (a larger --budget-ms narrows noisy "
                f"medians; fewer --threads or a quieter machine helps contended ones)")


def trust(rows, mixed_runs=(), unreliable_peaks=()) -> Trust:
    """The trust state of ``rows`` (the current rows of one or several runs): ``mixed_runs``
    names runs resumed on a machine that differs, ``unreliable_peaks`` the dtypes whose
    matmul peak a cell went above."""
    ok = [r for r in rows if r.get("status") == Status.OK]
    n = len(ok)
    count = {f: sum(1 for r in ok if f in shaky_flags(r)) for f in SHAKY}
    n_shaky = sum(1 for r in ok if shaky(r))
    unchecked = sum(1 for r in ok if _true(r.get("reference_skipped")))
    args = dict(ok=n, shaky=n_shaky, noisy=count["noisy"], contended=count["contended"],
                throttled=count["throttled"], unchecked=unchecked)
    if not ok:
        return Trust("bad", "Do not use", "no cell was measured ok", **args)
    if count["contended"] > CONTENDED_BAD * n:
        return Trust("bad", "Do not use", f"{count['contended']} of {n} ok cells were timed while the CPU was shared",
                     **args)
    if mixed_runs:
        return Trust("bad", "Do not use", f"{', '.join(mixed_runs)} mixes machines (resumed on one that differs)",
                     **args)
    if n_shaky > SHAKY_CARE * n:
        return Trust("care", "Read with care", f"{n_shaky} of {n} ok cells are shaky", **args)
    if unreliable_peaks or unchecked:
        why = (f"the matmul peak is unreliable for {', '.join(unreliable_peaks)}" if unreliable_peaks else
               f"{unchecked} ok cells were timed without their reference check")
        return Trust("care", "Read with care", why, **args)
    return Trust("clean", "Clean", "every ok cell is clean" if not n_shaky else
                 f"only {n_shaky} of {n} ok cells are shaky", **args)


# -- gpu-check's acceptance thresholds ----------------------------------------------------------------

# the share of the measured matmul peak a backend must reach at the check's large size: cuDNN's
# attention runs near the GEMM rate on Hopper; FlashAttention-2 in torch 2.11 reaches about 350 to
# 400 TFLOP/s of the H200's ~790, the memory-efficient kernel less
SDPA_SHARE = {"sdpa.cudnn": 0.6, "sdpa.flash": 0.35, "sdpa": 0.35, "sdpa.efficient": 0.2}
MEMORY_EXPONENTS = {  # device: variant: (low, high) of peak memory against n in a causal scaling sweep
    "cuda": {"naive": (1.8, 2.2), "sdpa.flash": (0.85, 1.15)},
    # on the CPU, flash's per-thread scratch buffers are a fixed cost that the output (linear
    # in n) only outgrows at larger sizes: below 1 at these sizes, far below naive's 2
    "cpu": {"naive": (1.8, 2.2), "sdpa.flash": (0.3, 1.15)},
}
TIMER_AGREEMENT = {"cuda": 0.03, "cpu": 0.25}  # the harness median against do_bench (torch.utils.benchmark)
MIN_TFLOPS_CPU = 0.0  # the CPU rehearsal's relaxed threshold for the best SDPA backend
