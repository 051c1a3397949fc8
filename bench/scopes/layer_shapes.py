"""Attention inside the layer it serves (``--scope``): the seeds' multi-head module and the
encoder and decoder layers around a variant's core, as shapes, parts and FLOPs (their scope is
bench.scopes.layer's).

- ``core``: the attention call alone (every variant's cell before scopes existed).
- ``block``: the multi-head module: x projected into Q, K and V (K and V from a memory of
  kv_len tokens when kv_len differs), heads split off, the core, heads merged, the output
  projection.  No norm, no residual.
- ``encoder``: the block as self-attention, Add & Norm, a feed-forward network, Add & Norm.
- ``decoder``: masked self-attention (the case's mask), Add & Norm, cross-attention whose K and
  V come from an encoder output of kv_len tokens under the source padding mask, Add & Norm,
  the FFN, Add & Norm.

The width is d_model = heads x head_dim; K and V are kv_heads wide (GQA).  The FFN is spelt
``mlp:D_FF`` (two linear maps around a ReLU, LayerNorm after each residual: the seeds' form)
or ``swiglu:D_FF`` (gate, up and down maps, RMSNorm before each sublayer: llama's;
bench.model.ffn).  The tensors, the timed parts and the check live in bench.scopes.layer_run, which
the scope's methods import in the worker; this module has no torch (the flags are read with it).
"""

from __future__ import annotations

from bench.model.ffn import FFN_KINDS, MAX_D_FF, LayerError, ffn_text, parse_ffn  # noqa: F401  (the FFN's spelling)

SCOPES = ("block", "encoder", "decoder")
CROSS_MASK = "padding"  # the decoder's cross-attention: the encoder output's padding
# a layer's parts, in the order a layer runs them; norms are every residual add and norm together
PARTS = ("qkv", "core", "core_cross", "out", "norms", "ffn")
LINEAR_FACTOR = {"fwd": 1.0, "bwd": 2.0, "fwd+bwd": 3.0}  # a linear map's backward: the input's and the weight's


def d_model(case) -> int:
    return case.heads * case.head_dim


def widths(case) -> dict:
    """d_model and the widths of q, k, v and the merged heads."""
    return {"d": d_model(case), "q": case.heads * case.head_dim, "k": case.kv_heads * case.head_dim,
            "v": case.kv_heads * case.dv, "o": case.heads * case.dv}


def parts(case) -> tuple[str, ...]:
    """The parts a scope's layer has, in PARTS order."""
    if case.scope == "block":
        return ("qkv", "core", "out")
    if case.scope == "encoder":
        return ("qkv", "core", "out", "norms", "ffn")
    return PARTS


def core_cases(case) -> dict:
    """The attention calls of a layer case as core cases: {"core": self (or the block's cross),
    "core_cross": the decoder's cross-attention over the encoder output, under its padding}."""
    core = case.replace(scope="core", ffn="none")
    if case.scope == "decoder":
        return {"core": core.replace(kv_len=case.q_len, align="top-left"),
                "core_cross": core.replace(mask=CROSS_MASK, window=None, align="top-left")}
    return {"core": core}


def reason(case) -> str | None:
    """Why a layer scope cannot take the case (None when it can)."""
    if case.scope == "encoder" and case.q_len != case.kv_len:
        return (f"an encoder layer attends over its own tokens: kv_len = q_len; got q_len {case.q_len}, kv_len "
                f"{case.kv_len} (scope block or decoder takes a memory of other length)")
    if case.mixed or case.ragged or case.paged:
        return f"scope {case.scope} is modelled on a fixed, contiguous batch: --lengths, --batch-mix and " \
               f"--kv-layout take scope core"
    if case.dtype == "float8_e4m3fn":
        return f"scope {case.scope}: the layer's projections and FFN take float32, float16 or bfloat16; " \
               f"float8_e4m3fn is a core dtype here"
    if case.scope == "decoder" and case.align != "top-left":
        return "a decoder layer's self-attention is its own tokens' (top-left); --align bottom-right takes scope core"
    return None


# -- FLOPs --------------------------------------------------------------------------------------------------

def part_flops(case) -> dict:
    """Each part's FLOPs for the case's direction (a float), from the formulas: projections
    2 n d (d_q + d_k + d_v) (K and V over the memory's m tokens in cross-attention), output
    2 n d_o d, FFN 2 n d d_ff k (k = 2, or 3 for SwiGLU), the core's as a core cell's (its mask
    counted).  Norms and residual adds are not counted (None): elementwise, bound by memory."""
    w, b, n, m = widths(case), case.batch, case.q_len, case.kv_len
    lin = LINEAR_FACTOR[case.direction]
    from bench.measure.flops import core_flops

    cores = {name: core_flops(c) for name, c in core_cases(case).items()}
    if case.scope == "decoder":  # self: all over n; cross: q over n, k and v over the encoder's m
        qkv = 2 * b * w["d"] * (n * (w["q"] + w["k"] + w["v"]) + n * w["q"] + m * (w["k"] + w["v"]))
        out = 2 * 2 * b * n * w["o"] * w["d"]
    else:
        qkv = 2 * b * w["d"] * (n * w["q"] + m * (w["k"] + w["v"]))
        out = 2 * b * n * w["o"] * w["d"]
    got = {"qkv": qkv * lin, **cores, "out": out * lin}
    if case.scope in ("encoder", "decoder"):
        kind, d_ff = parse_ffn(case.ffn)
        got |= {"norms": None, "ffn": 2 * b * n * w["d"] * d_ff * FFN_KINDS[kind] * lin}
    return {p: got[p] for p in parts(case)}


def layer_flops(case) -> float:
    """The whole layer's counted FLOPs (the sum of ``part_flops``)."""
    return float(sum(v for v in part_flops(case).values() if v))
