"""Attention inside the layer it serves (``--scope``): the seeds' multi-head module and the
encoder and decoder layers around a variant's core, as shapes, parts and FLOPs.

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
or ``swiglu:D_FF`` (gate, up and down maps, RMSNorm before each sublayer: llama's).  The
tensors live in ``bench.measure.layer``; this module has no torch.
"""

from __future__ import annotations

from bench.model import digits

SCOPES = ("core", "block", "encoder", "decoder")
FFN_KINDS = {"mlp": 2, "swiglu": 3}  # kind: its weight matrices of d_model x d_ff
CROSS_MASK = "padding"  # the decoder's cross-attention: the encoder output's padding
# a layer's parts, in the order a layer runs them; norms are every residual add and norm together
PARTS = ("qkv", "core", "core_cross", "out", "norms", "ffn")
LINEAR_FACTOR = {"fwd": 1.0, "bwd": 2.0, "fwd+bwd": 3.0}  # a linear map's backward: the input's and the weight's
# the widest FFN a --ffn names: 16x the widest published model's (Llama 3.1 405B, d_ff 53,248) and as wide as
# --ffn-mult's largest multiple (64) of a d_model of 16,384
MAX_D_FF = 1 << 20


class LayerError(ValueError):
    pass


def parse_ffn(text: str) -> tuple[str, int]:
    """``mlp:2048`` -> ("mlp", 2048); a LayerError says what is valid (D_FF in ASCII digits, 1 to MAX_D_FF)."""
    kind, _, size = str(text).strip().lower().partition(":")
    if kind not in FFN_KINDS or not digits.is_digits(size) or not 1 <= int(size) <= MAX_D_FF:
        raise LayerError(f"--ffn {text}: valid: {' or '.join(f'{k}:D_FF' for k in FFN_KINDS)} with D_FF a whole "
                         f"number from 1 to {MAX_D_FF:,} in {digits.ASCII}, e.g. mlp:2048 or swiglu:14336")
    return kind, int(size)


def ffn_text(text: str) -> str:
    kind, size = parse_ffn(text)
    return f"{kind}:{size}"


def d_model(case) -> int:
    return case.heads * case.head_dim


def widths(case) -> dict:
    """d_model and the widths of q, k, v and the merged heads."""
    return {"d": d_model(case), "q": case.heads * case.head_dim, "k": case.kv_heads * case.head_dim,
            "v": case.kv_heads * case.dv, "o": case.heads * case.dv}


def parts(case) -> tuple[str, ...]:
    """The parts a scope's layer has, in PARTS order (``core`` alone for the core scope)."""
    if case.scope == "core":
        return ("core",)
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
    if case.scope == "core":
        return None
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
