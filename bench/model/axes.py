"""The plain axes of a sweep, each one declaration.

A plain axis is a value of the case that the sweep takes the product over and hands to the
variant unchanged (``case.<name>``), with a default that rows written before it existed were
measured with.  Its declaration here is the only place it is written down: the ``Spec`` setting
(its flag, TOML key, check and help), the ``Case`` field, the product in ``Spec.cases``, the row's
column, the repro command's flag, the sweep id's compatibility, the report's facets and groups
and the summary table's columns all follow from it.  The other axes (lengths, batch, masks,
alignment, mixes, ...) shape each other and have code of their own in ``Spec.cases``.

An axis is declared before ``bench.model.case`` is imported: ``Case`` and ``Spec`` are built
from ``PLAIN`` then.  ``declare`` is how a script (or a test) adds one to a fresh interpreter.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Axis:
    name: str  # the case field, the setting and the row's column; the flag is --name-with-dashes
    default: str  # the case's value when the axis is not given (and a row's written before it existed)
    help: str
    parse: str | tuple | Callable  # how its values are read: a parser of bench.model.parsers by name ("texts"),
    # a factory of one with its arguments (("workload_spellings", "inputs")), or a callable parse(raw, spelt)
    metavar: str
    facet_after: str  # the report names its facet after this one (reports.frames.FACET_COLS)
    promote_after: str  # and promotes it to a group axis after this one (reports.groups.PROMOTE)


PLAIN: list[Axis] = [
    Axis("inputs", "normal", "structure of q, k and v: normal (the default), clustered[:K], lowrank[:R], "
         "outliers[:SCALE]", ("workload_spellings", "inputs"), "KIND", facet_after="mix", promote_after="kv"),
    Axis("kv_layout", "contiguous", "the KV cache: contiguous (the default), or paged:PAGE, pages of PAGE tokens in "
         "a shuffled block table", ("workload_spellings", "kv_layout"), "LAYOUT", facet_after="inputs",
         promote_after="align"),
]


def declare(axis: Axis) -> None:
    """Add a plain axis; only before ``bench.model.case`` is imported, since Case is built then."""
    if "bench.model.case" in sys.modules:
        raise RuntimeError(f"axis {axis.name!r}: declare it before bench.model.case is imported (Case and Spec are "
                           f"built from bench.model.axes.PLAIN when they are)")
    PLAIN.append(axis)


def placed(order, key: str) -> list[str]:
    """``order`` with each plain axis inserted after the name its ``key`` (facet_after or
    promote_after) gives, in declaration order."""
    out = list(order)
    for axis in PLAIN:
        after = getattr(axis, key)
        out.insert(out.index(after) + 1 if after in out else len(out), axis.name)
    return out
