"""How masks are spelled: ``--masks`` and TOML text to terms, and terms back to one canonical text.

A term is a registered mask or score mod with its parameters after colons, positional in
declaration order or ``key=value`` (``window:256``, ``sink:4:window=512``); terms are joined
by ``+``.  What a term means (its predicate, its counts) is ``bench.model.masks``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.model.maskdefs import MaskDef, MaskError, definition, format_value, names


def _value(term: str, key: str, default, raw: str):
    try:
        if isinstance(default, tuple):
            return tuple(int(x) for x in raw.split("/") if x != "")
        if isinstance(default, float):
            out = float(raw)
            if not math.isfinite(out):
                raise ValueError
            return out
        return int(raw)
    except ValueError:
        kind = "numbers joined by '/'" if isinstance(default, tuple) else type(default).__name__
        raise MaskError(f"mask term {term!r}: {key}={raw!r} is not valid: {key} takes {kind}") from None


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


def parse(text: str, window: int | None = None) -> tuple[list[Term], list[Term]]:
    """(mask terms, score-mod terms) of a spelling such as ``causal+softcap:50``."""
    if not isinstance(text, str) or not text.strip():
        raise MaskError(f"mask {text!r}: empty; valid: {', '.join(names('mask'))}")
    if any(not t.strip() for t in text.split("+")):
        raise MaskError(f"mask {text!r}: an empty term between '+' signs; join names such as causal+softcap:50")
    terms = [parse_term(t, window) for t in text.split("+")]
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
    """True when a spelling has a bare ``window`` term (one that takes --window)."""
    return any(t.strip() == "window" for t in str(text).split("+"))
