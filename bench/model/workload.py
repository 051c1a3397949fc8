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
import re
from dataclasses import dataclass

from bench.model import digits

INPUT_KINDS = {"normal": None, "clustered": 8, "lowrank": 8, "outliers": 20.0}  # kind: default parameter

MAX_TOKENS = 1 << 24  # a length, a page: as bench.model.case.MAX_LEN
MAX_SIGMA = 4.0  # lognormal: a sigma of log-length of 4 already spans e^8 ~ 3000x between typical lengths
MAX_RATIO = 1e6  # bimodal: SHORT and LONG, relative sizes
MAX_TOPICS = MAX_TOKENS  # clustered:K (and K <= the case's keys)
MAX_RANK = 1 << 16  # lowrank:R (and R <= the case's head_dim), as bench.model.case.MAX_DIM
MAX_SCALE = 1e4  # outliers:SCALE: scores reach about SCALE^2 / 4, finite and far from float32's range
MIN_SCALE = 1.0  # outliers:SCALE scales a few channels up: below 1 they are no outliers (and 1e-300 underflows)
# the largest finite value of each dtype: an outlier channel's values, up to ~8 x SCALE, must fit
DTYPE_MAX = {"float32": 3.4028e38, "bfloat16": 3.3895e38, "float16": 65504.0, "float8_e4m3fn": 448.0}


class WorkloadError(ValueError):
    """A --lengths, --inputs or --kv-layout spelling that is not valid, with what is.  ``field``
    names the setting (lengths, inputs or kv_layout)."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


LENGTHS_VALID = (f"fixed, uniform:LO-HI (whole numbers, 1 <= LO < HI <= {MAX_TOKENS}), lognormal:SIGMA "
                 f"(0 < SIGMA <= {MAX_SIGMA:g}), bimodal:SHORT/LONG:FRAC (0 < SHORT < LONG <= {MAX_RATIO:g}, "
                 f"0 < FRAC < 1; bimodal alone: 1/8:0.75) or an explicit list A/B/C (whole numbers from 1 to "
                 f"{MAX_TOKENS})")
INPUTS_VALID = (f"normal, clustered[:K] (1 <= K <= the keys), lowrank[:R] (1 <= R <= head_dim), outliers[:SCALE] "
                f"({MIN_SCALE:g} <= SCALE <= {MAX_SCALE:g})")


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
        else:  # bimodal: at least one sequence of each kind, so that the batch is bimodal
            short, long, frac = self.params
            n_short = min(batch - 1, max(1, round(frac * batch)))
            raw = [float(short)] * n_short + [float(long)] * (batch - n_short)
            rng.shuffle(raw)
        if self.kind != "uniform":
            scale = batch * n / sum(raw)
            raw = [x * scale for x in raw]
        return _whole(raw, batch * n, lo, hi)

    def check(self, batch: int, n: int) -> None:
        """WorkloadError when this distribution cannot give ``batch`` lengths averaging ``n``, or
        gives a batch that is not ragged (a row labelled ragged is ragged)."""
        if self.ragged and batch < 2:
            raise WorkloadError(f"--lengths {self.text()}: a ragged batch needs --batch 2 or more (batch {batch} is "
                                f"one sequence)", "lengths")
        if self.kind == "uniform":
            lo, hi = self.params
            if not lo <= n <= hi:
                raise WorkloadError(f"--lengths uniform:{lo}-{hi} cannot average n={n}: n must lie in [{lo}, {hi}]",
                                    "lengths")
        elif self.kind == "list":
            if len(self.params) != batch:
                raise WorkloadError(f"--lengths {self.text()}: {len(self.params)} lengths, but the batch is {batch}: "
                                    f"give --batch {len(self.params)} (an explicit list is the whole batch)", "lengths")
            if sum(self.params) != batch * n:
                raise WorkloadError(f"--lengths {self.text()} averages {sum(self.params) / batch:g}, not n={n}: the "
                                    f"lengths of a batch average its n (--seq-lens {sum(self.params) // batch} "
                                    f"if that is a whole number)", "lengths")
        if self.ragged:
            drawn = self.params if self.kind == "list" else draw_lengths(self.text(), batch, n)
            if len(set(drawn)) == 1:
                raise WorkloadError(f"--lengths {self.text()} at batch {batch} and n={n} draws {batch} equal lengths "
                                    f"({drawn[0]}): that is the fixed batch, not a ragged one (--lengths fixed, or a "
                                    f"wider spread)", "lengths")

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
            raise WorkloadError(f"cannot make {len(raw)} lengths in [{lo}, {hi}] sum to {total}", "lengths")
    return out


@functools.lru_cache(maxsize=1024)
def draw_lengths(text: str, batch: int, n: int) -> tuple[int, ...]:
    """The lengths of a case's batch, drawn once per (spelling, batch, n): every caller (the
    mask, the counts, the row, the variants) asks for the same batch."""
    return tuple(parse_lengths(text).draw(batch, n))


def free_lengths(text: str, batch: int, n: int, seed: int) -> list[int]:
    """A new batch from a ragged distribution whose mean is n in expectation, not held to it (a
    loader's next batch: its number of tokens varies), its total a multiple of the batch so that
    its mean is whole; an explicit list, shuffled."""
    d = parse_lengths(text)
    rng = random.Random(f"free:{text}:{batch}:{n}:{seed}")
    if d.kind == "list":
        out = list(d.params)
        rng.shuffle(out)
        return out
    if d.kind == "uniform":
        lo, hi = d.params
        out = [rng.randint(lo, hi) for _ in range(batch)]
    elif d.kind == "lognormal":
        (sigma,) = d.params
        out = [max(1, round(n * math.exp(sigma * rng.gauss(0.0, 1.0) - sigma * sigma / 2))) for _ in range(batch)]
    elif d.kind == "bimodal":
        short, long, frac = d.params
        unit = n / (frac * short + (1 - frac) * long)
        out = [max(1, round((short if rng.random() < frac else long) * unit)) for _ in range(batch)]
    else:
        return [n] * batch
    out[out.index(max(out))] += (-sum(out)) % batch  # a whole mean
    if len(set(out)) == 1:  # a ragged batch stays ragged
        out[0] += batch
    return out


def parse_lengths(text: str) -> Lengths:
    t = str(text).strip()
    name, _, rest = t.partition(":")
    try:
        if not t.isascii():  # float() and int() take other scripts' digits: ASCII digits only
            raise ValueError
        if t == "fixed":
            return Lengths("fixed")
        if name == "uniform":
            lo, sep, hi = rest.partition("-")
            lo, hi = int(lo), int(hi)
            if not sep or lo < 1 or hi <= lo or hi > MAX_TOKENS:
                raise ValueError
            return Lengths("uniform", (lo, hi))
        if name == "lognormal":
            sigma = float(rest)
            if not (0 < sigma <= MAX_SIGMA):
                raise ValueError
            return Lengths("lognormal", (sigma,))
        if name == "bimodal":
            if not rest:
                return Lengths("bimodal", (1.0, 8.0, 0.75))
            sizes, _, frac = rest.partition(":")
            short, _, long = sizes.partition("/")
            short, long, frac = float(short), float(long), float(frac or 0.75)
            if not (0 < short < long <= MAX_RATIO and 0 < frac < 1):
                raise ValueError
            return Lengths("bimodal", (short, long, frac))
        if "/" in t or digits.is_digits(t):
            if not all(digits.is_digits(x) for x in t.split("/")):
                raise ValueError
            values = tuple(int(x) for x in t.split("/"))
            if any(not 1 <= v <= MAX_TOKENS for v in values):
                raise ValueError
            return Lengths("list", values)
    except ValueError:
        pass
    raise WorkloadError(f"--lengths {t!r} is not valid; valid: {LENGTHS_VALID}", "lengths")


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
        raise WorkloadError(f"unknown --inputs {t!r}; valid: {INPUTS_VALID}", "inputs")
    default = INPUT_KINDS[name]
    if not sep:
        return Inputs(name, default)
    top = {"clustered": MAX_TOPICS, "lowrank": MAX_RANK, "outliers": MAX_SCALE}.get(name)
    low = MIN_SCALE if name == "outliers" else 1  # a scale below 1 shrinks the channels (1e-300 is zero in float32)
    try:
        if default is None or not (digits.is_number(raw) if isinstance(default, float) else digits.is_digits(raw)):
            raise ValueError
        value = type(default)(raw)
        if not low <= value <= top:  # also refuses nan
            raise ValueError
    except ValueError:
        raise WorkloadError(f"--inputs {t!r} is not valid; valid: {INPUTS_VALID} (K and R whole numbers)",
                            "inputs") from None
    return Inputs(name, value)


def check_inputs(text: str, dtype: str, keys: int, head_dim: int) -> None:
    """WorkloadError when an input kind's parameter does not fit the case it is drawn for
    (``keys``: the keys of the tensors, every sequence of a ragged batch).  The parameter a row
    records is the one its inputs were drawn with: nothing is clamped."""
    kind = parse_inputs(text)
    if kind.kind == "clustered" and kind.param > keys:
        raise WorkloadError(f"--inputs {text}: {kind.param} topics need at least as many keys, and the case has "
                            f"{keys}: K <= {keys} here", "inputs")
    if kind.kind == "lowrank" and kind.param > head_dim:
        raise WorkloadError(f"--inputs {text}: a rank-{kind.param} subspace needs head_dim >= {kind.param}, and the "
                            f"case has head_dim {head_dim}: R <= {head_dim} here", "inputs")
    if kind.kind == "outliers" and 8 * kind.param > DTYPE_MAX.get(dtype, math.inf):
        top = DTYPE_MAX[dtype] / 8
        raise WorkloadError(f"--inputs {text}: outlier values reach about 8 x SCALE = {8 * kind.param:g}, beyond "
                            f"{dtype}'s largest value {DTYPE_MAX[dtype]:g}: SCALE <= {top:g} for {dtype}", "inputs")


def canonical_lengths(text: str) -> str:
    return parse_lengths(text).text()


def canonical_inputs(text: str) -> str:
    return parse_inputs(text).text()


KV_LAYOUTS_VALID = ("contiguous, or paged:PAGE (PAGE tokens a page, a whole number from 1 to the cache's length, "
                    f"at most {MAX_TOKENS})")


def parse_kv_layout(text: str) -> int | None:
    """The page size of a --kv-layout spelling, None for contiguous."""
    t = str(text).strip()
    if t == "contiguous":
        return None
    name, _, raw = t.partition(":")
    if name == "paged" and digits.is_digits(raw) and 1 <= int(raw) <= MAX_TOKENS:
        return int(raw)
    raise WorkloadError(f"--kv-layout {t!r} is not valid; valid: {KV_LAYOUTS_VALID}", "kv_layout")


def check_kv_layout(text: str, kv_len: int) -> None:
    """WorkloadError for a page longer than the whole cache (one page per sequence, mostly empty:
    not a paged cache)."""
    page = parse_kv_layout(text)
    if page is not None and page > kv_len:
        raise WorkloadError(f"--kv-layout {text}: a page of {page} tokens is longer than the cache ({kv_len} "
                            f"keys): PAGE <= {kv_len} here", "kv_layout")


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


# -- mixed batches: prefill, chunked prefill and decode in one varlen call ----------------------

MAX_MIX_TEXT = 16384  # characters of a --batch-mix spelling (a trace's batch of many decode sequences is long)
MAX_MIX_SEQUENCES = 4096  # sequences in one mix
PHASES = ("prefill", "chunked_prefill", "decode")
MIX_VALID = ("terms joined by '+' in ASCII digits, each COUNTx(Q/KV): COUNT sequences of Q new query tokens "
             "against KV keys "
             "(their cache and themselves, so 1 <= Q <= KV), e.g. 2x(512/512)+1x(128/4096)+8x(1/2048); "
             "'COUNTx' may be left out (one sequence) and Q alone is a prefill, Q/Q; at most "
             f"{MAX_MIX_SEQUENCES} sequences, {MAX_TOKENS} query or key tokens in all and {MAX_MIX_TEXT} "
             "characters")


@dataclass(frozen=True)
class Mix:
    """A serving batch: runs of (count, q_len, kv_len), in packing order.  Within each sequence
    the queries are its last q_len tokens (bottom-right): a prefill has q == kv, a chunked
    prefill continues against its cache (1 < q < kv), a decode step has q == 1."""
    runs: tuple  # ((count, q, kv), ...)

    def text(self) -> str:
        return "+".join(f"{n}x({q}/{kv})" for n, q, kv in self.runs)

    def segments(self) -> list[tuple[int, int]]:
        """(q_len, kv_len) of each sequence, in packing order."""
        return [(q, kv) for n, q, kv in self.runs for _ in range(n)]

    @property
    def sequences(self) -> int:
        return sum(n for n, _, _ in self.runs)

    @property
    def q_tokens(self) -> int:
        return sum(n * q for n, q, _ in self.runs)

    @property
    def kv_tokens(self) -> int:
        return sum(n * kv for n, _, kv in self.runs)

    def flat(self) -> tuple[int, ...]:
        """count/q/kv of every run, flat: the varlen mask's ``runs`` parameter."""
        return tuple(x for run in self.runs for x in run)


def phase(q: int, kv: int) -> str:
    """prefill (q == kv: the whole prompt), decode (one new token against a cache), or
    chunked_prefill (a chunk of a prompt, or draft tokens, against a cache)."""
    if q == kv:
        return "prefill"
    return "decode" if q == 1 else "chunked_prefill"


# vLLM's batch spec (benchmarks/attention_benchmarks): terms joined by '_', each [COUNT]q<Q>[k][s|kv<KV>[k]], a
# trailing k multiplying by 1024, KV (the sequence's keys) = Q when left out: 2q2k_32q1s1k is 2x(2048/2048)+32x(1/1024)
VLLM_TERM = re.compile(r"^(\d*)q(\d+)(k?)(?:(?:s|kv)(\d+)(k?))?$")
VLLM_VALID = "or vLLM's batch spec: terms [COUNT]q<Q>[k][s<KV>[k]] joined by '_' (k = x1024), e.g. 2q2k_32q1s1k"


def from_vllm(text: str) -> str | None:
    """vLLM's batch spec as a --batch-mix spelling (None when ``text`` is not one)."""
    t = str(text).strip().lower()
    if "q" not in t or any(c in t for c in "()x+/"):
        return None
    terms = []
    for term in t.split("_"):
        m = VLLM_TERM.match(term)
        if not m or not digits.is_digits(m.group(2)) or (m.group(4) and not digits.is_digits(m.group(4))):
            raise WorkloadError(f"--batch-mix {t!r}: {term!r} is not a vLLM batch-spec term; valid: {MIX_VALID}, "
                                f"{VLLM_VALID}", "mix")
        count = m.group(1) or "1"
        q = int(m.group(2)) * (1024 if m.group(3) else 1)
        kv = int(m.group(4)) * (1024 if m.group(5) else 1) if m.group(4) else q
        if q > kv:
            raise WorkloadError(f"--batch-mix {t!r}: {term!r} is {q} query tokens against {kv} keys; a sequence's keys "
                                f"are its cache and its new tokens, so Q <= KV ({VLLM_VALID})", "mix")
        terms.append(f"{count}x({q}/{kv})")
    return "+".join(terms)


def parse_mix(text: str) -> Mix:
    vllm = from_vllm(text)
    if vllm is not None:
        return parse_mix(vllm)
    t = "".join(str(text).split())
    bad = WorkloadError(f"--batch-mix {str(text).strip()!r} is not valid; valid: {MIX_VALID}, {VLLM_VALID}", "mix")
    if not t or len(t) > MAX_MIX_TEXT:
        raise bad
    runs = []
    for term in t.split("+"):
        count, sep, shape = term.lower().partition("x")
        if not sep:
            count, shape = "1", term
        if shape.startswith("(") and shape.endswith(")"):
            shape = shape[1:-1]
        q, slash, kv = shape.partition("/")
        if slash and not kv:  # 4/ is no shape: Q alone (a prefill) is written without the slash
            raise bad
        kv = kv or q
        if not (digits.is_digits(count) and digits.is_digits(q) and digits.is_digits(kv)):
            raise bad
        run = (int(count), int(q), int(kv))
        if min(run) < 1:
            raise bad
        if run[1] > run[2]:
            raise WorkloadError(f"--batch-mix {term}: {run[1]} query tokens against {run[2]} keys; the keys of a "
                                f"sequence are its cache and its new tokens, so Q <= KV ({MIX_VALID})", "mix")
        if runs and runs[-1][1:] == run[1:]:  # 1x(4/8)+1x(4/8) is 2x(4/8): one batch, one spelling, one cell
            runs[-1] = (runs[-1][0] + run[0], *run[1:])
        else:
            runs.append(run)
    mix = Mix(tuple(runs))
    if mix.sequences > MAX_MIX_SEQUENCES or max(mix.q_tokens, mix.kv_tokens) > MAX_TOKENS:
        raise bad
    return mix


def canonical_mix(text: str) -> str:
    return parse_mix(text).text()
