"""What a batch looks like beyond its shape: the lengths of its sequences (``--lengths``) and
the structure of its values (``--inputs``).

**Lengths.** ``fixed`` (the default) is the padded, equal-length batch every case had.  The
others make a *ragged* batch: ``batch`` sequences of different lengths whose mean is exactly
the case's n (``q_len``), drawn from a seeded generator, so that a sweep over n compares
equal numbers of real tokens:

- ``uniform:LO-HI``: uniform whole lengths in [LO, HI] (LO <= n <= HI);
- ``lognormal:SIGMA``: lognormal lengths with that sigma of log-length, scaled to mean n;
- ``bimodal:SHORT/LONG:FRAC``: a share FRAC of short sequences and the rest long, LONG/SHORT
  times as long, scaled to mean n (default ``bimodal`` = ``bimodal:1/8:0.75``);
- ``A/B/C/...``: these lengths exactly; their count is the batch and their mean is n.

A ragged batch is held packed, as the variable-length kernels take it: q, k and v are
(1, heads, batch x n, head_dim), the sequences back to back, and the mask applies within
each sequence (``bench.model.masks`` builds it as a document mask over the packed tokens).

**Inputs.** ``normal`` (the default): i.i.d. standard normal q, k, v, where softmax attention
is nearly uniform and every approximation looks as bad as answering zeros.  ``clustered[:K]``:
the tokens come in K contiguous topics (default 8); queries and keys of a topic share its
centroid, so a query attends sharply to its topic's keys (peaked attention, as in trained
models).  ``lowrank[:R]``: q and k lie in an R-dimensional subspace (default 8), the
low-rank structure linear and Nystrom attention assume.  ``outliers[:SCALE]``: normal
values with a few channels (1 in 16) scaled by SCALE (default 20), the activation outliers
that make bf16 and fp16 lose accuracy.  ``bench.measure.inputs`` generates them.

**KV layout.** ``contiguous`` (the default): k and v are (batch, kv_heads, kv_len, head_dim).
``paged:PAGE``: the cache is a pool of pages of PAGE tokens, (kv_heads, batch x pages, PAGE,
head_dim), heads first so that the pool is one long sequence as a view.  A block table
(batch, pages) names the pool page that holds each of a sequence's pages, shuffled (seeded)
as an allocator that has run a while leaves them; the last page of a sequence is filled only
to kv_len.  ``page_table`` gives the table.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

INPUT_KINDS = {"normal": None, "clustered": 8, "lowrank": 8, "outliers": 20.0}  # kind: default parameter


class WorkloadError(ValueError):
    """A --lengths, --inputs or --kv-layout spelling that is not valid, with what is."""


LENGTHS_VALID = ("fixed, uniform:LO-HI, lognormal:SIGMA, bimodal:SHORT/LONG:FRAC (bimodal alone: 1/8:0.75) "
                 "or an explicit list A/B/C")
INPUTS_VALID = "normal, clustered[:K], lowrank[:R], outliers[:SCALE]"


@dataclass(frozen=True)
class Lengths:
    kind: str  # fixed, uniform, lognormal, bimodal or list
    params: tuple = ()

    @property
    def ragged(self) -> bool:
        return self.kind != "fixed"

    def draw(self, batch: int, n: int, seed: int = 0) -> list[int]:
        """``batch`` whole lengths, each at least 1, summing to exactly ``batch * n``."""
        if self.kind == "fixed":
            return [n] * batch
        if self.kind == "list":
            self.check(batch, n)
            return list(self.params)
        rng = random.Random(f"{self.kind}:{self.params}:{batch}:{n}:{seed}")
        lo, hi = 1, None
        if self.kind == "uniform":
            lo, hi = self.params
            raw = [rng.uniform(lo, hi) for _ in range(batch)]
            shift = n - sum(raw) / batch  # conditioned to average n: shifted, then held in [lo, hi]
            raw = [x + shift for x in raw]
        elif self.kind == "lognormal":
            (sigma,) = self.params
            raw = [math.exp(sigma * rng.gauss(0.0, 1.0)) for _ in range(batch)]
        else:  # bimodal
            short, long, frac = self.params
            n_short = min(batch, max(0, round(frac * batch)))
            raw = [float(short)] * n_short + [float(long)] * (batch - n_short)
            rng.shuffle(raw)
        if self.kind != "uniform":
            scale = batch * n / sum(raw)
            raw = [x * scale for x in raw]
        return _whole(raw, batch * n, lo, hi)

    def check(self, batch: int, n: int) -> None:
        """WorkloadError when this distribution cannot give ``batch`` lengths averaging ``n``."""
        if self.kind == "uniform":
            lo, hi = self.params
            if not lo <= n <= hi:
                raise WorkloadError(f"--lengths uniform:{lo}-{hi} cannot average n={n}: n must lie in [{lo}, {hi}]")
        elif self.kind == "list":
            if len(self.params) != batch:
                raise WorkloadError(f"--lengths {self.text()}: {len(self.params)} lengths, but the batch is {batch}: "
                                    f"give --batch {len(self.params)} (an explicit list is the whole batch)")
            if sum(self.params) != batch * n:
                raise WorkloadError(f"--lengths {self.text()} averages {sum(self.params) / batch:g}, not n={n}: the "
                                    f"lengths of a batch average its n (--seq-lens {sum(self.params) // batch} "
                                    f"if that is a whole number)")

    def text(self) -> str:
        if self.kind == "fixed":
            return "fixed"
        if self.kind == "list":
            return "/".join(map(str, self.params))
        if self.kind == "uniform":
            return f"uniform:{self.params[0]}-{self.params[1]}"
        if self.kind == "lognormal":
            return f"lognormal:{_num(self.params[0])}"
        short, long, frac = self.params
        return f"bimodal:{_num(short)}/{_num(long)}:{_num(frac)}"


def _num(x) -> str:
    return f"{x:g}"


def _whole(raw: list[float], total: int, lo: float, hi: float | None) -> list[int]:
    """Whole numbers near ``raw`` within [lo, hi] (lo >= 1) summing to ``total``: floors, then the
    remainder handed out by largest fractional part, then any excess or shortfall moved one
    token at a time between the sequences that have room."""
    lo = max(1, math.ceil(lo))
    hi = math.floor(hi) if hi is not None else None
    out = [min(max(lo, math.floor(x)), hi if hi is not None else math.inf) for x in raw]
    out = [int(x) for x in out]
    order = sorted(range(len(raw)), key=lambda i: -(raw[i] - math.floor(raw[i])))
    diff = total - sum(out)
    while diff:
        moved = False
        for i in order:
            if diff > 0 and (hi is None or out[i] < hi):
                out[i] += 1
                diff -= 1
                moved = True
            elif diff < 0 and out[i] > lo:
                out[i] -= 1
                diff += 1
                moved = True
            if not diff:
                break
        if not moved:
            raise WorkloadError(f"cannot make {len(raw)} lengths in [{lo}, {hi}] sum to {total}")
    return out


@functools.lru_cache(maxsize=1024)
def draw_lengths(text: str, batch: int, n: int) -> tuple[int, ...]:
    """The lengths of a case's batch, drawn once per (spelling, batch, n): every caller (the
    mask, the counts, the row, the variants) asks for the same batch."""
    return tuple(parse_lengths(text).draw(batch, n))


def parse_lengths(text: str) -> Lengths:
    t = str(text).strip()
    name, _, rest = t.partition(":")
    try:
        if t == "fixed":
            return Lengths("fixed")
        if name == "uniform":
            lo, sep, hi = rest.partition("-")
            lo, hi = int(lo), int(hi)
            if not sep or lo < 1 or hi < lo:
                raise ValueError
            return Lengths("uniform", (lo, hi))
        if name == "lognormal":
            sigma = float(rest)
            if not (0 < sigma <= 4):
                raise ValueError
            return Lengths("lognormal", (sigma,))
        if name == "bimodal":
            if not rest:
                return Lengths("bimodal", (1.0, 8.0, 0.75))
            sizes, _, frac = rest.partition(":")
            short, _, long = sizes.partition("/")
            short, long, frac = float(short), float(long), float(frac or 0.75)
            if not (0 < short <= long and 0 < frac < 1):
                raise ValueError
            return Lengths("bimodal", (short, long, frac))
        if "/" in t or t.isdigit():
            values = tuple(int(x) for x in t.split("/"))
            if any(v < 1 for v in values):
                raise ValueError
            return Lengths("list", values)
    except ValueError:
        pass
    raise WorkloadError(f"--lengths {t!r} is not valid; valid: {LENGTHS_VALID}")


@dataclass(frozen=True)
class Inputs:
    kind: str
    param: float | int | None = None

    def text(self) -> str:
        if self.param is None or self.param == INPUT_KINDS[self.kind]:
            return self.kind
        return f"{self.kind}:{_num(self.param)}"


def parse_inputs(text: str) -> Inputs:
    t = str(text).strip()
    name, sep, raw = t.partition(":")
    if name not in INPUT_KINDS:
        raise WorkloadError(f"unknown --inputs {t!r}; valid: {INPUTS_VALID}")
    default = INPUT_KINDS[name]
    if not sep:
        return Inputs(name, default)
    try:
        if default is None:
            raise ValueError
        value = type(default)(raw)
        if value <= 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError
    except ValueError:
        raise WorkloadError(f"--inputs {t!r} is not valid; valid: {INPUTS_VALID} (K and R positive whole "
                            f"numbers, SCALE a positive number)") from None
    return Inputs(name, value)


def canonical_lengths(text: str) -> str:
    return parse_lengths(text).text()


def canonical_inputs(text: str) -> str:
    return parse_inputs(text).text()


KV_LAYOUTS_VALID = "contiguous, or paged:PAGE (PAGE tokens a page, a whole number >= 1)"


def parse_kv_layout(text: str) -> int | None:
    """The page size of a --kv-layout spelling, None for contiguous."""
    t = str(text).strip()
    if t == "contiguous":
        return None
    name, _, raw = t.partition(":")
    if name == "paged" and raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise WorkloadError(f"--kv-layout {t!r} is not valid; valid: {KV_LAYOUTS_VALID}")


def canonical_kv_layout(text: str) -> str:
    page = parse_kv_layout(text)
    return "contiguous" if page is None else f"paged:{page}"


def page_table(batch: int, kv_len: int, page: int, seed: int = 0) -> list[list[int]]:
    """The block table: for each sequence, the pool page of each of its ceil(kv_len / page)
    pages; every pool page used once, in a seeded shuffled order."""
    pages = -(-kv_len // page)
    order = list(range(batch * pages))
    random.Random(f"pages:{batch}:{kv_len}:{page}:{seed}").shuffle(order)
    return [order[b * pages:(b + 1) * pages] for b in range(batch)]
