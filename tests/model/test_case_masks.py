import pytest
import torch

from bench.case import Case, CaseError
from bench.model import masks


@pytest.mark.parametrize("field, value, words", [
    ("device", "tpu", "valid: cpu, cuda"),
    ("dtype", "int8", "valid: float32, float16, bfloat16"),
    ("mask", "Diagonal!", "a mask is a name with ':'-separated parameters"),
    ("direction", "sideways", "valid: fwd, bwd, fwd+bwd"),
    ("q_len", 0, "positive integer"),
    ("head_dim", -4, "positive integer"),
    ("kv_heads", 3, "divisible by kv_heads"),
])
def test_invalid_case_names_field_and_valid_values(field, value, words):
    with pytest.raises(CaseError) as info:
        Case(**{field: value})
    assert info.value.field == field
    assert field in str(info.value) and words in str(info.value)


def test_window_size_rules():
    with pytest.raises(CaseError, match="window"):
        Case(mask="window")
    with pytest.raises(CaseError, match="only the window mask"):
        Case(mask="causal", window=8)
    assert Case(mask="window", window=8).window == 8


def test_case_is_frozen_hashable_and_round_trips():
    c = Case(dtype="bf16", q_len=128, kv_len=64, mask="padding")
    assert c.dtype == "bfloat16" and c.is_cross
    assert {c: 1}[Case.from_dict(c.to_dict())] == 1
    with pytest.raises(AttributeError):
        c.q_len = 3


def _brute_keep(case):
    """The mask definition written as loops, independent of masks.key_range."""
    lens = masks.kv_lengths(case)
    keep = torch.zeros(case.batch, case.q_len, case.kv_len, dtype=torch.bool)
    for b in range(case.batch):
        for i in range(case.q_len):
            for j in range(case.kv_len):
                if case.mask == "none":
                    ok = True
                elif case.mask == "causal":
                    ok = j <= i
                elif case.mask == "window":
                    ok = i - case.window < j <= i
                else:
                    ok = j < lens[b]
                keep[b, i, j] = ok
    return keep


@pytest.mark.parametrize("mask, window", [("causal", None), ("window", 3), ("padding", None)])
@pytest.mark.parametrize("q_len, kv_len", [(7, 7), (5, 9), (11, 4)])
def test_dense_mask_matches_definition(mask, window, q_len, kv_len):
    case = Case(batch=3, heads=2, kv_heads=2, q_len=q_len, kv_len=kv_len, head_dim=4, mask=mask,
                window=window)
    keep = masks.dense_keep(case).expand(case.batch, 1, q_len, kv_len)[:, 0]
    assert torch.equal(keep, _brute_keep(case))
    empty = (~keep.any(-1)).any().item()
    assert empty == masks.has_empty_rows(case)


def test_padding_lengths_are_deterministic_and_positive():
    case = Case(batch=4, q_len=10, kv_len=10, mask="padding")
    assert masks.kv_lengths(case) == [9, 8, 7, 5]
    assert masks.kv_lengths(Case(batch=1, q_len=1, kv_len=1, mask="padding")) == [1]


def test_masked_softmax_empty_rows_are_zero_with_finite_gradient():
    scores = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.bool).view(1, 1, 3, 4)
    p = masks.masked_softmax(scores, keep, empty_rows=True)
    assert torch.equal(p[0, 0, 1], torch.zeros(4, dtype=torch.float64))
    assert torch.allclose(p[0, 0, [0, 2]].sum(-1), torch.ones(2, dtype=torch.float64))
    p.sum().backward()
    assert torch.isfinite(scores.grad).all()
