"""How a context-parallel cell splits its sequence (bench.scopes.context): each rank's shard, the
zigzag split's balance under a causal mask, and the gathered whole, on real tensors."""

import pytest
import torch

from bench.model.case import Case
from bench.model.shards import shard_reason, shard_spans
from bench.scopes.context import gather, take


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


def test_the_registry_refuses_what_its_split_or_its_world_cannot_take_before_anything_runs():
    from bench.api import discover

    registry = discover(entry_points=False)
    case = Case("cpu", "float32", 1, 4, 4, 36, 36, 16, "causal", None, "fwd", ranks=2)
    assert registry["cp.ring"].static_reason(case) is None  # 36 = 4 chunks of 9
    assert "8 equal chunks" in registry["cp.ring"].static_reason(case.replace(ranks=4))
    assert registry["cp.alltoall"].static_reason(case.replace(ranks=4)) is None  # contiguous: 4 of 9
    assert "runs in one process" in registry["naive"].static_reason(case)
    assert registry["naive"].static_reason(case.replace(ranks=1)) is None
    from bench.model.registry import available

    ok, why = available(registry["cp.ring"], case.replace(ranks=1), one_process=True)  # profile, selfcheck
    assert not ok and "--ranks" in why and available(registry["cp.ring"], case.replace(ranks=1))[0]
