"""``bind(variant, case)``: a variant set up for a case, with its inputs and the call to time.

Every caller that runs a variant goes through it: the sweep's cells, the profiler, the
self-check and the pytest-benchmark suite.  The setup (``variant.prepare``) is timed here,
outside any timed call; ``timed(direction)`` is the call a timer repeats, built inside the
variant's scope (a ``bwd`` call runs its forward once, there)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.measure.inputs import make_grad_out, make_inputs
from bench.measure.timing import timed_call
from bench.model.case import Case
from bench.model.registry import Prepared, Variant


@dataclass
class BoundVariant:
    variant: Variant
    case: Case
    prepared: Prepared
    inputs: tuple  # q, k, v
    grad_out: object  # the upstream gradient of a case with a backward, else None
    setup_ms: float

    def scope(self):
        """The variant's scope (e.g. a pinned SDPA backend), to hold open around its calls."""
        return self.prepared.scope()

    @property
    def fn(self) -> Callable:
        return self.prepared.fn

    def timed(self, direction: str | None = None) -> Callable[[], object]:
        """The call to time for the case's direction (or ``direction``); call it inside ``scope()``."""
        case = self.case if direction is None else self.case.replace(direction=direction)
        return timed_call(case, self.prepared.fn, *self.inputs, self.grad_out)


def case_inputs(case: Case) -> tuple[tuple, object]:
    """(q, k, v) and the upstream gradient (None without a backward) of a case."""
    return make_inputs(case), (make_grad_out(case) if case.needs_grad else None)


def bind_variant(variant: Variant, case: Case, inputs: tuple[tuple, object] | None = None):
    """Set ``variant`` up for ``case`` (timing the setup) as the case's scope binds it
    (bench.model.scope): a core case on ``inputs`` (``case_inputs``; made here when not given: the
    cells of one case share theirs), a layer on its own inputs and weights."""
    from bench.model import scope

    return scope.of(case).bind(variant, case, inputs)


def bind_core(variant: Variant, case: Case, inputs: tuple[tuple, object] | None = None) -> BoundVariant:
    """The core scope's binding: ``variant.prepare(case)`` (timed) on ``inputs``."""
    (q, k, v), grad_out = inputs if inputs is not None else case_inputs(case)
    t0 = time.perf_counter()
    prepared = variant.prepare(case)
    return BoundVariant(variant, case, prepared, (q, k, v), grad_out, (time.perf_counter() - t0) * 1e3)
