"""Speculative-decoding trees (issue 28, part 3): a draft tree of T tokens verified in one call.
Each draft token sees the whole cache, its ancestors in the tree and itself; the tree masks count
exactly, every variant that takes any mask computes them against the float64 reference, and a
kernel that lets a sibling through fails."""

from __future__ import annotations

import pytest
import torch

from bench.cli import main
from bench.measure.bound import bind_variant
from bench.measure.correctness import check, reference, run_and_check
from bench.model import masks
from bench.model.case import Case
from bench.model.mask_catalog import tree_shape
from tests.conftest import check_every_variant, eager_flex

PARENTS = (-1, 0, 0, 1, 1, 2, 2)  # a binary tree of depth 3: 0 -> (1, 2), 1 -> (3, 4), 2 -> (5, 6)
CACHE = 33


def _case(spelling, q=7, kv=CACHE + 7, direction="fwd"):
    return Case(batch=2, heads=4, kv_heads=2, q_len=q, kv_len=kv, head_dim=16, mask=masks.canonical(spelling)[0],
                align="bottom-right", direction=direction)


def _ancestors(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def test_each_draft_token_sees_the_cache_its_ancestors_and_itself():
    case = _case("tree:parents=" + "/".join(map(str, PARENTS)))
    keep = masks.bind(case).keep()[0, 0]
    for i in range(7):
        seen = {j for j in range(case.kv_len) if keep[i, j]}
        assert seen == set(range(CACHE)) | {CACHE + a for a in _ancestors(PARENTS, i)}, i
    # no sibling, no cousin: token 3 (under 1) does not see 4 (its sibling) nor 2 (its uncle)
    assert not keep[3, CACHE + 4] and not keep[3, CACHE + 2] and keep[3, CACHE + 1]
    depth = [1, 2, 2, 3, 3, 3, 3]
    assert masks.bind(case).counts == (2 * 4 * sum(CACHE + d for d in depth), CACHE + 1)
    # the catalogue's binary tree over 7 queries is this tree, counted the same
    assert tree_shape("branch", 7, 2) == PARENTS
    assert masks.bind(_case("tree_binary")).counts == masks.bind(case).counts
    assert tree_shape("chain", 4) == (-1, 0, 1, 2)
    assert tree_shape("topk", 12, 4) == (-1,) * 4 + (0,) * 4 + (4,) * 4  # 4 candidates x depth 3


def test_a_chain_is_bottom_right_causal():
    chain, causal = masks.bind(_case("tree_chain", q=4)), masks.bind(_case("causal", q=4))
    assert torch.equal(chain.keep().expand(2, 4, 4, 40), causal.keep().expand(2, 4, 4, 40))
    assert chain.counts == causal.counts


@pytest.mark.parametrize("spelling", ["tree:parents=-1/0/0/1/1/2/2", "tree_topk:3", "tree_binary+alibi"])
@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_every_variant_that_takes_the_tree_computes_it(registry, spelling, direction):
    """naive and chunked.online natively, the SDPA family from a bool mask; flex (eager, its reference
    implementation) from its block mask below; a variant that declares its masks says it does not."""
    case = _case(spelling, q=7 if "parents" in spelling else 9, direction=direction)
    assert {"naive", "chunked.online", "sdpa.math"} <= set(check_every_variant(registry, case))
    assert registry["window.chunked"].static_reason(case).startswith("mask tree")  # it takes window alone


def test_eager_flex_reads_the_tree_through_its_block_mask():
    case = _case("tree_topk:4", q=12, kv=140)
    out, (q, k, v) = eager_flex(case)
    assert check(case, out, reference(case, q, k, v).out).ok


def test_a_kernel_that_lets_a_sibling_through_fails(registry):
    case = _case("tree_binary")
    q, k, v = bind_variant(registry["naive"], case).inputs
    keep = masks.bind(case).keep().clone()
    keep[..., 3, CACHE + 4] = True  # token 3 sees its sibling 4

    def leaky(q, k, v):
        k, v = (x.repeat_interleave(2, dim=1) for x in (k, v))
        scores = (q @ k.transpose(-1, -2)) * case.scale
        return scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v

    result = run_and_check(case, leaky, q, k, v, ref=reference(case, q, k, v))
    assert not result.ok and result.kind == "mismatch-values"
    keep[..., 3, CACHE + 4] = False
    assert run_and_check(case, leaky, q, k, v).ok  # the same kernel with the tree's mask passes


@pytest.mark.parametrize("args, says", [
    (["--masks", "tree:parents=-1/0/0", "--seq-lens", "4", "--kv-lens", "64"],
     "a tree of 3 tokens (parents=-1/0/0) verifies 3 queries; this case has q_len 4"),
    (["--masks", "tree:parents=-1/2/0", "--seq-lens", "3", "--kv-lens", "64"],
     "parents[1]=2: a token's parent comes before it (-1 <= parent < 1"),
    (["--masks", "tree:parents=-2/0", "--seq-lens", "2", "--kv-lens", "64"], "parents -1 to 1023"),
    (["--masks", "tree_binary", "--seq-lens", "2048"], "at most 1024 draft tokens"),
    (["--masks", "tree_topk:0", "--seq-lens", "8"], "width 1 to 1024"),
])
def test_bad_trees_say_what_is_valid(capsys, args, says):
    assert main(["sweep", "--variants", "naive", "--align", "br", "--device", "cpu", "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
