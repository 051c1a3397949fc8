"""Later visits (``sweep --visits V``, bench.engine.visits) as a reader sees them: visits.jsonl's
rows folded into the rows of results.jsonl they belong to.

On read (``merge``), a row with later visits takes as its estimate the geometric mean of the
visits' medians (``median_ms``; ``visit_medians_ms`` keeps each visit's figure and ``visit_ids``
its number, ``first_median_ms`` the first visit's own; the rates follow the estimate, and the
first visit's quartiles are carried to it, so that a chart's band lies around the figure).  Its
interval is the one a rerun's figure falls in with 95% (``ci_lo_ms``, ``ci_hi_ms``,
``ci_halfwidth``):

- the variance of the visits' logs, moderated towards the median variance of the run's cells
  (with 3 visits a cell's own has 2 degrees of freedom, and visits that agree by chance would
  give a narrow interval), over the visits: ``visit_se``, the estimate's standard error within
  the run, which is what a fit weighs it by;
- plus what a whole run shares and its visits cannot show (the machine's state that minute):
  taken as large as the offsets its visits share vary, and no smaller than the estimate's own
  variance (on the 2-core VM, quiet, drift.py measured a run's shared factor at sd 0.07 to 0.11,
  of the order of both, and three visits read the first with 2 degrees of freedom);
- both for this run and for the rerun, with Student's t.
"""

from __future__ import annotations

import math
import statistics

VISITS = "visits.jsonl"  # the later visits' rows
RATES = ("tflops", "gbps", "pct_peak")  # figures that follow the time: rescaled with the estimate
SPREAD = ("q1_ms", "q3_ms", "iqr_ms")  # the first visit's quartiles, carried to the estimate (the charts' band)
POOL_DOF = 2  # a cell's visit variance is moderated towards its run's, as if that were 2 more visits' worth
POOL_MIN = 3  # cells with visits a run needs before its variance is pooled


def by_row(visit_rows) -> dict:
    """Visit rows (visits.jsonl's) by the row they belong to: (its ``interleave_id``, its variant)."""
    out: dict = {}
    for v in visit_rows:
        if v.get("of"):
            out.setdefault((v["of"], v.get("variant")), []).append(v)
    return out


def merge(rows: list[dict], visits: dict) -> list[dict]:
    """``rows`` with each ok row's later visits folded in (the module doc); rows without any are
    returned as they are."""
    if not visits:
        return rows
    out = [combine(r, visits.get((r.get("interleave_id"), r.get("variant")), ())) if r.get("status") == "ok" else r
           for r in rows]
    visited = [r for r in out if r.get("visit_var") is not None]
    pooled = statistics.median(r["visit_var"] for r in visited) if len(visited) >= POOL_MIN else None
    shared = shared_var(visited)
    return [with_interval(r, pooled, shared) if r.get("visit_var") is not None else r for r in out]


def shared_var(visited: list[dict]) -> float:
    """The variance of what every cell of a visit shares (its process's offset: per visit, the
    median over the cells of how far the visit's figure lies from the cell's estimate), over the
    visits; 0 with fewer than POOL_MIN cells or 2 visits to read it from."""
    by_visit: dict = {}
    for r in visited:
        mean = math.log(float(r["median_ms"]))
        for k, m in zip(r["visit_ids"], r["visit_medians_ms"]):
            by_visit.setdefault(k, []).append(math.log(m) - mean)
    offsets = [statistics.median(xs) for xs in by_visit.values() if len(xs) >= POOL_MIN]
    return statistics.variance(offsets) if len(offsets) >= 2 else 0.0


def combine(row: dict, later) -> dict:
    """One ok row and its later visits' rows: the visits' figures and the estimate over them (the
    interval comes with ``with_interval``, which knows the run's other cells)."""
    first = row.get("median_ms")
    if not first or not later:
        return row
    ok = [v for v in later if v.get("status") == "ok" and v.get("median_ms")]
    clean = [v for v in ok if not v.get("contended")]
    used = ok if row.get("contended") else clean
    meds = [float(first)] + [float(v["median_ms"]) for v in used]
    out = dict(row, visits=len(meds), visit_medians_ms=meds, visit_ids=[1] + [int(v.get("visit") or 0) for v in used],
               first_median_ms=float(first), visits_left_out=len(later) - len(used))
    if len(meds) < 2:
        return out
    logs = [math.log(m) for m in meds]
    est = math.exp(statistics.mean(logs))
    out.update(median_ms=est, visit_var=statistics.variance(logs),
               timed_s=(row.get("timed_s") or 0.0) + sum(v.get("timed_s") or 0.0 for v in used))
    for rate in RATES:
        if row.get(rate) is not None:
            out[rate] = float(row[rate]) * float(first) / est
    for col in SPREAD:  # the first visit's spread around the figure, not around its own median
        if row.get(col) is not None:
            out[col] = float(row[col]) * est / float(first)
    return out


def with_interval(row: dict, pooled: float | None, shared: float = 0.0) -> dict:
    """The row's 95% interval for a rerun's figure (the module doc): its visits' variance of log
    figures, moderated towards the run's (``pooled``, the median over its cells, worth POOL_DOF
    degrees of freedom), over the visits; plus, for what a whole run shares and its visits cannot
    show, as much again as its visits' shared offsets vary (``shared``), and no less than the
    estimate's own variance; summed for two runs."""
    from bench.measure.stats import NOISY_CI, t_quantile

    n, var = int(row["visits"]), float(row["visit_var"])
    dof, var = (n - 1 + POOL_DOF, ((n - 1) * var + POOL_DOF * pooled) / (n - 1 + POOL_DOF)) if pooled is not None \
        else (n - 1, var)
    se = math.sqrt(var / n)  # of the estimate's log, within the run
    shared = max(shared, se ** 2)  # a run's shared state: at least as large as the estimate's own error
    half = t_quantile(0.975, dof) * math.sqrt(2 * (se ** 2 + shared))  # this run's estimate and a rerun's both vary
    est = float(row["median_ms"])
    lo, hi = est * math.exp(-half), est * math.exp(half)
    return dict(row, visit_se=se, ci_lo_ms=lo, ci_hi_ms=hi, ci_halfwidth=hi / est - 1.0,
                noisy=hi / est - 1.0 > NOISY_CI)
