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

On read, a row's later visits are folded into it by bench.runs.visits (its estimate and
interval).

``python tests/benchmarks/drift.py --out DIR --visits 3 --passes 0 --busy`` prints how often one
run's interval held another run's figure, quiet and beside a busy loop.
"""

from __future__ import annotations

import threading

from bench.engine import spans
from bench.engine.passes import Pass, PassResult, SweepSoFar
from bench.runs.visits import VISITS

VISIT_TASK = "bench.engine.revisit:visit_group"  # the worker's part of a visit (bench.engine.runner.Job.task)


def run_visits(pool, visits: int, open_writer) -> float:
    """Visits 2..``visits`` of every cell ``pool`` measured ok, each row to the writer that
    ``open_writer()`` returns (visits.jsonl's); returns their timed seconds."""
    from bench.model.row import cell_key

    # (a context-parallel cell is measured once, on its ranks: its interval is its own visit's)
    groups = [(case, kept) for case, names in pool.measured.items()
              if (kept := [n for n in dict.fromkeys(names) if not pool.registry[n].shard])]
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


def _pass(s: SweepSoFar) -> PassResult:
    return PassResult(run_visits(s.pool, s.spec.visits, lambda: s.writer(VISITS)))


PASS = Pass("later visits", 20, _pass)
