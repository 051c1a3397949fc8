"""Registry-driven: every variant available on this machine, against the float64 reference,
for every mask it declares, forward and (where declared) gradients.  A new variant file
gets these tests without writing any."""

import pytest
import torch

from bench.case import Case
from bench.inputs import make_grad_out, make_inputs
from bench.reference import TOLERANCES, reference, run_and_check
from bench.registry import available, discover

REGISTRY = discover(entry_points=False)
SHAPES = [  # (q_len, kv_len, heads, kv_heads)
    (96, 96, 4, 4),     # self-attention
    (40, 136, 4, 2),    # cross, more keys than queries, GQA
    (150, 45, 4, 1),    # cross, more queries than keys (window: queries that see no key), MQA
]


def _cells():
    for v in REGISTRY:
        for mask in v.masks:
            for q_len, kv_len, heads, kv_heads in SHAPES:
                for direction in ("fwd", "fwd+bwd"):
                    for dtype in ("float32", "bfloat16"):
                        if dtype == "bfloat16" and (q_len, kv_len) != SHAPES[0][:2]:
                            continue
                        yield pytest.param(v.name, Case(
                            "cpu", dtype, 2, heads, kv_heads, q_len, kv_len, 32, mask,
                            24 if mask == "window" else None, direction),
                            id=f"{v.name}-{mask}-{q_len}x{kv_len}-h{heads}/{kv_heads}-{direction}-{dtype}")


@pytest.mark.parametrize("name, case", list(_cells()))
def test_variant_matches_float64_reference(name, case):
    v = REGISTRY[name]
    ok, why = available(v, case)
    if not ok:
        assert why, "an unavailable variant must say why"
        pytest.skip(why)
    q, k, vv = make_inputs(case)
    grad_out = make_grad_out(case) if case.needs_grad else None
    result = run_and_check(case, v.prepare(case).fn, q, k, vv, grad_out)
    assert result.ok, result.reason
    assert result.max_abs_err < TOLERANCES[case.dtype][0][0] + TOLERANCES[case.dtype][0][1] * 10
    if case.needs_grad:
        assert set(result.grad_errors) == {"dq", "dk", "dv"}


def test_reference_is_chunk_independent(monkeypatch):
    """Blocking the reference over queries must not change it."""
    import bench.reference as ref_mod

    case = Case("cpu", "float32", 2, 4, 2, 70, 50, 16, "window", 8, "fwd+bwd")
    q, k, v = make_inputs(case)
    g = make_grad_out(case)
    whole = reference(case, q, k, v, g)
    monkeypatch.setattr(ref_mod, "BLOCK_ELEMENTS", 2 * 4 * 50 * 7)  # 7 query rows per block
    blocked = reference(case, q, k, v, g)
    assert torch.allclose(whole[0], blocked[0])
    for a, b in zip(whole[1], blocked[1]):
        assert torch.allclose(a, b)


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
