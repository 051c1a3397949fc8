"""Registry-driven: every variant available on this machine, against the float64 reference,
for every mask it declares, forward and (where declared) gradients.  A new variant file
gets these tests without writing any."""

import pytest
import torch

from bench.api import discover
from bench.case import Case
from bench.measure.correctness import TOLERANCES, reference, run_and_check
from bench.measure.inputs import make_grad_out, make_inputs
from bench.model import masks
from bench.registry import available

REGISTRY = discover(entry_points=False)
SHAPES = [  # (q_len, kv_len, heads, kv_heads)
    (96, 96, 4, 4),     # self-attention
    (40, 136, 4, 2),    # cross, more keys than queries, GQA
    (150, 45, 4, 1),    # cross, more queries than keys (window: queries that see no key), MQA
]


# the built-in masks at parameters that bite at these lengths; a plugin's mask runs at its defaults
SPELLINGS = {"window": "window", "document": "document:3", "prefix_lm": "prefix_lm:20",
             "chunked_causal": "chunked_causal:16", "dilated": "dilated:3:window=6", "sink": "sink:2+window:12",
             "bigbird": "bigbird:8:random=1", "tree": "tree_topk:3"}  # tree's parents fit one q_len: a shape

# score mods on top of masks: a cap of 1 changes typical scores (|s| ~ 1)
WITH_MODS = ["causal+softcap:1", "causal+alibi", "document:3:causal=1+rel_bias:16", "bigbird:8+alibi+softcap:2",
             "window+learned_sink:mean=1"]


# masks whose parameters are a whole batch's shape, which --batch-mix builds: tests/model/test_mix.py runs every
# variant on them, at the shapes they describe
SHAPED = {"varlen"}


def _spellings(v) -> list[str]:
    declared = [m for m in masks.names("mask") if m not in SHAPED] if masks.ANY in v.masks else list(v.masks)
    out = [SPELLINGS.get(m, m) for m in declared]
    if v.score_mods:  # every variant that takes score mods meets each mod, and its refusals say why
        out += WITH_MODS
    return out


# variants that compile every cell (about 7 s each with a cold inductor cache): a mask with a
# parameter and a mask with a score mod, one cell each, the shapes taken in turn.  How Flex reads
# every mask and score mod of the catalogue is checked uncompiled (the same mask_mod and
# score_mod, eager flex_attention) in tests/model/test_masks.py, and the compiled path meets the mask
# algebra, a ragged batch, a paged cache and bottom-right alignment in tests/model/test_alignment.py and
# tests/model/test_workload.py; a sweep checks each compiled cell against the reference before timing it.
COMPILED = {"flex"}
COMPILED_SPELLINGS = ("window", "causal+softcap:1")


def _cells():
    for v in REGISTRY:
        if v.shard:  # context-parallel: run over ranks, in tests/variants/test_cp.py
            continue
        spellings = _spellings(v)
        if v.name in COMPILED:
            spellings = [sp for sp in spellings if sp in COMPILED_SPELLINGS]
        for i, spelling in enumerate(spellings):
            mask, window = masks.canonical(spelling, window=24)
            for q_len, kv_len, heads, kv_heads in SHAPES:
                for direction in ("fwd", "fwd+bwd"):
                    for dtype in ("float32", "bfloat16"):
                        if dtype == "bfloat16" and (q_len, kv_len) != SHAPES[0][:2]:
                            continue
                        if v.name in COMPILED and ((q_len, kv_len, heads, kv_heads) != SHAPES[i % len(SHAPES)]
                                                   or dtype != "float32"):
                            continue
                        yield pytest.param(v.name, Case(
                            "cpu", dtype, 2, heads, kv_heads, q_len, kv_len, 32, mask, window, direction),
                            id=f"{v.name}-{spelling}-{q_len}x{kv_len}-h{heads}/{kv_heads}-{direction}-{dtype}")


@pytest.mark.parametrize("name, case", list(_cells()))
def test_variant_matches_float64_reference(name, case):
    v = REGISTRY[name]
    ok, why = available(v, case)
    if not ok:
        assert why, "an unavailable variant must say why"
        pytest.skip(why)
    q, k, vv = make_inputs(case)
    if v.approximate:  # logits of spread 0.25, where the approximations are meant to hold (at 1 FAVOR+ does not)
        with torch.no_grad():
            q.mul_(0.5)
            k.mul_(0.5)
    grad_out = make_grad_out(case) if case.needs_grad else None
    result = run_and_check(case, v.prepare(case).fn, q, k, vv, grad_out, None, v.error_budget, v.approximate)
    assert result.ok, result.reason
    if v.approximate:  # within its declared budget, its errors measured
        assert result.rel_err <= (v.error_budget or float("inf")) and -1 <= result.cosine <= 1
    else:
        assert result.max_abs_err < TOLERANCES[case.dtype][0][0] + TOLERANCES[case.dtype][0][1] * 10
        assert result.rel_err < 1e-2 and result.cosine > 0.9999
    if case.needs_grad:
        assert set(result.grad_errors) == {"dq", "dk", "dv"} and result.grad_rel_err is not None


def test_an_exact_variant_keeps_the_strict_tolerance_and_an_approximate_one_its_budget():
    from bench.measure.correctness import check

    case = Case("cpu", "float32", 1, 2, 2, 32, 32, 16, "causal", None, "fwd")
    q, k, v = make_inputs(case)
    ref = reference(case, q, k, v)
    off = ref.out * 1.001  # 0.1% off everywhere: far beyond float32's tolerance, well within 1%
    assert not check(case, off, ref.out).ok  # exact: elementwise tolerance
    assert not check(case, off, ref.out, error_budget=0.01).ok  # a budget does not loosen an exact variant
    within = check(case, off, ref.out, error_budget=0.01, approximate=True)
    assert within.ok and within.rel_err == pytest.approx(0.001, rel=1e-6) and within.cosine == pytest.approx(1.0)
    beyond = check(case, ref.out * 1.1, ref.out, error_budget=0.01, approximate=True)
    assert not beyond.ok and "error budget 0.01" in beyond.reason
    assert check(case, ref.out * 1.5, ref.out, approximate=True).ok  # no budget: better than zeros is enough
    worse = check(case, ref.out * 5, ref.out, approximate=True)  # relative error 4: answering zeros does better
    assert not worse.ok and worse.reason.startswith("worse than returning zeros") and "4" in worse.reason
    assert not check(case, ref.out * float("nan"), ref.out, approximate=True).ok  # but never non-finite


def test_reference_is_chunk_independent(monkeypatch):
    """Blocking the reference over queries must not change it."""
    import bench.measure.correctness as ref_mod

    case = Case("cpu", "float32", 2, 4, 2, 70, 50, 16, "window", 8, "fwd+bwd")
    q, k, v = make_inputs(case)
    g = make_grad_out(case)
    whole = reference(case, q, k, v, g)
    monkeypatch.setattr(ref_mod, "BLOCK_ELEMENTS", 2 * 4 * 50 * 7)  # 7 query rows per block
    blocked = reference(case, q, k, v, g)
    assert torch.allclose(whole.out, blocked.out)
    for a, b in zip(whole.grads, blocked.grads):
        assert torch.allclose(a, b)


def test_large_cases_check_an_exact_slice(monkeypatch):
    """Past FULL_CHECK_LIMIT the reference covers batch {0, B-1} x the first KV group; that
    slice equals the same slice of the full reference, and errors there are caught."""
    import bench.measure.correctness as ref_mod

    case = Case("cpu", "float32", 3, 4, 2, 40, 30, 16, "padding", None, "fwd+bwd")
    q, k, v = make_inputs(case)
    g = make_grad_out(case)
    full = reference(case, q, k, v, g)
    monkeypatch.setattr(ref_mod, "FULL_CHECK_LIMIT", 100)
    part = reference(case, q, k, v, g)
    assert part.batches == [0, 2] and part.out.shape == (2, 2, 40, 16)
    assert torch.allclose(part.out, full.out[[0, 2]][:, :2])
    assert torch.allclose(part.grads[1], full.grads[1][[0, 2]][:, :1])  # dk of KV head 0
    sdpa = REGISTRY["sdpa.math"].prepare(case).fn
    assert run_and_check(case, sdpa, q, k, v, g, part).ok

    def wrong_last_batch(q, k, v):
        out = sdpa(q, k, v)
        return torch.cat([out[:2], out[2:] * 1.1])

    assert not run_and_check(case, wrong_last_batch, q, k, v, g, part).ok


def test_check_flags_a_wrong_output():
    case = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "causal", None, "fwd")
    q, k, v = make_inputs(case)
    wrong = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # no mask
    result = run_and_check(case, wrong, q, k, v)
    assert not result.ok and "tolerance" in result.reason and result.max_abs_err > 1e-2


def test_check_flags_wrong_gradients():
    case = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "none", None, "fwd+bwd")
    q, k, v = make_inputs(case)

    def detached_k(q, k, v):  # right output, no gradient reaches k
        return torch.nn.functional.scaled_dot_product_attention(q, k.detach(), v)

    result = run_and_check(case, detached_k, q, k, v, make_grad_out(case))
    assert result.max_abs_err < 1e-5
    assert not result.ok and "dk" in result.reason
