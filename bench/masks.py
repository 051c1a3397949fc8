"""The plugin API's stable import path for masks and score mods (``bench.model.masks`` holds
them): defining one (``mask``, ``score_mod``,
``sink_logit``), declaring what a variant takes (``ANY``,
``ADDITIVE``), and building a case's mask in the forms a variant needs (``bind(case)``: its
dense keep mask, FlexAttention's mask_mod and score_mod, the additive bias), with the helpers
the built-in variants use."""

from bench.model.masks import (
    ADDITIVE,
    ANY,
    CaseMask,
    MaskError,
    bind,
    dense_keep,
    density,
    has_empty_rows,
    indices,
    kept_pairs,
    kv_lengths,
    mask,
    masked_softmax,
    per_sequence,
    score_mod,
    sink_logit,
)

__all__ = ["ADDITIVE", "ANY", "CaseMask", "MaskError", "bind", "dense_keep", "density", "has_empty_rows", "indices",
           "kept_pairs", "kv_lengths", "mask", "masked_softmax", "per_sequence", "score_mod",
           "sink_logit"]
