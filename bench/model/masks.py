"""Masks and score modifications, each defined once as a predicate.

A **mask** is FlexAttention's ``mask_mod``: ``fn(b, h, q_idx, kv_idx, **params) -> bool``,
true where query ``q_idx`` of batch element ``b``, head ``h``, sees key ``kv_idx``.  A
**score mod** is ``fn(score, b, h, q_idx, kv_idx, **params) -> score``, applied to the scaled
scores ``q.k / sqrt(d)`` before the mask and the softmax.  Register one with a decorator::

    from bench.model.masks import mask

    @mask("checkerboard", params={"cell": 64}, description="query and key cells of the same colour")
    def checkerboard(b, h, q_idx, kv_idx, cell):
        return (q_idx // cell + kv_idx // cell) % 2 == 0

Everything else is derived from that one definition: the dense keep mask (built query block
by query block for large n), FlexAttention's mask_mod and block mask, the float64
reference, the exact number of kept (query, key) pairs and so the FLOPs and the density.
A mask may also give ``intervals=fn(q_idx, case, **params) -> [(lo, hi), ...]``, the key
ranges each query row keeps: then the pairs are counted in O(n) memory and time per row
block instead of by evaluating the predicate on every pair (how the built-ins count at 128k).

Indices share one position space, aligned top-left: query ``i`` and key ``i`` are the same
position, also when ``q_len != kv_len`` (so with ``q_len > kv_len`` causal queries past the
last key see every key, as PyTorch SDPA's ``is_causal`` and xformers'
``LowerTriangularMask``).  A query that sees no key returns zeros and passes no gradient,
as PyTorch SDPA does.

**Spelling** (``--masks`` and TOML; ``bench.model.mask_spelling``): a term is a name with its
parameters after colons, positional in declaration order or ``key=value``: ``window:256``,
``document:4``, ``sink:4:window=512``, ``document:lengths=64/192``.  Masks joined by ``+`` keep
a pair when any of them keeps it (their union, as attention-gym's ``or_masks``), masks joined
by ``&`` when all do (``and_masks``; ``&`` binds tighter), and ``document[:params](INNER)``
applies INNER within each document; score mods join with ``+`` and apply in the order
written.  ``causal+softcap:50`` is the causal mask with a tanh soft cap of 50.  A bare
``window`` takes its size from ``--window``, inside a document too.

The built-in catalogue lives in ``bench.model.mask_catalog``; ``python -m bench list --masks``
prints it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import torch

from bench.errors import first_line
from bench.model.case import Case
from bench.model.mask_spelling import (  # noqa: F401
    Term,
    canonical,
    check_size,
    parse,
    parse_term,
    uses_window_flag,
)
from bench.model.maskdefs import MaskDef, MaskError, catalogue, mask, names, score_mod, sink_logit  # noqa: F401

ANY = "any"  # a variant's masks= / score_mods= value: every registered one
ADDITIVE = "additive"  # a variant's score_mods= value: every mod that only adds a bias

# -- a mask bound to a case ------------------------------------------------------------------


def _on(value, device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


class CaseMask:
    """The mask and score mods of one case, with their prepared tensors (``bind(case)`` gives it)."""

    def __init__(self, case: Case):
        self.case = case
        self.offset = case.offset  # query i sits at position i + offset (bottom-right alignment)
        ms, mods = parse(case.mask, case.window)
        full = any(t.d.name == "none" for t in ms)  # a union with 'none' keeps every pair
        self.masks = [] if full else [(t, self._extra(t)) for t in ms]
        self.mods = [(t, self._extra(t)) for t in mods if not t.d.sink]
        self.sinks = [(t, self._extra(t)) for t in mods if t.d.sink]  # learned sinks: the denominator's term
        if self.offset and any(_mentions(t, "padding") for t, _ in self.masks):
            # bottom-right over padded keys: each sequence's queries sit at the end of its own real keys, as
            # FlashAttention (seqlens_k), FlashInfer and serving engines place them, not at the padded end
            lens = torch.tensor(kv_lengths_of_padding(case))
            self.offset = lens - case.q_len  # (B,): query i of sequence b at position lens[b] - q_len + i
        self._devices: dict = {}
        self._validated = False

    def _extra(self, t: Term) -> dict:
        kw = t.kw
        if t.d.prepare is not None:
            try:
                extra = t.d.prepare(self.case, **t.kw)
            except MaskError:
                raise
            except ValueError as exc:
                raise MaskError(f"mask {t.text()!r} at q_len={self.case.q_len}, kv_len={self.case.kv_len}: {exc}") \
                    from None
            except Exception as exc:
                raise MaskError(f"{t.d.kind.replace('_', ' ')} {t.text()!r} ({t.d.file}): its prepare raised "
                                f"{type(exc).__name__}: {first_line(exc)}") from None
            if not isinstance(extra, dict):
                raise MaskError(f"{t.d.kind.replace('_', ' ')} {t.text()!r} ({t.d.file}): its prepare returned "
                                f"{type(extra).__name__}; it returns a dict of keyword arguments for the predicate")
            kw.update(extra)
        return kw

    def validate(self) -> None:
        """Evaluate every mask predicate and score mod once on a corner of the case (a few query
        rows, the first keys, the first and last batch element, the first head), so that a
        definition that raises, uses Python ``if``/``and`` on tensors, or returns the wrong
        kind of tensor is refused before any cell runs, with what is wrong: a MaskError."""
        if self._validated:
            return
        c = self.case
        rows, kv = (0, min(c.q_len, 4)), (0, min(c.kv_len, 64))
        batches = sorted({0, c.batch - 1})
        b, h, q, k = indices(c, "cpu", rows, kv, batches=batches, heads=slice(0, 1), positions=True)
        full = (len(batches), 1, rows[1], kv[1])
        ms, mods = self._kw("cpu")
        for t, kw in ms:
            out = _evaluate(t, lambda: t.d.fn(b, h, q, k, **kw))
            out = torch.as_tensor(out)
            if out.dtype != torch.bool:
                raise MaskError(f"mask {t.text()!r} ({t.d.file}): its predicate returned a {out.dtype} tensor; a "
                                f"mask returns a bool tensor (comparisons combined with &, |, ~)")
            _fits(t, out.shape, full)
        for t, kw in mods:
            scores = torch.randn(full, generator=torch.Generator().manual_seed(0))
            out = _evaluate(t, lambda: t.d.fn(scores, b, h, q, k, **kw))
            if not isinstance(out, torch.Tensor) or not out.is_floating_point():
                raise MaskError(f"score mod {t.text()!r} ({t.d.file}): it returned "
                                f"{getattr(out, 'dtype', type(out).__name__)}; a score mod returns the scores, "
                                f"a float tensor")
            _fits(t, out.shape, full)
            if not bool(torch.isfinite(out).all()):
                raise MaskError(f"score mod {t.text()!r} ({t.d.file}): it returned non-finite scores on finite "
                                f"ones; check its parameters")
        if self.sinks:
            logits = _evaluate(self.sinks[0][0], lambda: self.sink_logits())
            if logits.shape != (c.heads,) or not bool(torch.isfinite(logits).all()):
                raise MaskError(f"learned sink {self.sinks[0][0].text()!r}: it gave {tuple(logits.shape)} logits; "
                                f"it gives one finite logit per head ({c.heads})")
        self._validated = True

    def sink_logits(self, device="cpu", dtype=torch.float32) -> torch.Tensor | None:
        """The learned sinks' logit per head, (H,); several sinks as the one virtual key they add up
        to (their logsumexp: each adds exp(s) to the denominator and nothing to the output).  None
        without a sink."""
        if not self.sinks:
            return None
        h = torch.arange(self.case.heads)
        logits = torch.stack([torch.as_tensor(t.d.fn(h, **kw), dtype=torch.float64) for t, kw in self.sinks])
        return torch.logsumexp(logits, 0).to(device, dtype)

    @property
    def is_full(self) -> bool:
        """True when every pair is kept (mask none, or a union with none)."""
        return not self.masks

    def _kw(self, device):
        device = str(device)
        if device not in self._devices:
            self._devices[device] = ([(t, {k: _on(v, device) for k, v in kw.items()}) for t, kw in self.masks],
                                     [(t, {k: _on(v, device) for k, v in kw.items()}) for t, kw in self.mods])
        return self._devices[device]

    # FlexAttention form ------------------------------------------------------------------
    # FlexAttention tells a mask_mod from a score_mod by counting the positional parameters of what
    # it is given, so both are handed over as plain functions of exactly 4 and 5 parameters, never
    # as a partial of a definition that takes ``**kw`` (an ``&`` or a ``document(...)``)
    def mask_mod(self, device="cpu") -> Callable | None:
        """One ``mask_mod(b, h, q_idx, kv_idx)``: the union of the masks; None when all pairs are kept."""
        ms, _ = self._kw(device)
        if not ms:
            return None
        fns = [(t.d.fn, kw) for t, kw in ms]
        position = self._position(device)

        def mask_mod(b, h, q_idx, kv_idx):
            out = None
            pos = position(b, q_idx)  # the query's position among the keys
            for fn, kw in fns:
                keep = fn(b, h, pos, kv_idx, **kw)
                out = keep if out is None else out | keep
            return out
        return mask_mod

    def score_mod(self, device="cpu") -> Callable | None:
        """One ``score_mod(score, b, h, q_idx, kv_idx)``: the mods in order; None when there are none."""
        _, mods = self._kw(device)
        if not mods:
            return None
        fns = [(t.d.fn, kw) for t, kw in mods]
        position = self._position(device)

        def composed(score, b, h, q_idx, kv_idx):
            pos = position(b, q_idx)
            for fn, kw in fns:
                score = fn(score, b, h, pos, kv_idx, **kw)
            return score
        return composed

    @property
    def per_sequence_offset(self) -> bool:
        """True when each sequence's queries have their own position (bottom-right over padded keys)."""
        return isinstance(self.offset, torch.Tensor)

    def _position(self, device) -> Callable:
        """position(b, q_idx): query row q_idx of batch element b among the keys."""
        off = self.offset
        if isinstance(off, torch.Tensor):
            off = off.to(device)
            return lambda b, q_idx: q_idx + off[b]
        if off:
            return lambda b, q_idx: q_idx + off
        return lambda b, q_idx: q_idx

    @functools.cached_property
    def depends(self) -> tuple[bool, bool]:
        """(on the batch index, on the head index): from the shape the predicate returns."""
        fn = self.mask_mod()
        if fn is None:
            return False, False
        b, h, q, kv = indices(self.case, rows=(0, 1), kv=(0, 1))
        shape = torch.as_tensor(fn(b, h, q, kv)).shape
        shape = (1,) * (4 - len(shape)) + tuple(shape)
        return shape[0] > 1, shape[1] > 1

    # dense forms ---------------------------------------------------------------------------
    def keep(self, device="cpu", rows=None, batches=None, heads=None, kv=None) -> torch.Tensor | None:
        """Bool (B|1, H|1, n, m) for query rows [s, e) and keys [ks, ke) (all by default); None
        when all is kept."""
        fn = self.mask_mod(device)
        if fn is None:
            return None
        b, h, q, kv = indices(self.case, device, rows, kv, batches=batches, heads=heads)
        out = torch.as_tensor(fn(b, h, q, kv), device=device)
        out = out.reshape((1,) * (4 - out.dim()) + tuple(out.shape))
        return out.expand(*out.shape[:2], q.shape[2], kv.shape[3])

    def apply_mods(self, scores: torch.Tensor, rows=None, batches=None, heads=None, kv=None) -> torch.Tensor:
        """The score mods applied to ``scores`` (B, H, n, m) of query rows [s, e) and keys [ks, ke)."""
        fn = self.score_mod(scores.device)
        if fn is None:
            return scores
        b, h, q, kv = indices(self.case, scores.device, rows, kv, batches=batches, heads=heads)
        return fn(scores, b, h, q, kv).to(scores.dtype)

    def bias(self, device, dtype) -> torch.Tensor | None:
        """Additive mods as a float bias (B|1, H|1, Lq, Lk), masked pairs at -inf; None without mods."""
        if not self.mods:
            return None
        zero = torch.zeros((1, 1, self.case.q_len, self.case.kv_len), device=device, dtype=torch.float32)
        bias = self.apply_mods(zero)
        keep = self.keep(device)
        if keep is not None:
            bias = bias.masked_fill(~keep, float("-inf"))
        return bias.to(dtype)

    # counting -------------------------------------------------------------------------------
    @functools.cached_property
    def counts(self) -> tuple[int, int]:
        """(pairs kept, summed over batch and heads; fewest keys any query row keeps)."""
        c = self.case
        if self.is_full:
            return c.batch * c.heads * c.q_len * c.kv_len, c.kv_len
        if all(t.d.intervals is not None for t, _ in self.masks):
            try:
                return self._count_intervals()
            except NotImplementedError:  # an intersection of parts that keep several ranges a row
                pass
        return self._count_dense()

    def _count_intervals(self) -> tuple[int, int]:
        c = self.case
        if self.per_sequence_offset:  # rows at positions of their own per sequence: counted on the dense form
            raise NotImplementedError
        total, fewest = 0, c.kv_len
        step = 1 << 14  # query rows at a time: memory stays bounded at any length
        for s in range(0, c.q_len, step):
            e = min(c.q_len, s + step)
            q = torch.arange(s, e) + self.offset  # the rows' positions among the keys
            spans = [span for t, kw in self.masks for span in t.d.intervals(q, c, **kw)]
            per = covered(spans, c.kv_len, e - s)  # (B|1, n)
            total += int(per.sum()) * (c.batch // per.shape[0]) * c.heads
            fewest = min(fewest, int(per.min()))
        return total, fewest

    def _count_dense(self) -> tuple[int, int]:
        c = self.case
        per_b, per_h = self.depends
        bs, hs = (c.batch if per_b else 1), (c.heads if per_h else 1)
        rows = max(1, (1 << 24) // max(1, bs * hs * c.kv_len))
        total, fewest = 0, c.kv_len
        for s in range(0, c.q_len, rows):
            e = min(c.q_len, s + rows)
            keep = self.keep("cpu", (s, e))
            per = keep.sum(-1)
            total += int(per.sum()) * (c.batch // keep.shape[0]) * (c.heads // keep.shape[1])
            fewest = min(fewest, int(per.min()))
        return total, fewest

    @property
    def density(self) -> float:
        c = self.case
        return self.counts[0] / (c.batch * c.heads * c.q_len * c.kv_len)


def _evaluate(t: Term, call):
    """``call()``, a mask's or score mod's definition evaluated; what goes wrong as a MaskError
    that names it, its file and the error."""
    what = f"{t.d.kind.replace('_', ' ')} {t.text()!r} ({t.d.file})"
    try:
        return call()
    except RuntimeError as exc:
        if "Boolean value of Tensor" in str(exc):
            raise MaskError(f"{what}: it uses Python if/and/or/not on tensors ({first_line(exc)}); it is "
                            f"evaluated on whole index tensors: combine conditions with &, |, ~ and "
                            f"torch.where") from None
        raise MaskError(f"{what}: it raised RuntimeError: {first_line(exc)}") from None
    except Exception as exc:
        raise MaskError(f"{what}: it raised {type(exc).__name__}: {first_line(exc)}") from None


def _fits(t: Term, shape, full) -> None:
    try:
        torch.broadcast_shapes(tuple(shape), full)
    except RuntimeError:
        raise MaskError(f"{t.d.kind.replace('_', ' ')} {t.text()!r} ({t.d.file}): it returned shape "
                        f"{tuple(shape)}, which does not broadcast with the index grids (batch, head, query, "
                        f"key) {full}") from None
    if len(shape) > 4:
        raise MaskError(f"{t.d.kind.replace('_', ' ')} {t.text()!r} ({t.d.file}): it returned {len(shape)} "
                        f"dimensions; at most 4 (batch, head, query, key)")


def _rows2d(t, n: int) -> torch.Tensor:
    t = torch.as_tensor(t, dtype=torch.long)
    if t.dim() == 0:
        t = t.expand(n)
    return t if t.dim() == 2 else t.unsqueeze(0)


def covered(spans, kv_len: int, n: int) -> torch.Tensor:
    """Keys covered by the union of half-open ranges ``[(lo, hi), ...]`` per query row,
    clipped to [0, kv_len): int64 (B|1, n)."""
    los = [_rows2d(lo, n) for lo, _ in spans]
    his = [_rows2d(hi, n) for _, hi in spans]
    shape = torch.broadcast_shapes(*(t.shape for t in los + his))
    lo = torch.stack([t.expand(shape) for t in los]).clamp(0, kv_len)
    hi = torch.stack([t.expand(shape) for t in his]).clamp(0, kv_len)
    hi = torch.maximum(hi, lo)
    order = lo.argsort(0)
    lo, hi = lo.gather(0, order), hi.gather(0, order)
    reach = torch.cummax(hi, 0).values  # the furthest key covered by the ranges so far
    before = torch.cat([torch.zeros_like(reach[:1]), reach[:-1]])
    return (hi - torch.maximum(lo, before)).clamp(min=0).sum(0)


def indices(case: Case, device="cpu", rows=None, kv=None, batches=None, heads=None, positions: bool = False):
    """Broadcastable index tensors b (B,1,1,1), h (1,H,1,1), q (1,1,n,1), kv (1,1,1,Lk): the
    query rows' indices, as FlexAttention passes them (``CaseMask.mask_mod`` and ``score_mod``
    place row i at its position i + case.offset themselves); with ``positions``, q holds the
    positions (for a mask's or score mod's definition called directly)."""
    s, e = rows if rows is not None else (0, case.q_len)
    ks, ke = kv if kv is not None else (0, case.kv_len)
    b = torch.as_tensor(list(range(case.batch)) if batches is None else list(batches), device=device)
    h = torch.arange(case.heads, device=device)
    if heads is not None:
        h = h[heads]
    first = case.offset if positions else 0
    return (b.view(-1, 1, 1, 1), h.view(1, -1, 1, 1), (torch.arange(s, e, device=device) + first).view(1, 1, -1, 1),
            torch.arange(ks, ke, device=device).view(1, 1, 1, -1))


@functools.lru_cache(maxsize=256)
def _case_mask(case: Case) -> CaseMask:
    return CaseMask(case)


def bind(case: Case) -> CaseMask:
    """The case's mask and score mods, resolved and prepared (cached per case; the direction
    does not matter to a mask).  A mask's ``prepare`` receives this very case; a ragged batch's
    is that of its packed sequence (``Case.packed``)."""
    return _case_mask(case.packed().replace(direction="fwd"))


# -- what variants, FLOP counts and rows ask of a case's mask ------------------------------------------------

def _mentions(t, name: str) -> bool:
    """Whether the mask term ``t`` is ``name`` or an intersection with it as a part."""
    return t.d.name == name or name in (getattr(t, "names", None) or ())


def kv_lengths_of_padding(case: Case) -> list[int]:
    """The valid key count per batch element that the padding mask keeps."""
    from bench.model.mask_catalog import padding_lengths

    return padding_lengths(case)["lens"].flatten().tolist()


def kv_lengths(case: Case) -> list[int]:
    """Valid key count per batch element under the padding mask (the lengths its definition
    in ``mask_catalog`` prepares); kv_len for other masks."""
    if case.mask != "padding":
        return [case.kv_len] * case.batch
    return bind(case).masks[0][1]["lens"].flatten().tolist()


def kept_pairs(case: Case) -> int:
    """(query, key) pairs the mask keeps, summed over the batch, for one head (averaged over
    heads for a mask that depends on the head): exact, in bounded memory."""
    total = bind(case).counts[0]
    return total // case.heads if total % case.heads == 0 else total / case.heads


def density(case: Case) -> float:
    """The fraction of (query, key) pairs the mask keeps."""
    return bind(case).density


def row_columns(case: Case) -> dict:
    """What a row records about its mask: every term's parameters (defaults included) and the
    density, the fraction of (query, key) pairs kept.  A ragged batch's row also records the
    length of each sequence and its padding waste (``padding_waste``); its density is over
    the real pairs, those within each sequence."""
    ms, mods = parse(case.mask, case.window)
    params = {t.d.name: {k: list(v) if isinstance(v, tuple) else v for k, v in t.params} for t in ms + mods}
    if not case.ragged:
        return {"mask_params": params, "density": round(bind(case).density, 6)}
    lens = case.seq_lengths()
    kept = bind(case).counts[0]
    real = sum(n * n for n in lens) * case.heads
    return {"mask_params": params, "density": round(kept / real, 6), "seq_lengths": lens,
            "padding_waste": round(padding_waste(case), 6)}


def per_sequence(case: Case, make: Callable) -> Callable:
    """A ragged or mixed batch computed one sequence at a time: ``make(sub_case)`` builds a
    fixed-length variant's call (a callable, or a ``Prepared``) for a case of one sequence of
    each (q_len, kv_len), bottom-right within it for a mixed batch, and the returned
    ``fn(q, k, v)`` runs it on each sequence's slices of the packed tensors (1, H, total, D), q
    and k sliced apart, and joins the outputs.  Gradients flow through the slices."""
    segments = case.segments()
    calls, prep_ms = {}, 0.0
    for q_len, kv_len in sorted(set(segments)):
        out = make(case.replace(batch=1, q_len=q_len, kv_len=kv_len, lengths="fixed", mix="none"))  # a mix's
        calls[q_len, kv_len] = getattr(out, "fn", out)  # sub-case keeps its bottom-right alignment
        prep_ms += float(getattr(out, "info", {}).get("prep_ms") or 0.0)
    q_starts = itertools.accumulate((q for q, _ in segments), initial=0)
    kv_starts = itertools.accumulate((kv for _, kv in segments), initial=0)
    parts = list(zip(q_starts, kv_starts, segments))

    def attention(q, k, v):
        return torch.cat([calls[n, m](q[:, :, s:s + n], k[:, :, t:t + m], v[:, :, t:t + m])
                          for s, t, (n, m) in parts], dim=2)
    attention.prep_ms = prep_ms  # what the sequences' preparations took, together (a row's prep_ms)
    return attention


def padding_waste(case: Case) -> float:
    """The FLOPs of the same batch padded to its longest sequence over its real FLOPs (>= 1):
    what an equal-length kernel spends on padding."""
    lens = case.seq_lengths()
    padded = case.replace(q_len=max(lens), kv_len=max(lens), lengths="fixed")
    return bind(padded).counts[0] / bind(case).counts[0]


def dense_keep(case: Case, device="cpu") -> torch.Tensor | None:
    """Boolean keep-mask of shape (B|1, H|1, q_len, kv_len); None when every pair is kept."""
    return bind(case).keep(device)


def has_empty_rows(case: Case) -> bool:
    """True when some query sees no key (its output is defined as zero)."""
    return bind(case).counts[1] == 0


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None, empty_rows: bool,
                   sink: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores) over keys with masked positions at -inf; empty rows give zeros.

    The empty-row handling keeps both the forward and its gradient finite.  ``sink``, a learned
    sink's logit per head (H,) (``CaseMask.sink_logits``), is one more key in each row's
    denominator with a zero value: the weights sum to less than one (to none in an empty row).
    """
    if sink is not None:
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        column = sink.to(scores.device, scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        return torch.cat([scores, column], -1).softmax(-1)[..., :-1]
    if keep is None:
        return scores.softmax(-1)
    scores = scores.masked_fill(~keep, float("-inf"))
    if not empty_rows:
        return scores.softmax(-1)
    empty = ~keep.any(-1, keepdim=True)
    return scores.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)


from bench.model import mask_catalog  # noqa: E402,F401  (registers the built-in catalogue)
