"""How a context-parallel cell splits its sequence (bench.scopes.context): each rank's shard, the
zigzag split's balance under a causal mask, and the gathered whole, on real tensors."""

import pytest
import torch

from bench.model.case import Case
from bench.scopes.context import gather, shard_reason, shard_spans, take


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_shards_hold_every_position_once_and_gather_back_to_the_whole(layout, world):
    n = 48
    held = sorted(p for r in range(world) for a, b in shard_spans(n, world, r, layout) for p in range(a, b))
    assert held == list(range(n))
    x = torch.randn(2, 3, n, 5)
    shards = [take(x, shard_spans(n, world, r, layout)) for r in range(world)]
    assert all(s.shape == (2, 3, n // world, 5) for s in shards)
    assert torch.equal(gather(shards, n, layout), x)


def test_the_zigzag_split_gives_every_rank_the_same_causal_work_and_the_contiguous_one_does_not():
    n, world = 64, 4

    def pairs(layout, rank):  # (query, key) pairs a causal mask keeps for the rank's queries
        return sum(p + 1 for a, b in shard_spans(n, world, rank, layout) for p in range(a, b))

    zigzag = [pairs("zigzag", r) for r in range(world)]
    contiguous = [pairs("contiguous", r) for r in range(world)]
    assert len(set(zigzag)) == 1 and sum(zigzag) == n * (n + 1) // 2
    assert contiguous == sorted(contiguous) and contiguous[-1] > 3 * contiguous[0]


def test_a_length_that_does_not_split_evenly_is_refused_with_what_would():
    case = Case("cpu", "float32", 1, 4, 4, 60, 60, 16, "causal", None, "fwd", ranks=4)
    why = shard_reason(case, "zigzag")
    assert "q_len 60" in why and "divisible by 8" in why
    assert shard_reason(case, "contiguous") is None  # 60 = 4 x 15
