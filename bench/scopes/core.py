"""The core scope: the variant's call alone on the case's q, k and v (every cell before scopes
existed), checked against the case's float64 reference, which the variants of a case share."""

from __future__ import annotations

from bench.model.scope import Scope


class CoreScope(Scope):
    names = ("core",)
    what = "the attention call alone"
    core_alone = True
    ranked = True  # a context-parallel variant's call, split over the case's ranks (bench.scopes.context)

    def processes(self, case) -> int:
        return case.ranks

    def flops(self, case) -> float:
        from bench.measure.flops import core_flops

        return core_flops(case)

    def work(self, case) -> dict:
        from bench.measure import flops
        from bench.model import masks

        return {**masks.row_columns(case), "flops": flops.core_flops(case), "bytes": flops.min_bytes(case)}

    def inputs(self, case):
        from bench.measure.bound import case_inputs

        return case_inputs(case)

    def reference(self, case, inputs, cache):
        (q, k, v), grad_out = inputs
        return cache.get(case, q, k, v, grad_out)

    def bind(self, variant, case, inputs):
        from bench.measure.bound import bind_core

        return bind_core(variant, case, inputs)

    def check(self, bound, case, result, inputs, cache, skip_reference: str = "", span=None):
        from bench.measure.correctness import check_form, determinism, guarded, run_and_check

        var, span = bound.variant, span or _no_span
        if case.ragged or case.mixed:  # how the variant held the batch: packed, nested, padded or a dense mask
            result.layout = result.extra.pop("layout", "packed")
        (q, k, v), grad_out = inputs
        if skip_reference:  # timed unchecked: the output's form is still checked, its values cannot be
            result.reference_skipped = skip_reference
            with bound.scope(), span("checked call"):
                guard = guarded(case, q, k, v, grad_out)
                check = guard.verdict(check_form(case, bound.fn(q, k, v)))
        else:
            with bound.scope(), span("checked call against the reference"):
                check = run_and_check(case, bound.fn, q, k, v, grad_out, self.reference(case, inputs, cache),
                                      var.error_budget, var.approximate)
        result.checked(check)
        outputs = getattr(check, "outputs", None) if check.ok else None
        if outputs is not None and case.device == "cpu":  # the same bits? from the timer's own calls, after it
            return outputs
        if outputs is not None:  # two more calls on its inputs: the same bits?
            with bound.scope(), span("determinism: two more calls"):
                same, diff = determinism(case, bound.fn, q, k, v, grad_out, outputs)
            result.deterministic, result.nondeterminism = same, None if same else diff
        return None


    def run_rank(self, variant, case, ctx, settings):
        from bench.scopes import context

        return context.run_rank(variant, case, ctx, settings)

    def reduce(self, measured: list, case=None, layout: str = "zigzag"):
        """One process: its own measurement; the ranks of a context-parallel cell: theirs put together
        (bench.scopes.context.reduce)."""
        if len(measured) == 1 and case is None:
            return measured[0]
        from bench.scopes import context

        return context.reduce(measured, case, layout)


def _no_span(name: str):
    import contextlib

    return contextlib.nullcontext()


SCOPE = CoreScope()
