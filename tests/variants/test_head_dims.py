"""A value head dim apart from the query/key one (issue 28, part 4): --head-dims 192/128 as
DeepSeek's multi-head latent attention runs.  The FLOPs count both matmuls at their own dim, the
variants that declare value_dim compute it against the float64 reference, the others say why not."""

from __future__ import annotations

import re

import pytest
import torch

from bench.cli import main
from bench.features import repro
from bench.measure.bound import bind_variant
from bench.measure.correctness import check, reference, run_and_check
from bench.measure.flops import flops, min_bytes
from bench.model import masks
from bench.model.case import Case
from tests.conftest import check_every_variant, eager_flex


def _case(mask="causal", direction="fwd", **kw):
    base = dict(batch=2, heads=4, kv_heads=2, q_len=12, kv_len=40, head_dim=24, head_dim_v=16, mask=mask,
                align="bottom-right", direction=direction)
    return Case(**(base | kw))


def test_flops_and_bytes_count_each_matmul_at_its_own_dim():
    case = _case("none", q_len=40, align="top-left")
    pairs = 2 * 4 * 40 * 40
    assert flops(case) == 2 * pairs * (24 + 16)  # QK^T at 24, PV at 16
    assert flops(case.replace(head_dim_v=None)) == 4 * pairs * 24
    q, o, kv = 2 * 4 * 40 * 24, 2 * 4 * 40 * 16, 2 * 2 * 40 * (24 + 16)
    assert min_bytes(case) == 4 * (q + o + kv)
    assert min_bytes(case.replace(direction="fwd+bwd")) == 4 * 3 * (q + o + kv)
    assert case.replace(head_dim_v=24).head_dim_v is None  # 24/24 is 24: one cell
    assert case.dims == "24/16" and "d=24/16" in case.label() and case.scale == 24 ** -0.5


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("mask", ["causal", "window:8+learned_sink", "tree_binary"])
def test_the_variants_that_declare_it_compute_it(registry, direction, mask):
    case = _case(masks.canonical(mask, 8)[0], direction)
    q, k, v = bind_variant(registry["naive"], case).inputs
    assert (q.shape[-1], k.shape[-1], v.shape[-1]) == (24, 24, 16)
    ran = check_every_variant(registry, case)  # eager flex below
    assert {"naive", "chunked.online"} <= set(ran)
    if "sink" not in mask:
        assert "sdpa.math" in ran


def test_eager_flex_takes_a_value_dim_of_its_own():
    case = _case("causal")
    out, (q, k, v) = eager_flex(case)
    assert out.shape[-1] == 16 and check(case, out, reference(case, q, k, v).out).ok


def test_a_kernel_scaled_by_the_value_dim_fails(registry):
    case = _case("none", align="top-left")
    q, k, v = bind_variant(registry["naive"], case).inputs

    def wrong_scale(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=case.dv ** -0.5, enable_gqa=True)

    result = run_and_check(case, wrong_scale, q, k, v, ref=reference(case, q, k, v))
    assert not result.ok and result.kind == "mismatch-values"


def test_a_variant_that_does_not_declare_it_says_why(registry):
    case = _case("window", window=8, q_len=40, align="top-left")
    why = registry["window.chunked"].static_reason(case)
    assert "value head dim" in why and "(--head-dims 24/16" in why
    assert registry["window.chunked"].static_reason(case.replace(head_dim_v=None)) is None


def test_the_flag_and_the_repro_command(capsys):
    counts = []
    for dims in ("64,24/16", "64,24/16,32", "64,24/16,32/32"):
        assert main(["sweep", "--variants", "naive", "--head-dims", dims, "--seq-lens", "16", "--device", "cpu",
                     "--dry-run"]) == 0
        counts.append(int(re.match(r"(\d+) cells", capsys.readouterr().out).group(1)))
    assert counts[0] > 0 and counts[1] == counts[2] == counts[0] * 3 // 2  # 32/32 is 32: one dim, its own cells
    for bad, says in (("0/8", "got 0"), ("8/16/32", "got '8/16/32'"), ("a/b", "got 'a'")):
        assert main(["sweep", "--variants", "naive", "--head-dims", bad, "--device", "cpu", "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert "or QK/V such as 192/128" in err and says in err and "Traceback" not in err
    row = _case().to_dict() | {"variant": "naive"}
    cmd = repro.command(row)
    assert "--head-dims 24/16" in cmd and "--align bottom-right" in cmd
