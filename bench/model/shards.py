"""How a context-parallel variant's sequence is split over a cell's ranks (``--ranks``; the variant
declares ``shard=``): which positions each rank holds, and why a length cannot be split.  Plain
arithmetic, read without torch (the registry refuses a case by it before anything runs)."""

from __future__ import annotations

SHARDS = ("zigzag", "contiguous")


def shard_spans(n: int, world: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """The [start, stop) spans of the ``n`` positions rank ``rank`` of ``world`` holds: zigzag, the
    chunks ``rank`` and ``2 world - 1 - rank`` of 2 world (a causal mask's work then falls evenly on
    the ranks); contiguous, chunk ``rank`` of ``world``."""
    if layout == "zigzag":
        size = n // (2 * world)
        return [(rank * size, (rank + 1) * size), ((2 * world - 1 - rank) * size, (2 * world - rank) * size)]
    size = n // world
    return [(rank * size, (rank + 1) * size)]


def shard_reason(case, layout: str) -> str | None:
    """Why ``case``'s lengths cannot be split evenly over its ranks (None when they can)."""
    parts = 2 * case.ranks if layout == "zigzag" else case.ranks
    for name, n in (("q_len", case.q_len), ("kv_len", case.kv_len)):
        if n % parts:
            return (f"{name} {n} does not split into {parts} equal chunks ({layout} over {case.ranks} ranks): "
                    f"give lengths divisible by {parts}")
    return None
