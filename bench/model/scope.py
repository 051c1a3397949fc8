"""A scope: what a cell times around a variant's attention call (``--scope``), as one protocol.

The engine runs every cell the same way: the case's shared inputs and reference, each variant
bound to the case, checked, timed in interleaved rounds with its parts, and its figures reduced
into one measurement.  What differs from one scope to the next is asked of the case's ``Scope``
and of nothing else: no module outside ``bench/scopes/`` tests a scope by name.

The built-in scopes are declared in bench/model/features.py (``scopes``, ``"module:NAME"`` of a
``Scope``): ``core`` (the call alone, bench/scopes/core.py) and ``block``, ``encoder`` and
``decoder`` (the seeds' layers around it, bench/scopes/layer.py).  A plugin file (``--plugin``)
adds its own with ``register(scope)``; the sweep's workers load the same files, so its cells run
there as the built-in ones do.

A scope module is imported when the flags are read: it imports torch inside its methods only.
"""

from __future__ import annotations

import functools
from typing import Any

# the Case fields a scope's own axes set (bench.model.case); a scope that does not declare one leaves it at its default
SCOPE_FIELDS = {"ffn": ("none", "feed-forward network")}  # field: (its default, what it is)


class ScopeError(ValueError):
    pass


class ScopeFieldError(ValueError):
    """A case field that does not fit its scope (bench.model.case makes it a CaseError)."""

    def __init__(self, field: str, value, valid: str):
        super().__init__(valid)
        self.field, self.value, self.valid = field, value, valid


class Scope:
    """The protocol, with the defaults of a scope that runs in one process and times the whole call
    alone.  ``names``: the ``--scope`` values it serves; ``axes``: the Spec settings it adds (and the
    Case fields of SCOPE_FIELDS they set); ``core_alone``: its cell times the variant's own call on the
    case's inputs (the per-batch steps and the re-timing of held cases ask it)."""

    names: tuple[str, ...] = ()
    what: str = ""
    axes: tuple[str, ...] = ()
    core_alone: bool = False
    ranked: bool = False  # its cells may run over several ranks (--ranks; bench.scopes.context)

    # -- the case (no torch) -----------------------------------------------------------------------
    def processes(self, case) -> int:
        """How many processes one cell of ``case`` needs (each its own slot's share)."""
        return 1

    def validate(self, case) -> None:
        """Raise ScopeFieldError (or CaseError) where ``case``'s scope fields do not fit the scope (by
        default: each field of SCOPE_FIELDS that none of its axes sets is at its default)."""
        if case.ranks != 1 and not self.ranked:
            raise ScopeFieldError("ranks", case.ranks, f"scope {case.scope} runs in one process: ranks 1")
        for name, (default, what) in SCOPE_FIELDS.items():
            if name not in self.axes and getattr(case, name) != default:
                raise ScopeFieldError(name, getattr(case, name), f"scope {case.scope} has no {what}: {name} {default}")

    def fields(self, case_scope: str, settings, width: int) -> dict:
        """The values of SCOPE_FIELDS for a case of this scope from the sweep's settings (``Spec``), at a
        model width (d_model = heads x head_dim) of ``width``."""
        return {name: default for name, (default, _) in SCOPE_FIELDS.items()}

    def reason(self, case) -> str | None:
        """Why the scope cannot take ``case`` (None when it can)."""
        return None

    def cores(self, case) -> dict:
        """The variant's attention calls in a cell of ``case``, as core cases: {name: Case}."""
        return {"core": case}

    def core_label(self, case, name: str) -> str:
        """How a refusal names the call ``name`` of ``cores(case)``."""
        return "its attention"

    def parts(self, case) -> tuple[str, ...]:
        """The parts timed beside the whole, each a timer of its own in the same rounds (none by default)."""
        return ()

    def flops(self, case) -> float:
        raise NotImplementedError

    def work(self, case) -> dict:
        """The row's work columns of ``case`` (its mask's columns, ``flops`` and, where counted, ``bytes``)."""
        raise NotImplementedError

    # -- the worker (torch inside) -----------------------------------------------------------------
    def inputs(self, case) -> Any:
        """The inputs every variant of the case shares, or None where each binding makes its own."""
        return None

    def reference(self, case, inputs, cache) -> Any:
        """The float64 reference the variants of the case share (computed once), or None where each
        check computes its own."""
        return None

    def bind(self, variant, case, inputs):
        """``variant`` set up for ``case``: an object with ``scope()``, ``timed(direction)``, ``prepared``,
        ``setup_ms``, ``fn``, and ``part_calls(only=)`` where the scope has parts."""
        raise NotImplementedError

    def check(self, bound, case, result, inputs, cache, skip_reference: str = "", span=None):
        """Check ``bound`` and fill ``result`` (bench.engine.result.CellResult: ``checked``, the
        determinism), each step inside ``span(name)`` where given (bench.engine.spans); return the
        checked call's outputs to hold against the timer's own calls (the CPU's determinism), or None."""
        raise NotImplementedError

    def run_rank(self, variant, case, ctx, settings) -> Any:
        """On rank ``ctx.rank`` of a cell's process group: ``variant`` bound to its shard of ``case``,
        its checked call and its timing, as what the rank measured (its part of ``reduce``)."""
        raise ScopeError(f"scope {case.scope} runs in one process")

    def reduce(self, measured: list, case=None, layout: str = "zigzag") -> Any:
        """One measurement from what the cell's processes measured, one each, in rank order (one
        process: its own); ``layout``: how a context-parallel variant split the case's sequence."""
        if len(measured) != 1:
            raise ScopeError(f"a scope of one process got {len(measured)} measurements")
        return measured[0]


_REGISTERED: dict[str, Scope] = {}


@functools.cache
def _declared() -> dict[str, Scope]:
    from bench.model.features import declared

    return {name: s for s in declared("scopes") for name in s.names}


def register(scope: Scope) -> Scope:
    """Add ``scope`` for its ``names`` (a plugin file's, at its import); a name a built-in scope serves
    is refused, and the same scope registered again (its file loaded twice) replaces itself."""
    if not scope.names:
        raise ScopeError(f"scope {type(scope).__name__} names no --scope value (names = ('name',))")
    for name in scope.names:
        if name in _declared():
            raise ScopeError(f"scope {name!r} is built in; a plugin's scope takes another name")
        held = _REGISTERED.get(name)
        if held is not None and type(held).__qualname__ != type(scope).__qualname__:
            raise ScopeError(f"scope {name!r} is registered twice ({type(held).__qualname__}, "
                             f"{type(scope).__qualname__})")
    _REGISTERED.update(dict.fromkeys(scope.names, scope))
    return scope


def names() -> tuple[str, ...]:
    """Every ``--scope`` value, the built-in ones first."""
    return tuple(_declared()) + tuple(n for n in _REGISTERED if n not in _declared())


def named(name: str) -> Scope:
    found = _declared().get(name) or _REGISTERED.get(name)
    if found is None:
        raise ScopeError(f"scope {name!r}: valid: {', '.join(names())}")
    return found


def of(case) -> Scope:
    """The scope of ``case``."""
    return named(case.scope)


__all__ = ["SCOPE_FIELDS", "Scope", "ScopeError", "ScopeFieldError", "named", "names", "of", "register"]
