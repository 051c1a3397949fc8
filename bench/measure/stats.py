"""Statistics derived from raw timing samples (milliseconds): a row stores its samples, and its
median, spread, interval and rates are computed from them here (``row_figures``), by the worker
and by every reader alike.  Torch-free, so that reading rows never imports it."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

NOISY_IQR_RATIO = 0.10  # IQR / median above this marks a measurement as noisy


def quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, torch.quantile's too)."""
    if not sorted_xs:
        raise ValueError("quantile of no samples")
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Stats:
    count: int
    median: float
    q1: float
    q3: float
    iqr: float
    min: float
    max: float
    mean: float
    std: float

    @classmethod
    def of(cls, samples) -> Stats:
        xs = sorted(float(x) for x in samples)
        n = len(xs)
        if n == 0:
            raise ValueError("no samples")
        mean = sum(xs) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
        q1, q3 = quantile(xs, 0.25), quantile(xs, 0.75)
        return cls(count=n, median=quantile(xs, 0.5), q1=q1, q3=q3, iqr=q3 - q1, min=xs[0],
                   max=xs[-1], mean=mean, std=std)

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median > 0 else float("inf")

    @property
    def noisy(self) -> bool:
        return self.rel_iqr > NOISY_IQR_RATIO

    def to_dict(self) -> dict:
        return asdict(self) | {"rel_iqr": self.rel_iqr, "noisy": self.noisy}


# -- the median's interval ---------------------------------------------------------------------------

CONFIDENCE = 0.95
NOISY_CI = 0.05  # a median whose 95% CI reaches beyond +-5% of it is flagged noisy


@functools.lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) such that [x_(lo), x_(hi)] of n sorted samples covers the
    median with probability >= ``confidence`` (exact, from Binomial(n, 1/2) below 200
    samples; normal approximation above).  None when n is too small (n < 6 at 95%)."""
    if n < 1:
        return None
    if n > 200:
        half = 0.5 * 1.959963984540054 * math.sqrt(n)
        r = max(1, math.floor(n / 2 - half))  # 1-based lower rank
        return r - 1, n - r
    total = 2**n
    best = None
    below = 0  # sum of C(n, i) for i < r
    for r in range(1, n // 2 + 1):  # interval [x_(r), x_(n+1-r)], 1-based
        below += math.comb(n, r - 1)
        if 1 - 2 * below / total >= confidence:
            best = r
        else:
            break
    return None if best is None else (best - 1, n - best)


def minmax_confidence(n: int) -> float:
    """The confidence that the min and max of ``n`` samples hold the median between them:
    1 - 2 x 2^-n (3 samples: 75%; 6 are needed for 95%, where ``median_ci`` takes over)."""
    return 0.0 if n < 2 else 1.0 - 2.0 * 0.5 ** n


def median_ci(samples) -> tuple[float, float] | None:
    xs = sorted(samples)
    ranks = median_ci_ranks(len(xs))
    return None if ranks is None else (xs[ranks[0]], xs[ranks[1]])


def ci_halfwidth(samples, presorted: bool = False) -> float:
    """The larger distance from the median to an end of its 95% CI, relative to the median
    (inf when there are too few samples for one)."""
    xs = samples if presorted else sorted(samples)
    ranks = median_ci_ranks(len(xs))
    if ranks is None:
        return math.inf
    med = quantile(xs, 0.5)
    return max(med - xs[ranks[0]], xs[ranks[1]] - med) / med if med > 0 else math.inf


# -- a row's figures ----------------------------------------------------------------------------------

def sample_figures(samples_ms) -> dict:
    """What a cell's samples say: their median, spread and mean, how precise the median is (its
    95% interval, or with too few samples for one, the confidence their min-max gives).  The
    one place these are computed: the worker's summary and the reading of a stored row
    (``row_figures``) both take them from here, so a row read back has the figures its worker had."""
    xs = sorted(float(x) for x in samples_ms)  # once: the statistics below sort what is sorted already
    s = Stats.of(xs)
    ci = median_ci(xs)
    halfwidth = ci_halfwidth(xs, presorted=True)
    few = not math.isfinite(halfwidth)  # no 95% interval exists: its precision is unknown, not wide
    return dict(median_ms=s.median, iqr_ms=s.iqr, min_ms=s.min, mean_ms=s.mean, q1_ms=s.q1, q3_ms=s.q3,
                samples=s.count, rel_iqr=s.rel_iqr, ci_halfwidth=None if few else halfwidth,
                noisy=not few and halfwidth > NOISY_CI, few_samples=few,
                median_confidence=CONFIDENCE if not few else minmax_confidence(s.count),
                ci_lo_ms=ci[0] if ci else None, ci_hi_ms=ci[1] if ci else None)


def rates(row: dict) -> dict:
    """An ok row's rates at its median: TFLOP/s (not for an approximation, which does not do
    exact attention's FLOPs) and GB/s (where its traffic is modelled; a layer's is not)."""
    if row.get("status") != "ok" or not row.get("median_ms"):
        return {}
    seconds = row["median_ms"] * 1e-3
    out = {}
    if not row.get("approximate") and row.get("flops") is not None:
        out["tflops"] = row["flops"] / seconds / 1e12
    if row.get("bytes") is not None:
        out["gbps"] = row["bytes"] / seconds / 1e9
    return out


def row_figures(row: dict) -> dict:
    """The figures a stored row's measurements give (``bench.model.row.DERIVED``): its samples'
    (``sample_figures``), its number of rounds and its rates; none without samples."""
    samples = [x for x in row.get("samples_ms") or () if isinstance(x, (int, float)) and math.isfinite(x)]
    if not samples:  # (a non-finite sample is stored as null)
        return {}
    out = sample_figures(samples) | {"rounds": len(row.get("round_medians_ms") or ())}
    return out | rates(row | out) | rank_figures(row, out["median_ms"])


def rank_figures(row: dict, median_ms: float) -> dict:
    """A cell of several ranks (``rank_samples_ms``: each rank's step times; ``rank_comm_ms``: its
    time in collectives, sample by sample): each rank's median; the communication time of the
    slowest rank at each step, its median, and its share of the step (``median_ms``, the slowest
    rank's); how long the fastest rank waits for the slowest (the step's median less the fastest
    rank's); the most bytes one rank sent per step; the most time one rank spent inside collectives
    in its profiled step (``rank_collective_ms``), and the share of the ranks' time inside them that
    the same step did not wait for (``rank_collective_wait_ms``; ``comm_hidden``: the communication
    the compute hid).  None without rank samples."""
    per_rank = [[x for x in r if isinstance(x, (int, float)) and math.isfinite(x)]
                for r in row.get("rank_samples_ms") or ()]
    if not per_rank or not all(per_rank):
        return {}
    medians = [quantile(sorted(r), 0.5) for r in per_rank]
    out = {"rank_median_ms": medians, "wait_ms": max(0.0, median_ms - min(medians))}
    comm = row.get("rank_comm_ms") or ()
    if len(comm) == len(per_rank) and all(len(c) == len(r) for c, r in zip(comm, row["rank_samples_ms"])):
        slowest = [max(range(len(per_rank)), key=lambda j: row["rank_samples_ms"][j][i])
                   for i in range(len(row["rank_samples_ms"][0]))]
        at_slowest = sorted(float(comm[j][i]) for i, j in enumerate(slowest))
        out["comm_ms"] = quantile(at_slowest, 0.5)
        out["comm_share"] = out["comm_ms"] / median_ms if median_ms > 0 else None
    sent = [b for b in row.get("rank_bytes_sent") or () if isinstance(b, (int, float))]
    if sent:
        out["bytes_sent"] = max(sent)
    pairs = [(c, w) for c, w in zip(row.get("rank_collective_ms") or (), row.get("rank_collective_wait_ms") or ())
             if isinstance(c, (int, float)) and math.isfinite(c)]
    if pairs:
        out["collective_ms"] = max(c for c, _ in pairs)
        waited = [w for _, w in pairs if isinstance(w, (int, float)) and math.isfinite(w)]
        inside = sum(c for c, _ in pairs)
        if inside > 0 and len(waited) == len(pairs):
            out["comm_hidden"] = min(1.0, max(0.0, 1.0 - sum(waited) / inside))
    return out


# -- two measurements of one cell: the ratio of their medians --------------------------------------


@dataclass(frozen=True)
class Evidence:
    """B/A of one cell: the ratio, its 95% interval, and the one-sided p-values that B is slower
    than A by more than a margin (and faster by more than it)."""
    ratio: float
    lo: float
    hi: float
    p_slower: float
    p_faster: float

    @property
    def p(self) -> float:
        """The two-sided p-value of a change beyond the margin, either way."""
        return min(1.0, 2.0 * min(self.p_slower, self.p_faster))


@dataclass(frozen=True)
class RatioEvidence(Evidence):
    """Two sets of samples of one cell: the ratio of the medians and its bootstrap interval."""
    n_a: int
    n_b: int


def ratio_evidence(a, b, margin: float = 0.0, draws: int = 2000, seed: int = 0) -> RatioEvidence:
    """Percentile bootstrap of median(B) / median(A): each side resampled with replacement, its own
    size, ``draws`` times (seeded: the same samples give the same evidence).  A change beyond the
    ``margin`` (a fraction) is what the p-values test: H0 ratio <= 1 + margin for slower, ratio >=
    1 / (1 + margin) for faster, with the +1 correction of a Monte Carlo p-value."""
    import numpy as np

    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    ma = np.median(xa[rng.integers(0, len(xa), (draws, len(xa)))], axis=1)
    mb = np.median(xb[rng.integers(0, len(xb), (draws, len(xb)))], axis=1)
    r = mb / ma
    lo, hi = np.quantile(r, [0.025, 0.975])
    p_slower = (np.count_nonzero(r <= 1.0 + margin) + 1) / (draws + 1)
    p_faster = (np.count_nonzero(r >= 1.0 / (1.0 + margin)) + 1) / (draws + 1)
    return RatioEvidence(float(np.median(xb) / np.median(xa)), float(lo), float(hi), float(p_slower),
                         float(p_faster), len(xa), len(xb))


def benjamini_hochberg(pvalues, q: float = 0.05) -> tuple[list[bool], list[float]]:
    """The Benjamini-Hochberg procedure at false-discovery rate ``q``: which hypotheses are
    rejected, and each one's adjusted p-value (its q-value)."""
    m = len(pvalues)
    if not m:
        return [], []
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 1.0
    for rank in range(m, 0, -1):  # from the largest p down: q_(k) = min(q_(k+1), p_(k) m / k)
        i = order[rank - 1]
        running = min(running, pvalues[i] * m / rank)
        adjusted[i] = running
    return [a <= q for a in adjusted], adjusted


# -- two builds taking turns: paired per-repeat ratios --------------------------------------------


def t_cdf(t: float, dof: int) -> float:
    """Student's t distribution's CDF at ``t`` for a whole number of degrees of freedom
    (Abramowitz & Stegun 26.7.3 and 26.7.4: a finite series in cos(theta), exact, no SciPy)."""
    if dof < 1:
        raise ValueError("t_cdf needs dof >= 1")
    if not math.isfinite(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(abs(t) / math.sqrt(dof))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if dof == 1:
        a = 2 * theta / math.pi
    elif dof % 2:  # odd
        term, total = 1.0, 1.0
        for k in range(1, (dof - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        a = 2 / math.pi * (theta + s * math.cos(theta) * total)
    else:
        term, total = 1.0, 1.0
        for k in range(1, (dof - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = s * total
    return 0.5 + 0.5 * a if t >= 0 else 0.5 - 0.5 * a


@functools.lru_cache(maxsize=1024)  # a run's intervals ask for the same few (p, dof)
def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t (bisection on t_cdf)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, dof) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class PairedEvidence(Evidence):
    """One cell over K repeats, each a pair of runs taken in turn: the geometric mean of the
    per-repeat ratios and its 95% t interval."""
    repeats: int


def paired_evidence(a, b, margin: float = 0.0) -> PairedEvidence:
    """Per repeat k, log(b_k / a_k); their mean, its standard error over the repeats (the unit that
    varies: each repeat is a fresh pair of processes, minutes from the others), a t test against
    +-log(1 + margin).  Fewer than 2 repeats: no interval, p = 1."""
    logs = [math.log(y / x) for x, y in zip(a, b) if x > 0 and y > 0]
    k = len(logs)
    if k < 2:
        r = math.exp(logs[0]) if logs else math.nan
        return PairedEvidence(r, -math.inf, math.inf, 1.0, 1.0, k)
    mean = sum(logs) / k
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (k - 1))
    se = max(sd / math.sqrt(k), 1e-12)
    q = t_quantile(0.975, k - 1)
    m = math.log1p(margin)
    p_slower = 1.0 - t_cdf((mean - m) / se, k - 1)
    p_faster = t_cdf((mean + m) / se, k - 1)
    return PairedEvidence(math.exp(mean), math.exp(mean - q * se), math.exp(mean + q * se), p_slower, p_faster, k)


# -- two runs, each with several visits to a cell: their visits' figures --------------------------


@dataclass(frozen=True)
class VisitEvidence(Evidence):
    """One cell in two runs, each visited several times in fresh processes (``--visits``): the
    ratio of the visits' geometric means and its Welch t interval."""
    n_a: int
    n_b: int


def visit_evidence(a, b, margin: float = 0.0) -> VisitEvidence:
    """log B - log A from each run's visit figures (the unit that varies between runs: a process),
    with the standard error of the two means and Welch-Satterthwaite degrees of freedom; a t test
    against +-log(1 + margin).  Fewer than 2 visits on a side: no interval, p = 1."""
    la, lb = [math.log(x) for x in a if x > 0], [math.log(x) for x in b if x > 0]
    if len(la) < 2 or len(lb) < 2:
        r = math.exp(sum(lb) / len(lb) - sum(la) / len(la)) if la and lb else math.nan
        return VisitEvidence(r, -math.inf, math.inf, 1.0, 1.0, len(la), len(lb))

    def mean_var(xs):
        mu = sum(xs) / len(xs)
        return mu, sum((x - mu) ** 2 for x in xs) / (len(xs) - 1) / len(xs)

    (ma, va), (mb, vb) = mean_var(la), mean_var(lb)
    se = max(math.sqrt(va + vb), 1e-12)
    dof = max(1, round((va + vb) ** 2 / (va ** 2 / (len(la) - 1) + vb ** 2 / (len(lb) - 1)))) \
        if va + vb > 0 else len(la) + len(lb) - 2
    d, q, m = mb - ma, t_quantile(0.975, dof), math.log1p(margin)
    return VisitEvidence(math.exp(d), math.exp(d - q * se), math.exp(d + q * se), 1.0 - t_cdf((d - m) / se, dof),
                         t_cdf((d + m) / se, dof), len(la), len(lb))
