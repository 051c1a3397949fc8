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

    def signature(self) -> str:
        return self.name + "".join(f":{k}={_fmt(v)}" for k, v in self.params.items())


_DEFS: dict[str, MaskDef] = {}


def _register(kind, name, params, description, prepare, intervals, additive):
    if not _NAME.match(name):
        raise MaskError(f"{kind} name {name!r}: use lower-case letters, digits, '_' and '.', starting with a letter")
    for k, v in (params or {}).items():
        if not isinstance(v, (int, float, tuple)) or isinstance(v, bool):
            raise MaskError(f"{kind} {name!r}: parameter {k}={v!r}: defaults must be int, float or a tuple of ints")

    def deco(fn):
        entry = MaskDef(name, kind, fn, description, dict(params or {}), prepare, intervals, additive,
                        fn.__module__)
        old = _DEFS.get(name)
        if old is not None and old.module != entry.module:
            raise RegistryError(f"mask or score mod {name!r} is defined twice: in {old.module} and in {entry.module}")
        _DEFS[name] = entry
        return fn

    return deco


def mask(name: str, *, description: str, params: dict | None = None, prepare: Callable | None = None,
         intervals: Callable | None = None):
    """Register ``fn(b, h, q_idx, kv_idx, **params) -> bool tensor`` as the mask ``name``."""
    return _register("mask", name, params, description, prepare, intervals, False)


def score_mod(name: str, *, description: str, params: dict | None = None, prepare: Callable | None = None,
              additive: bool = False):
    """Register ``fn(score, b, h, q_idx, kv_idx, **params) -> score`` as the score mod ``name``.
    ``additive=True`` declares that it returns ``score + bias`` with a bias that does not depend
    on the score (SDPA then takes it as a float attn_mask)."""
    return _register("score_mod", name, params, description, prepare, None, additive)


def catalogue() -> dict[str, MaskDef]:
    """Every registered mask and score mod, built-ins first."""
    return dict(_DEFS)


def names(kind: str) -> list[str]:
    return [n for n, d in _DEFS.items() if d.kind == kind]


def _fmt(v) -> str:
    if isinstance(v, tuple):
        return "/".join(str(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)
