"""The layer scopes (``--scope block``, ``encoder``, ``decoder``): the seeds' multi-head module and the
encoder and decoder layers around a variant's core, as bench.model.scope's protocol asks.

Their shapes, parts and FLOPs are bench.scopes.layer_shapes's (no torch: the flags are read with
them); their tensors, the timed parts and the float64 layer's check are bench.scopes.layer_run's,
which the worker's methods import.
"""

from __future__ import annotations

from bench.model.case import CaseError
from bench.model.scope import Scope
from bench.scopes.layer_shapes import (  # noqa: F401  (the layer's shapes, as the scope's module gives them)
    CROSS_MASK,
    FFN_KINDS,
    LINEAR_FACTOR,
    MAX_D_FF,
    PARTS,
    SCOPES,
    LayerError,
    core_cases,
    d_model,
    ffn_text,
    layer_flops,
    parse_ffn,
    part_flops,
    parts,
    reason,
    widths,
)

# -- the scope ------------------------------------------------------------------------------------------------

class LayerScope(Scope):
    """The seeds' layers around the variant's core: each binding makes its own inputs and weights and
    checks the whole layer against a float64 layer on the same weights; its parts are timed beside it."""

    names = SCOPES
    what = "the core inside the seeds' multi-head block, encoder and decoder layers"
    axes = ("ffn", "ffn_mult")

    def validate(self, case) -> None:
        if case.scope == "block":  # no FFN in it
            if case.ffn != "none":
                raise CaseError("ffn", case.ffn, f"scope {case.scope} has no feed-forward network: ffn none")
            return
        if case.ffn == "none":
            raise CaseError("ffn", case.ffn, f"scope {case.scope} has a feed-forward network: mlp:D_FF or swiglu:D_FF")
        try:
            object.__setattr__(case, "ffn", ffn_text(case.ffn))
        except LayerError as exc:
            raise CaseError("ffn", case.ffn, str(exc), message=str(exc)) from None

    def fields(self, case_scope: str, settings, width: int) -> dict:
        """A layer's FFN: --ffn, or an MLP --ffn-mult times d_model wide; none in the block."""
        if case_scope == "block":
            return {"ffn": "none"}
        if settings.ffn:
            return {"ffn": settings.ffn}
        d_ff = max(1, round(settings.ffn_mult * width))
        if d_ff > MAX_D_FF:
            raise LayerError(f"--ffn-mult {settings.ffn_mult:g} x d_model {width:,} gives an FFN {d_ff:,} wide, "
                             f"past the widest a layer takes ({MAX_D_FF:,}); give a smaller --ffn-mult, fewer heads "
                             f"or a smaller head dim, or --ffn mlp:D_FF")
        return {"ffn": f"mlp:{d_ff}"}

    def reason(self, case) -> str | None:
        return reason(case)

    def cores(self, case) -> dict:
        return core_cases(case)

    def core_label(self, case, name: str) -> str:
        return f"{'its cross-attention' if name == 'core_cross' else 'its attention'} in scope {case.scope}"

    def parts(self, case) -> tuple[str, ...]:
        return parts(case)

    def flops(self, case) -> float:
        return layer_flops(case)

    def work(self, case) -> dict:  # its self-attention core's mask, the layer's counted FLOPs
        from bench.model import masks

        return {**masks.row_columns(core_cases(case)["core"]), "flops": layer_flops(case)}

    def bind(self, variant, case, inputs):
        from bench.scopes.layer_run import bind_layer

        return bind_layer(variant, case)

    def check(self, bound, case, result, inputs, cache, skip_reference: str = "", span=None):
        """The whole against the float64 layer, then twice more for the same bits."""
        with bound.scope():
            check = bound.check(bound.variant.approximate)
        result.checked(check)
        if check.ok:
            with bound.scope():
                result.deterministic, result.nondeterminism = bound.determinism()
        return None


SCOPE = LayerScope()
