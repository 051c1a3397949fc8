"""A layer's feed-forward network, as a case spells it (``--ffn``, the Case field ``ffn``): ``mlp:D_FF``
(two linear maps around a ReLU, LayerNorm after each residual: the seeds' form) or ``swiglu:D_FF``
(gate, up and down maps, RMSNorm before each sublayer: llama's); ``none`` where the scope has none.
The layers themselves are bench.scopes.layer's."""

from __future__ import annotations

from bench.model import digits

FFN_KINDS = {"mlp": 2, "swiglu": 3}  # kind: its weight matrices of d_model x d_ff
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
