"""The run folder's ``masks.json``: each mask of a sweep as its terms, parameters, definitions
and keep pattern at a small size, written by the sweep and drawn by the report.  Reading it
(``label``, ``unpack``) needs no torch: the report draws without importing it."""

from __future__ import annotations

import numpy as np

from bench.model.case import Case


def pattern(case: Case, size: int = 256):
    """The keep pattern of batch element 0, head 0 at q_len = kv_len = ``size``: float (size, size)."""
    import torch

    from bench.model import masks

    small = case.replace(q_len=size, kv_len=size, heads=1, kv_heads=1, lengths="fixed", mix="none")  # the mask,
    # not the batch
    keep = masks.bind(small).keep("cpu")
    if keep is None:
        return torch.ones(size, size)
    return keep[0, 0].float()


def label(mask_: str, window) -> str:
    """How reports name a mask: the spelling, with the window mask's size in brackets."""
    return mask_ + (f"({int(window)})" if window not in (None, "-") and window == window else "")


PIXELS = 256  # a picture's rows and columns, whatever length it shows
LENGTH_PARAMS = ("window", "prefix", "chunk", "block", "sinks", "width", "max_distance")  # sizes in tokens
MAX_PICTURE_N = 4096  # the longest length a picture is computed at (a bool n x n, pooled to PIXELS)


def picture_length(case: Case) -> int:
    """The length a mask's picture is drawn at: four times its largest size in tokens (a window of
    256 is a band at n = 1024, where at n = 256 it is causal), at least PIXELS."""
    from bench.model import masks

    ms, mods = masks.parse(case.mask, case.window)
    sizes = [int(v) for t in ms + mods for k, v in t.params if k in LENGTH_PARAMS and isinstance(v, (int, float))]
    longest = max(sizes, default=0)
    n = PIXELS
    while n < min(4 * longest, MAX_PICTURE_N):
        n *= 2
    return n


def picture(case: Case, size: int | None = None) -> dict:
    """What masks.json keeps of a case's mask: the definitions and parameters of its terms, its
    density at q_len = kv_len = ``size`` (picture_length by default), and that keep pattern
    (batch element 0, head 0) pooled to PIXELS x PIXELS (a pixel kept when any pair in it is) as
    one hex string per row (bit j of a row: column j kept)."""
    import torch

    from bench.model import masks

    try:
        size = size or picture_length(case)
        keep = pattern(case, size).bool()
    except masks.MaskError as exc:
        return {"mask": case.mask, "window": case.window, "size": size or PIXELS, "error": str(exc)}
    density = float(keep.float().mean())
    if size > PIXELS:
        f = size // PIXELS
        keep = keep.view(PIXELS, f, PIXELS, f).any(3).any(1)
    px = keep.shape[0]
    weights = 1 << torch.arange(3, -1, -1)
    nibbles = (keep.view(px, -1, 4).long() * weights).sum(-1)
    rows = ["".join("0123456789abcdef"[int(x)] for x in r) for r in nibbles]
    ms, mods = masks.parse(case.mask, case.window)
    return {"mask": case.mask, "window": case.window, "size": size, "density": density,
            "terms": [{"name": t.d.name, "kind": t.d.kind, "params": {k: list(v) if isinstance(v, tuple) else v
                                                                     for k, v in t.params},
                       "description": t.d.description} for t in ms + mods],
            "rows": rows}


def unpack(rows: list[str]) -> np.ndarray:
    """A picture's hex rows back to a bool (size, size) array."""
    bits = [[(int(c, 16) >> (3 - i)) & 1 for c in r for i in range(4)] for r in rows]
    return np.array(bits, dtype=bool)
