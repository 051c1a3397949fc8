import pytest

from bench.case import Case
from bench.measure.flops import flops, kept_pairs, min_bytes
from bench.model import masks


def _brute_pairs(case):
    keep = masks.dense_keep(case)
    if keep is None:
        return case.batch * case.q_len * case.kv_len
    return int(keep.expand(case.batch, 1, case.q_len, case.kv_len).sum())


@pytest.mark.parametrize("mask, window", [("none", None), ("causal", None), ("window", 5),
                                          ("window", 64), ("padding", None)])
@pytest.mark.parametrize("q_len, kv_len", [(33, 33), (17, 50), (50, 17), (1, 9)])
def test_pairs_match_brute_force_mask_count(mask, window, q_len, kv_len):
    case = Case(batch=3, heads=2, kv_heads=1, q_len=q_len, kv_len=kv_len, head_dim=8, mask=mask,
                window=window)
    assert kept_pairs(case) == _brute_pairs(case)


def test_closed_forms():
    n = 1000
    causal = Case(batch=2, heads=4, kv_heads=4, q_len=n, kv_len=n, head_dim=64, mask="causal")
    assert kept_pairs(causal) == 2 * n * (n + 1) // 2
    assert flops(causal) == 4 * 2 * 4 * (n * (n + 1) // 2) * 64
    assert flops(causal.replace(direction="bwd")) == 2.5 * flops(causal)
    assert flops(causal.replace(direction="fwd+bwd")) == 3.5 * flops(causal)
    # cross causal, q_len < kv_len, top-left: query i sees i + 1 keys
    cross = causal.replace(q_len=10, kv_len=100)
    assert kept_pairs(cross) == 2 * 55
    # window: each query sees min(i + 1, w) keys
    w = Case(q_len=n, kv_len=n, mask="window", window=100, batch=1)
    assert kept_pairs(w) == sum(min(i + 1, 100) for i in range(n))


def test_min_bytes():
    c = Case(dtype="bfloat16", batch=1, heads=2, kv_heads=1, q_len=10, kv_len=20, head_dim=4)
    q, kv = 2 * 10 * 4, 1 * 20 * 4
    assert min_bytes(c) == 2 * (2 * q + 2 * kv)
    assert min_bytes(c.replace(direction="bwd")) == 2 * (4 * q + 4 * kv)
