"""The memory frontier: the largest n (or batch) of a case that fits a memory budget, found
with real cells.

For each variant the search measures a few small sizes (the probes), fits the memory model
(bench.runs.memmodel) to their peaks, and measures next at the size the model predicts
fits the budget; every later cell refits the model and is placed at its new prediction,
held inside the bracket [largest size that fitted, smallest that did not] with room to
shrink it by at least half the precision, or at the bracket's geometric middle when the
prediction gives no such room.  It stops when the bracket is within the precision (5 %),
when the next cell would take longer than the timeout (its time extrapolated from the
cells before, as n² or as the batch), or after a number of cells.

A cell fits when it is ok and its footprint, the inputs plus the allocator's peak above
them, is within the budget.  An out-of-memory is the cell's row (``oom``), measured in its
worker: the search goes on below it.  Each cell runs in a worker of its own sweep, so a
crash is a row too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.model.case import MAX_DIM, MAX_LEN, Case
from bench.runs import memmodel

PRECISION = 0.05  # the bracket's width when the search stops: hi <= lo x (1 + PRECISION)
MAX_CELLS = 14  # cells per variant, probes included
PROBES = {"n": {"cpu": (256, 512, 1024, 2048), "cuda": (1024, 2048, 4096, 8192)}, "batch": (1, 2, 4)}


@dataclass
class Cell:
    """One measured size: its row's verdict against the budget."""
    size: int
    status: str
    footprint: float | None  # inputs + peak above them, bytes (None: not measured)
    median_ms: float | None
    wall_s: float  # the cell's sweep, start to end
    fits: bool
    why: str = ""  # why it does not fit: its status and reason, or over the budget by how much


@dataclass
class Result:
    variant: str
    axis: str  # "n" or "batch"
    budget: float
    largest: int | None = None  # the largest size that fitted
    smallest_over: int | None = None  # the smallest size that did not (None: none tried)
    over_why: str = ""
    predicted: int | None = None  # the model's first prediction, from the probes
    model: tuple | None = None  # (a, b, c) of the last fit
    stop: str = ""  # why the search stopped
    cells: list = field(default_factory=list)

    @property
    def at_largest(self) -> Cell | None:
        return next((c for c in self.cells if c.size == self.largest and c.fits), None)

    @property
    def bracket(self) -> float | None:
        """smallest_over / largest: within 1 + PRECISION when the search closed it."""
        return self.smallest_over / self.largest if self.largest and self.smallest_over else None


def verdict(row: dict, case: Case, size: int, budget: float, wall_s: float) -> Cell:
    """A measured row of the case at ``size`` against the budget."""
    status = row.get("status") or "error"
    peak = row.get("peak_mem_bytes")
    footprint = memmodel.input_bytes(case) + peak if peak is not None else None
    median = row.get("median_ms")
    if status != "ok":
        return Cell(size, status, footprint, median, wall_s, False, f"{status}: {row.get('reason') or ''}".strip())
    if footprint is None:
        return Cell(size, status, None, median, wall_s, False, "no peak memory measured")
    if footprint > budget:
        return Cell(size, status, footprint, median, wall_s, False,
                    f"over the budget: {gib(footprint)} of {gib(budget)}")
    return Cell(size, status, footprint, median, wall_s, True)


def gib(x: float) -> str:
    """Bytes in GiB, or MiB below one GiB."""
    return f"{x / 2**30:.3g} GiB" if x >= 2**30 else f"{x / 2**20:.3g} MiB"


def search(variant: str, axis: str, make_case: Callable[[int], Case], measure: Callable[[Case], tuple[dict, float]],
           budget: float, probes, timeout_s: float, precision: float = PRECISION, max_cells: int = MAX_CELLS,
           limit: float | None = None, log: Callable[[str], None] = lambda s: None) -> Result:
    """The frontier of one variant along ``axis``: ``make_case(size)`` is the case at a size,
    ``measure(case)`` runs it in a worker and returns (its row, its wall seconds).  ``limit``:
    the bytes this machine can spare; a cell the model predicts beyond it is not run (on a
    CPU an allocation past the machine's memory takes more than the cell down)."""
    top = MAX_LEN if axis == "n" else MAX_DIM
    res = Result(variant, axis, budget)
    tried: dict[int, Cell] = {}

    def run(size: int) -> Cell:
        case = make_case(size)
        row, wall = measure(case)
        cell = verdict(row, case, size, budget, wall)
        tried[size] = cell
        res.cells.append(cell)
        log(f"{variant} {axis}={size}: {'fits' if cell.fits else 'does not fit'}"
            + (f" ({gib(cell.footprint)})" if cell.footprint is not None else "")
            + (f"; {cell.why}" if cell.why else ""))
        return cell

    for size in sorted(probes):  # small sizes first; the first that does not fit ends them
        if not run(size).fits:
            break
    while True:
        fitted = sorted((c.size, c) for c in tried.values() if c.fits)
        over = sorted(c.size for c in tried.values() if not c.fits)
        lo = fitted[-1][0] if fitted else None
        hi = next((s for s in over if lo is None or s > lo), None)
        res.largest, res.smallest_over = lo, hi
        res.over_why = tried[hi].why if hi else ""
        if lo is None:
            res.stop = f"the smallest probe does not fit ({tried[min(tried)].why})"
            return res
        measured = sorted((c.size, c) for c in tried.values() if c.status == "ok" and c.footprint is not None)
        guess = _prediction(res, measured, axis, make_case, top)
        if res.predicted is None:
            res.predicted = guess
        res.stop = _settled(lo, hi, precision, top, len(tried), max_cells)
        if res.stop:
            return res
        size = _next_size(lo, hi, guess, precision, top, tried)
        last = tried[lo]
        scale = (size / lo) ** (2 if axis == "n" else 1)
        if last.wall_s * scale > timeout_s:
            res.stop = (f"the next cell ({axis}={size}) would take about {last.wall_s * scale:.0f} s, past the "
                        f"timeout of {timeout_s:g} s")
            return res
        need = _predicted_bytes(res.model, make_case, size)
        if need is not None and limit is not None and need > limit:  # it could take the machine down, not one cell
            tried[size] = Cell(size, "skipped", need, None, 0.0, False,
                               f"not run: predicted {gib(need)}, beyond the {gib(limit)} this machine can spare")
            res.cells.append(tried[size])
            log(f"{variant} {axis}={size}: {tried[size].why}")
            continue
        cell = run(size)
        if cell.status == "timeout":
            res.stop = f"{axis}={size} timed out"
            res.largest, res.smallest_over, res.over_why = lo, size, cell.why
            return res


def _settled(lo: int, hi: int | None, precision: float, top: int, tried: int, max_cells: int) -> str:
    """Why the search stops with ``lo`` fitting and ``hi`` not ('' to go on): bracketed within
    the precision, adjacent sizes, the largest size a case takes, or the cells it may run."""
    if hi is not None and (hi <= lo * (1 + precision) or hi == lo + 1):
        return f"bracketed within {100 * precision:g}%" if hi <= lo * (1 + precision) else "adjacent sizes"
    if lo >= top:
        return f"the largest size a case takes ({top})"
    if tried >= max_cells:
        return f"{max_cells} cells"
    return ""


def _predicted_bytes(model, make_case, size: int) -> float | None:
    """The memory model's footprint at ``size``, its inputs included (None without a model)."""
    if not model:
        return None
    a, b, c = model
    return memmodel.input_bytes(make_case(size)) + max(0.0, a * size * size + b * size + c)


def _prediction(res: Result, measured, axis: str, make_case, top: int) -> int | None:
    """The largest size that the memory model of the measured cells (those that fit, and those
    that ran but came out over the budget) predicts fits the budget."""
    sizes = [s for s, _ in measured]
    peaks = [c.footprint - memmodel.input_bytes(make_case(s)) for s, c in measured]
    if len(sizes) < 2:
        return None
    if axis == "n":
        a, b, c = memmodel.fit(sizes, [max(p, 1.0) for p in peaks])
    else:  # peak above the inputs grows with the batch: linear
        a, (b, c) = 0.0, memmodel.fit_line(sizes, [max(p, 1.0) for p in peaks])
    res.model = (a, b, c)

    def footprint(size: int) -> float:
        return memmodel.input_bytes(make_case(size)) + max(0.0, a * size * size + b * size + c)

    return memmodel.largest(footprint, res.budget, top)


def _next_size(lo: int, hi: int | None, guess: int | None, precision: float, top: int, tried: dict) -> int:
    """The model's prediction held inside the bracket with room to shrink it by at least half
    the precision on either side; else the bracket's geometric middle (doubling while there is
    no upper end).  A prediction at or above a size that failed is not used: the model does not
    see what failed there (an out-of-memory below the budget, an error), so bisection does."""
    step = 1 + precision / 2
    floor_ = max(lo + 1, math.ceil(lo * step))
    ceil_ = top if hi is None else min(hi - 1, math.floor(hi / step))
    if guess is not None and floor_ <= ceil_ and (hi is None or guess < hi):
        size = min(max(guess, floor_), ceil_)
        if size not in tried:
            return size
    if hi is None:
        return min(top, 2 * lo)
    mid = int(math.sqrt(lo * hi))
    return min(max(mid, lo + 1), hi - 1)
