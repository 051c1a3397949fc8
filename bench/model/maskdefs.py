"""The registry of masks and score mods: the ``@mask`` and ``@score_mod`` decorators and
what they record.  ``bench.masks`` (``bench.model.masks``) re-exports them with everything
built on the definitions; the built-in catalogue is ``bench.model.mask_catalog``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.errors import RegistryError

_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")


class MaskError(ValueError):
    """A mask spelling or parameter that is not valid; the message says what is."""


_NUM = r"-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?"
_RANGE = re.compile(rf"^\s*(?:(>=|>)\s*({_NUM})|(>\s*)?({_NUM})\s*\.\.\s*({_NUM}))\s*$")


@dataclass(frozen=True)
class Range:
    """A parameter's valid values: ``> lo``, ``>= lo``, ``lo..hi`` (both ends included) or
    ``> lo..hi`` (lo excluded).  A tuple parameter holds every one of its numbers to it."""
    lo: float
    hi: float | None = None
    open_lo: bool = False

    @classmethod
    def parse(cls, text: str) -> Range:
        m = _RANGE.match(str(text))
        if not m:
            raise ValueError(f"range {text!r}: write '> 0', '>= 1', '0..1' or '> 0..100'")
        if m.group(1):
            return cls(float(m.group(2)), None, m.group(1) == ">")
        lo, hi = float(m.group(4)), float(m.group(5))
        if hi < lo:
            raise ValueError(f"range {text!r}: its end is below its start")
        return cls(lo, hi, bool(m.group(3)))

    def holds(self, value) -> bool:
        values = value if isinstance(value, tuple) else (value,)
        return all((x > self.lo if self.open_lo else x >= self.lo) and (self.hi is None or x <= self.hi)
                   for x in values)

    def text(self) -> str:
        if self.hi is not None:
            return f"{'> ' if self.open_lo else ''}{_end(self.lo)} to {_end(self.hi)}"
        return f"{'>' if self.open_lo else '>='} {_end(self.lo)}"


def _end(x: float) -> str:
    """A range's end as written: whole numbers in full (16777216, not 1.67772e+07)."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


@dataclass(frozen=True)
class MaskDef:
    name: str
    kind: str  # "mask" or "score_mod"
    fn: Callable
    description: str
    params: dict = field(default_factory=dict)
    prepare: Callable | None = None  # (case, **params) -> extra keyword tensors for fn
    intervals: Callable | None = None  # masks: (q_idx, case, **kw) -> [(lo, hi), ...]
    additive: bool = False  # score mods: score + bias(b, h, q_idx, kv_idx)
    module: str = ""
    ranges: dict = field(default_factory=dict)  # parameter: its Range (a parameter without one takes any value)
    sink: bool = False  # a score-mod-like term: fn(h, **params) gives a per-head logit of a virtual key (below)

    def signature(self) -> str:
        return self.name + "".join(f":{k}={format_value(v)}" for k, v in self.params.items())

    def ranges_text(self) -> str:
        """Each parameter's valid values, as ``list --masks`` and the errors show them."""
        return ", ".join(f"{k} {self.ranges[k].text()}" for k in self.params if k in self.ranges)

    @property
    def file(self) -> str:
        """The file that defines it (its module's), for messages."""
        import sys

        return getattr(sys.modules.get(self.module), "__file__", None) or self.module


_DEFS: dict[str, MaskDef] = {}


def _register(kind, name, params, description, prepare, intervals, additive, ranges, sink=False):
    if not _NAME.match(name):
        raise MaskError(f"{kind} name {name!r}: use lower-case letters, digits, '_' and '.', starting with a letter")
    for k, v in (params or {}).items():
        if not isinstance(v, (int, float, tuple)) or isinstance(v, bool):
            raise MaskError(f"{kind} {name!r}: parameter {k}={v!r}: defaults must be int, float or a tuple of ints")
    parsed = {}
    for k, text in (ranges or {}).items():
        if k not in (params or {}):
            raise MaskError(f"{kind} {name!r}: ranges names {k!r}, which is not one of its params")
        try:
            parsed[k] = Range.parse(text)
        except ValueError as exc:
            raise MaskError(f"{kind} {name!r}: parameter {k}: {exc}") from None
        if not parsed[k].holds(params[k]):
            raise MaskError(f"{kind} {name!r}: the default {k}={format_value(params[k])} is outside its range "
                            f"{parsed[k].text()}")

    def deco(fn):
        entry = MaskDef(name, kind, fn, description, dict(params or {}), prepare, intervals, additive,
                        fn.__module__, parsed, sink)
        old = _DEFS.get(name)
        if old is not None and old.module != entry.module:
            raise RegistryError(f"mask or score mod {name!r} is defined twice: in {old.module} and in {entry.module}")
        _DEFS[name] = entry
        return fn

    return deco


def mask(name: str, *, description: str, params: dict | None = None, prepare: Callable | None = None,
         intervals: Callable | None = None, ranges: dict | None = None):
    """Register ``fn(b, h, q_idx, kv_idx, **params) -> bool tensor`` as the mask ``name``.
    ``ranges`` gives parameters their valid values (``{"cell": ">= 1"}``; ``"> 0"``,
    ``"0..1"``), checked when a spelling is parsed."""
    return _register("mask", name, params, description, prepare, intervals, False, ranges)


def score_mod(name: str, *, description: str, params: dict | None = None, prepare: Callable | None = None,
              additive: bool = False, ranges: dict | None = None):
    """Register ``fn(score, b, h, q_idx, kv_idx, **params) -> score`` as the score mod ``name``.
    ``additive=True`` declares that it returns ``score + bias`` with a bias that does not depend
    on the score (SDPA then takes it as a float attn_mask); ``ranges`` as for ``mask``."""
    return _register("score_mod", name, params, description, prepare, None, additive, ranges)


def sink_logit(name: str, *, description: str, params: dict | None = None, prepare: Callable | None = None,
               ranges: dict | None = None):
    """Register ``fn(h, **params) -> logit per head`` as the learned sink ``name`` (gpt-oss): a
    virtual key with that logit and a zero value, one more term in each row's softmax
    denominator, so that a row may put weight on nothing.  Spelled as a score mod
    (``causal+learned_sink``); the variants that declare ``sinks=True`` compute it."""
    return _register("score_mod", name, params, description, prepare, None, False, ranges, sink=True)


def catalogue() -> dict[str, MaskDef]:
    """Every registered mask and score mod, built-ins first."""
    return dict(_DEFS)


def definition(name: str) -> MaskDef | None:
    """The registered mask or score mod called ``name``, or None."""
    return _DEFS.get(name)


def names(kind: str) -> list[str]:
    return [n for n, d in _DEFS.items() if d.kind == kind]


def format_value(v) -> str:
    if isinstance(v, tuple):
        return "/".join(str(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
