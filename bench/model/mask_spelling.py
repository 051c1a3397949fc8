"""How masks are spelled: ``--masks`` and TOML text to terms, and terms back to one canonical text.

A term is a registered mask or score mod with its parameters after colons, positional in
declaration order or ``key=value`` (``window:256``, ``sink:4:window=512``).  Masks joined by
``&`` keep a pair when all of them keep it (their intersection, attention-gym's
``and_masks``), and ``&`` binds tighter than ``+``, the union (``or_masks``), which also
joins the score mods: ``document:4&causal+sink:4`` is (document and causal) or sink.  What a
term means (its predicate, its counts) is ``bench.model.masks``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bench.model.maskdefs import MaskDef, MaskError, definition, format_value, names


def _value(term: str, key: str, default, raw: str):
    from bench.model import digits

    try:
        if isinstance(default, tuple):
            parts = [x for x in raw.split("/") if x != ""]
            if not all(digits.is_int(x) for x in parts):
                raise ValueError
            return tuple(int(x) for x in parts)
        if isinstance(default, float):
            if not digits.is_number(raw):
                raise ValueError
            out = float(raw)
            if not math.isfinite(out):
                raise ValueError
            return out
        if not digits.is_int(raw):
            raise ValueError
        return int(raw)
    except ValueError:
        kind = "numbers joined by '/'" if isinstance(default, tuple) else type(default).__name__
        raise MaskError(f"mask term {term!r}: {key}={raw!r} is not valid: {key} takes {kind} "
                        f"(ASCII digits 0-9)") from None


def _unknown(name: str) -> MaskError:
    return MaskError(f"unknown mask or score mod {name!r}; masks: {', '.join(names('mask'))}; "
                     f"score mods: {', '.join(names('score_mod'))} (python -m bench list --masks)")


@dataclass(frozen=True)
class Term:
    d: MaskDef
    params: tuple  # ((key, value), ...) in declaration order

    @property
    def kw(self) -> dict:
        return dict(self.params)

    def text(self) -> str:
        """The one spelling: the first parameter positionally, the others as key=value when not
        their default (the first too, as key=value, when only later ones differ)."""
        items = list(self.params)
        if not items:
            return self.d.name
        changed = [(k, v) for k, v in items if v != self.d.params[k]]
        if not changed or changed[0][0] == items[0][0]:
            first, rest = items[0][1], [kv for kv in changed if kv[0] != items[0][0]]
            return f"{self.d.name}:{format_value(first)}" + "".join(f":{k}={format_value(v)}" for k, v in rest)
        return self.d.name + "".join(f":{k}={format_value(v)}" for k, v in changed)


def parse_term(text: str, window: int | None = None) -> Term:
    name, *parts = text.strip().split(":")
    d = definition(name)
    if d is None:
        raise _unknown(name)
    keys = list(d.params)
    given: dict = {}
    for i, part in enumerate(parts):
        key, sep, raw = part.partition("=")
        if not sep:
            if i >= len(keys) or any("=" in p for p in parts[:i]):
                raise MaskError(f"mask term {text!r}: too many positional values; {d.signature()}")
            key, raw = keys[i], part
        elif key not in d.params:
            raise MaskError(f"mask term {text!r}: {name} has no parameter {key!r}; {d.signature()}")
        if key in given:
            raise MaskError(f"mask term {text!r}: {key} given twice")
        given[key] = _value(text, key, d.params[key], raw)
        valid = d.ranges.get(key)
        if valid is not None and not valid.holds(given[key]):
            raise MaskError(f"mask term {text!r}: {key}={raw} is out of range: {name} takes {d.ranges_text()}")
    if name == "window" and "window" not in given:
        if window is None:
            raise MaskError("mask 'window' needs a size: window:256, or --window 256")
        given["window"] = window
    return Term(d, tuple((k, given.get(k, v)) for k, v in d.params.items()))


class Intersection:
    """Masks joined by ``&``: a pair is kept when every part keeps it.  It stands where a Term
    does: ``d`` is a MaskDef made from the parts (its predicate the AND of theirs, each with its
    own parameters, prefixed ``<i>.`` in ``kw``; its key ranges the overlap of theirs when each
    part keeps one range per query row), so the mask's meaning needs no case of its own."""

    def __init__(self, parts: list[Term]):
        self.parts = parts
        self.params = tuple((f"{i}.{k}", v) for i, t in enumerate(parts) for k, v in t.params)
        names_ = [t.d.name for t in parts]
        self.d = MaskDef(name="intersection", kind="mask", fn=self._fn, description=" and ".join(
            f"({t.d.description})" for t in parts), params=dict(self.params), prepare=self._prepare,
            intervals=self._intervals if all(t.d.intervals for t in parts) else None,
            module=parts[0].d.module)
        self.names = names_

    @property
    def kw(self) -> dict:
        return dict(self.params)

    def text(self) -> str:
        return "&".join(t.text() for t in self.parts)

    def _split(self, kw: dict) -> list[dict]:
        out = [{} for _ in self.parts]
        for key, value in kw.items():
            i, _, name = key.partition(".")
            out[int(i)][name] = value
        return out

    def _fn(self, b, h, q_idx, kv_idx, **kw):
        out = None
        for t, own in zip(self.parts, self._split(kw)):
            keep = t.d.fn(b, h, q_idx, kv_idx, **own)
            out = keep if out is None else out & keep
        return out

    def _prepare(self, case, **kw) -> dict:
        extra = {}
        for i, (t, own) in enumerate(zip(self.parts, self._split(kw))):
            if t.d.prepare is not None:
                extra |= {f"{i}.{k}": v for k, v in t.d.prepare(case, **own).items()}
        return extra

    def _intervals(self, q, case, **kw):
        spans = [t.d.intervals(q, case, **own) for t, own in zip(self.parts, self._split(kw))]
        if any(len(s) != 1 for s in spans):
            raise NotImplementedError  # counted by the predicate instead (CaseMask falls back)
        import torch

        lo = [torch.as_tensor(s[0][0]) for s in spans]
        hi = [torch.as_tensor(s[0][1]) for s in spans]
        return [(_reduce(torch.maximum, lo), _reduce(torch.minimum, hi))]


def _reduce(op, xs):
    out = xs[0]
    for x in xs[1:]:
        out = op(out, x)
    return out


class Within:
    """``document:...(INNER)``: the inner mask applied within each document, its query and key
    positions counted from the document's start (so a prefix or a sink is per document); a
    pair across documents is never kept."""

    def __init__(self, doc: Term, inner):
        self.doc, self.inner = doc, inner
        self.params = tuple((f"d.{k}", v) for k, v in doc.params) + tuple((f"i.{k}", v) for k, v in inner.params)
        self.d = MaskDef(name="within", kind="mask", fn=self._fn, description=f"({inner.d.description}) within "
                         f"each document", params=dict(self.params), prepare=self._prepare,
                         intervals=self._intervals if inner.d.intervals else None, module=inner.d.module)

    @property
    def kw(self) -> dict:
        return dict(self.params)

    def text(self) -> str:
        return f"{self.doc.text()}({self.inner.text()})"

    @staticmethod
    def _split(kw: dict) -> tuple[dict, dict]:
        doc, inner = {}, {}
        for key, value in kw.items():
            side, _, name = key.partition(".")
            (doc if side == "d" else inner)[name] = value
        return doc, inner

    def _fn(self, b, h, q_idx, kv_idx, **kw):
        doc, inner = self._split(kw)
        same = self.doc.d.fn(b, h, q_idx, kv_idx, **doc)
        start = doc["starts"][doc["doc"]]  # the start of each position's document
        return same & self.inner.d.fn(b, h, q_idx - start[q_idx], kv_idx - start[kv_idx], **inner)

    def _prepare(self, case, **kw) -> dict:
        doc, inner = self._split(kw)
        extra = {f"d.{k}": v for k, v in self.doc.d.prepare(case, **doc).items()}
        if self.inner.d.prepare is not None:
            extra |= {f"i.{k}": v for k, v in self.inner.d.prepare(case, **inner).items()}
        return extra

    def _intervals(self, q, case, **kw):
        doc, inner = self._split(kw)
        (lo, hi), = self.doc.d.intervals(q, case, **doc)
        start = doc["starts"][doc["doc"][q]]
        spans = self.inner.d.intervals(q - start, case, **inner)
        if len(spans) != 1:
            raise NotImplementedError
        import torch

        ilo, ihi = (torch.as_tensor(x) for x in spans[0])
        return [(torch.maximum(torch.as_tensor(lo), ilo + start), torch.minimum(torch.as_tensor(hi), ihi + start))]


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


def _term(text: str, window: int | None):
    """A term, or ``document:...(INNER)``: INNER within each document."""
    if "(" not in text:
        return parse_term(text, window)
    head, _, rest = text.partition("(")
    if not rest.endswith(")") or not head.strip():
        raise MaskError(f"mask {text!r}: a wrapper is document[:params](INNER), e.g. document:4(prefix_lm:16)")
    doc = parse_term(head, window)
    if doc.d.name != "document":
        raise MaskError(f"mask {text!r}: only document wraps a mask: document[:params](INNER), e.g. "
                        f"document:4(prefix_lm:16); {doc.d.name} does not")
    inner_text = rest[:-1]
    if len(_split_top(inner_text, "+")) > 1:
        raise MaskError(f"mask {text!r}: a union ('+') inside document(...) is not supported; write one document "
                        f"per part, e.g. " + "+".join(f"{head}({p})" for p in _split_top(inner_text, "+")))
    inner = _group(inner_text, window)
    if inner.d.kind != "mask":
        raise MaskError(f"mask {text!r}: the inner term of document(...) is a mask; {inner.text()} is a score mod")
    return Within(doc, inner)


def _group(text: str, window: int | None):
    """One ``+`` term: a Term, or an Intersection of the masks joined by ``&``."""
    parts = _split_top(text, "&")
    if any(not p.strip() for p in parts):
        raise MaskError(f"mask {text!r}: an empty term beside '&'; join masks such as document:4&causal")
    terms = [_term(p, window) for p in parts]
    if len(terms) == 1:
        return terms[0]
    mods = [t.text() for t in terms if t.d.kind != "mask"]
    if mods:
        raise MaskError(f"mask {text!r}: '&' joins masks; {', '.join(mods)} is a score mod (join score mods "
                        f"with '+', as in causal+softcap:50)")
    return Intersection(terms)


MAX_SPELLING = 500  # characters in one mask spelling (bench.model.case.MAX_MASK_TEXT)
MAX_NESTING = 4  # document(...) inside document(...): this deep at most


def nesting(text: str) -> int:
    """The deepest parenthesis level of a spelling."""
    depth = deepest = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    return deepest


def check_size(text: str) -> None:
    """MaskError for a spelling too long or nested too deep to be a mask anyone means (and that
    would exhaust the parser's recursion)."""
    if len(text) > MAX_SPELLING:
        raise MaskError(f"mask {text[:40]}...: {len(text)} characters; a spelling has at most {MAX_SPELLING}")
    if nesting(text) > MAX_NESTING:
        raise MaskError(f"mask {text[:40]}...: nested {nesting(text)} deep; document(...) wrappers nest at most "
                        f"{MAX_NESTING} deep")


def parse(text: str, window: int | None = None) -> tuple[list[Term], list[Term]]:
    """(mask terms, score-mod terms) of a spelling such as ``causal+softcap:50``; masks joined by
    ``&`` are one Intersection in the first list."""
    if not isinstance(text, str) or not text.strip():
        raise MaskError(f"mask {text!r}: empty; valid: {', '.join(names('mask'))}")
    check_size(text)
    if any(not t.strip() for t in _split_top(text, "+")):
        raise MaskError(f"mask {text!r}: an empty term between '+' signs; join names such as causal+softcap:50")
    if text.count("(") != text.count(")"):
        raise MaskError(f"mask {text!r}: unbalanced parentheses; a wrapper is document[:params](INNER)")
    terms = [_group(t, window) for t in _split_top(text, "+")]
    ms = [t for t in terms if t.d.kind == "mask"]
    mods = [t for t in terms if t.d.kind == "score_mod"]
    if not ms:
        ms = [parse_term("none")]
    return ms, mods


def canonical(text: str, window: int | None = None) -> tuple[str, int | None]:
    """The (mask, window) a Case stores for a spelling: the lone window mask keeps its size in
    Case.window (as it always has); every other spelling is written out in full, in one form."""
    ms, mods = parse(text, window)
    if len(ms) == 1 and not mods and ms[0].d.name == "window":
        return "window", ms[0].kw["window"]
    if any(t.d.name == "none" for t in ms):  # a union with 'none' keeps every pair
        ms = [] if mods else [parse_term("none")]
    return "+".join(t.text() for t in ms + mods), None


def uses_window_flag(text: str) -> bool:
    """True when a spelling has a bare ``window`` term (one that takes --window), also inside
    ``document(...)``."""
    return any(t.strip() == "window" for t in re.split(r"[+&()]", str(text)))
