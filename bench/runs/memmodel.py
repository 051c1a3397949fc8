"""A memory model per variant, and the largest size that fits a budget.

A call's peak memory above its inputs (``peak_mem_bytes``: the allocator's peak, bench.measure.memory)
is fitted as a·n² + b·n + c over the sweep's self-attention lengths, per variant and everything
else about the case (dtype, mask, direction, heads, head dims, batch).  The fit minimises the
relative residuals, as the 10 % held-out check judges it: each model is fitted again without
its largest n and that peak predicted, and the next doubling (2 x the largest n) is predicted
with that error beside it.  A model whose quadratic term comes out negative is fitted as
b·n + c (memory does not shrink as n grows).

The footprint of a cell is its inputs (q, k, v, and dO for a backward) plus that peak; the
largest n (or batch) whose footprint fits a budget is what ``python -m bench frontier`` starts
its search from.  Plain functions of rows: the reports and the frontier search ask here.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.measure.flops import ELEMENT_BYTES
from bench.model.case import CASE_FIELDS, MAX_LEN, Case
from bench.model.row import current_rows

HELD_OUT_LIMIT = 0.10  # a model is trusted when it predicts its largest measured peak this close
MIN_POINTS = 3  # three coefficients
# what a model is per: every field of the case but its lengths (a new axis is one more group field)
LENGTH_FIELDS = ("q_len", "kv_len", "lengths", "kv_layout", "mix")
GROUP = ("variant", *(f for f in CASE_FIELDS if f not in LENGTH_FIELDS))


def input_bytes(case: Case) -> int:
    """q, k and v (and the output's gradient dO for a backward) as they exist before the call."""
    e = ELEMENT_BYTES[case.dtype]
    q = case.batch * case.heads * case.q_len * case.head_dim
    kv = case.batch * case.kv_heads * case.kv_len * (case.head_dim + case.dv)
    grad = case.batch * case.heads * case.q_len * case.dv if case.needs_grad else 0
    return e * (q + kv + grad)


def _solve(ns: list[float], ys: list[float], degree: int) -> list[float]:
    """Coefficients (highest power first) of the polynomial of ``degree`` that minimises the
    relative residuals sum(((p(n) - y) / y)^2)."""
    import numpy as np

    x = np.array([[n ** k for k in range(degree, -1, -1)] for n in ns], dtype=float)
    y = np.array(ys, dtype=float)
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return [float(c) for c in coef]


def fit_line(ns, peaks) -> tuple[float, float]:
    """(b, c) of b·n + c through the points, by relative residuals (a batch's peak)."""
    b, c = _solve([float(n) for n in ns], [float(p) for p in peaks], 1)
    return b, c


def fit(ns, peaks) -> tuple[float, float, float]:
    """(a, b, c) of a·n² + b·n + c through the points (n, peak bytes); linear when the
    quadratic term would be negative."""
    ns, peaks = [float(n) for n in ns], [float(p) for p in peaks]
    if len(set(ns)) >= MIN_POINTS:
        a, b, c = _solve(ns, peaks, 2)
        if a >= 0:
            return a, b, c
    b, c = _solve(ns, peaks, 1) if len(set(ns)) >= 2 else (0.0, peaks[0])
    return 0.0, b, c


@dataclass(frozen=True)
class MemoryModel:
    key: dict  # the GROUP columns
    a: float
    b: float
    c: float
    ns: tuple  # the lengths it was fitted on
    peaks: tuple  # their measured peaks above the inputs
    held_out_n: int | None = None  # the largest n, predicted from the others
    held_out_err: float | None = None  # |predicted - measured| / measured there

    def predict(self, n: float) -> float:
        return self.a * n * n + self.b * n + self.c

    @property
    def trusted(self) -> bool:
        return self.held_out_err is not None and self.held_out_err <= HELD_OUT_LIMIT

    def next_doubling(self) -> tuple[int, float]:
        n = 2 * max(self.ns)
        return n, self.predict(n)

    def case(self, n: int) -> Case:
        """The case of this model's group at length n (self-attention)."""
        fields = {k: v for k, v in self.key.items() if k != "variant"}
        return Case(**fields, q_len=n, kv_len=n)

    def footprint(self, n: int) -> float:
        return input_bytes(self.case(n)) + max(0.0, self.predict(n))

    def largest_n(self, budget: float) -> int | None:
        """The largest n whose predicted footprint (inputs and peak) fits ``budget``; None
        when not even n = 1 fits."""
        return largest(self.footprint, budget, MAX_LEN)


def largest(footprint, budget: float, top: int) -> int | None:
    """The largest whole size in [1, top] whose ``footprint(size)`` fits ``budget``, by
    bisection (a footprint grows with its size)."""
    if footprint(1) > budget:
        return None
    lo, hi = 1, top
    if footprint(hi) <= budget:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if footprint(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def _usable(r: dict) -> bool:
    return (r.get("status") == "ok" and r.get("q_len") == r.get("kv_len") and (r.get("peak_mem_bytes") or 0) > 0
            and r.get("lengths", "fixed") == "fixed" and r.get("mix", "none") == "none"
            and r.get("kv_layout", "contiguous") == "contiguous")


def models(rows) -> list[MemoryModel]:
    """A model for every group of ok self-attention cells with at least three lengths, each
    checked on its largest length (fitted without it) when it has four or more."""
    groups: dict = {}
    for r in current_rows(rows):
        if _usable(r):
            key = tuple((k, r.get(k)) for k in GROUP)
            groups.setdefault(key, {})[int(r["q_len"])] = float(r["peak_mem_bytes"])
    out = []
    for key, points in groups.items():
        if len(points) < MIN_POINTS:
            continue
        ns = sorted(points)
        peaks = [points[n] for n in ns]
        a, b, c = fit(ns, peaks)
        held_n = held_err = None
        if len(ns) > MIN_POINTS:
            ha, hb, hc = fit(ns[:-1], peaks[:-1])
            held_n = ns[-1]
            held_err = abs(ha * held_n ** 2 + hb * held_n + hc - peaks[-1]) / peaks[-1]
        out.append(MemoryModel(dict(key), a, b, c, tuple(ns), tuple(peaks), held_n, held_err))
    return out


def budget_of(env: dict, reserve: float = 0.1) -> float | None:
    """The memory a run's machine offers a cell: the GPU's memory, or the CPU's, less a
    reserve (for the runtime, the allocator's fragmentation, other processes); None unknown."""
    total = env.get("gpu_memory_bytes") if env.get("device") == "cuda" else env.get("memory_bytes")
    return None if not total else float(total) * (1 - reserve)
