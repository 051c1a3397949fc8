"""``--visits V``: each cell measured at V visits, each in a worker process of its own, so that its
interval holds what a rerun of the sweep would see.

Why (tests/benchmarks/drift.py, on a 2-core VM): the samples of one visit come from one process
over a second or two.  Their interval (the median's, from the order statistics) claimed +-2%,
while the same cell in two fresh runs moved by 15-20% (one sd), and a run's own interval held the
next run's figure for 14% of the cells.  The move comes with the process (its memory layout, its
threads' placement, the state it starts in: shared by every cell it times) and with the
machine's state over the run's minute, and samples inside one process show neither; cells timed
in several processes show the first (pyperf spreads its values over worker processes for this
reason).  The minimum and the 10th percentile moved as much as the median between runs (positive
noise inside a process is not what varies here), so a visit's estimate stays its median.
A visit timed while other processes took the cores is left out of the estimate when the first
was clean.  The variants of one case share every visit's worker and round, so a ratio between
them stays paired.

The first visit is the cell's whole life (reference check, determinism, memory pass) and writes
its row to results.jsonl.  Visits 2..V come after every cell has had its first: the sweep's
worker is replaced by a fresh process for each, the cases are taken in the opposite order at
every other visit (so that a cell's visits are spread over the sweep's minutes), and each case's
variants measured ok are set up on fresh inputs and timed again in one interleaved round
(bench.engine.revisit.visit_group, in the worker).  A visit's row goes to visits.jsonl, tied to
its cell's row by ``of`` (the row's ``interleave_id``); nothing in results.jsonl is rewritten.

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

``python tests/benchmarks/drift.py --out DIR --visits 3 --passes 0 --busy`` prints how often one
run's interval held another run's figure, quiet and beside a busy loop.
"""

from __future__ import annotations

import math
import statistics
import threading

from bench.engine import spans
from bench.engine.passes import Pass, PassResult, SweepSoFar

VISITS = "visits.jsonl"  # the later visits' rows
VISIT_TASK = "bench.engine.revisit:visit_group"  # the worker's part of a visit (bench.engine.runner.Job.task)
RATES = ("tflops", "gbps", "pct_peak")  # figures that follow the time: rescaled with the estimate
SPREAD = ("q1_ms", "q3_ms", "iqr_ms")  # the first visit's quartiles, carried to the estimate (the charts' band)
POOL_DOF = 2  # a cell's visit variance is moderated towards its run's, as if that were 2 more visits' worth
POOL_MIN = 3  # cells with visits a run needs before its variance is pooled


def run_visits(pool, visits: int, open_writer) -> float:
    """Visits 2..``visits`` of every cell ``pool`` measured ok, each row to the writer that
    ``open_writer()`` returns (visits.jsonl's); returns their timed seconds."""
    from bench.model.row import cell_key

    groups = [(case, list(dict.fromkeys(names))) for case, names in pool.measured.items()]
    if visits < 2 or not groups:
        return 0.0
    writer = open_writer()
    bar = pool.bars(total=sum(len(n) for _, n in groups) * (visits - 1), unit="cell", desc="visits")
    lock, timed, raised = threading.Lock(), [0.0], []
    try:
        for k in range(2, visits + 1):
            with spans.span("sweep: workers stopped for a visit's fresh process"):
                for w in pool.workers:  # a fresh process for this visit: another layout, another start
                    w.stop()
            queue = list(groups if k % 2 else reversed(groups))
            queue.reverse()  # popped from the end

            def serve(worker, label, k=k, queue=queue):
                try:
                    visit_cases(worker, label, k, queue)
                except BaseException as exc:  # the others stop at their next case; raised below
                    raised.append(exc)

            def visit_cases(worker, label, k, queue):
                while True:
                    with lock:
                        if not queue or raised:
                            return
                        case, names = queue.pop()

                    def on_row(row, case=case):
                        with lock:
                            row.update(of=pool.together.get(cell_key(row["variant"], row)), visit=k, worker=label)
                            writer.write(row)
                            timed[0] += row.get("timed_s") or 0.0
                            bar.update(1)

                    worker.run_group(names, case, pool.spec.timeout, on_row, task=VISIT_TASK)

            if len(pool.workers) == 1:  # here: what it waits on is this thread's (bench.engine.spans)
                serve(pool.workers[0], pool.slots[0].label)
            else:
                threads = [threading.Thread(target=serve, args=(w, s.label), daemon=True)
                           for w, s in zip(pool.workers, pool.slots)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            if raised:
                raise raised[0]
    finally:
        bar.close()
        writer.close()
    return timed[0]


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


def _pass(s: SweepSoFar) -> PassResult:
    return PassResult(run_visits(s.pool, s.spec.visits, lambda: s.writer(VISITS)))


PASS = Pass("later visits", 20, _pass)
