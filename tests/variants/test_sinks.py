"""Learned attention sinks (issue 28, part 4): gpt-oss's per-head virtual key with logit s_h and a
zero value, one more term in each row's softmax denominator.  naive and chunked.online compute it
natively, flex from the log-sum-exp it returns; the float64 reference includes it, and a kernel that
drops it fails."""

from __future__ import annotations

import pytest
import torch

from bench.cli import main
from bench.measure.bound import bind_variant
from bench.measure.correctness import check, reference, run_and_check
from bench.model import masks
from bench.model.case import Case
from bench.model.registry import available
from tests.conftest import eager_flex


def _case(spelling, q=24, kv=40, direction="fwd", align="bottom-right"):
    mask, window = masks.canonical(spelling, 8)
    return Case(batch=2, heads=4, kv_heads=2, q_len=q, kv_len=kv, head_dim=16, mask=mask, window=window,
                direction=direction, align=align)


def test_the_sink_takes_its_share_of_each_row():
    """Each row's weights sum to 1 / (1 + exp(s_h - lse)), not to 1; a row that sees no key gives zeros."""
    case = _case("padding+learned_sink:mean=1", q=6, kv=6, align="top-left")
    bound = masks.bind(case)
    sink = bound.sink_logits(dtype=torch.float64)
    assert sink.shape == (4,) and torch.equal(sink, masks.bind(_case("causal+learned_sink:mean=1")).sink_logits(
        dtype=torch.float64))  # seeded: the same logits for the same heads and seed
    scores = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    keep = bound.keep().expand(2, 4, 6, 6)
    probs = masks.masked_softmax(scores, keep, False, sink)
    lse = scores.masked_fill(~keep, float("-inf")).logsumexp(-1)
    torch.testing.assert_close(probs.sum(-1), torch.sigmoid(lse - sink.view(1, 4, 1)))
    empty = torch.zeros(1, 4, 1, 6, dtype=torch.bool)
    assert masks.masked_softmax(scores[:1, :, :1], empty, True, sink).abs().sum() == 0
    # two sinks are one virtual key with the logsumexp of their logits
    two = masks.bind(_case("causal+learned_sink+learned_sink:seed=1")).sink_logits(dtype=torch.float64)
    one = [masks.bind(_case(f"causal+learned_sink:seed={s}")).sink_logits(dtype=torch.float64) for s in (0, 1)]
    torch.testing.assert_close(two, torch.logaddexp(*one))


@pytest.mark.parametrize("spelling", ["causal+learned_sink", "window:8+learned_sink:mean=2+alibi",
                                      "document:3:causal=1+learned_sink:seed=3:mean=-1"])
@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_naive_and_chunked_online_compute_it_against_the_reference(registry, spelling, direction):
    case = _case(spelling, direction=direction)
    for name in ("naive", "chunked.online"):
        bound = bind_variant(registry[name], case)
        result = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out)
        assert result.ok, (name, result.reason)


def test_a_kernel_that_drops_the_sink_fails(registry):
    case = _case("causal+learned_sink")
    q, k, v = bind_variant(registry["naive"], case).inputs
    plain = bind_variant(registry["naive"], case.replace(mask="causal")).fn  # the same attention, no sink
    result = run_and_check(case, plain, q, k, v, ref=reference(case, q, k, v))
    assert not result.ok and result.kind == "mismatch-values"
    assert run_and_check(case.replace(mask="causal"), plain, q, k, v).ok


def test_flex_takes_it_from_the_log_sum_exp_it_returns():
    """Eager flex (its reference implementation) returns the log-sum-exp on the CPU; the variant's
    correction out x sigmoid(lse - s_h) matches the reference, the uncorrected output does not.
    Compiled flex on the CPU does not return it, and the variant says so."""
    from bench.api import discover
    from variants.flex import _sunk

    case = _case("window:8+learned_sink:mean=2")
    out, (q, k, v) = eager_flex(case, return_lse=True)
    ref = reference(case, q, k, v).out
    assert check(case, _sunk(out, masks.bind(case).sink_logits()), ref).ok
    assert not check(case, out[0], ref).ok
    ok, why = available(discover(entry_points=False)["flex"], case)
    assert not ok and "return_lse" in why and "learned sink" in why


def test_variants_without_a_sink_say_so(registry, tmp_path):
    case = _case("causal+learned_sink")
    assert "learned_sink is not one" in registry["sdpa.math"].static_reason(case)  # SDPA takes additive mods only
    from tests.conftest import write_plugin

    path = write_plugin(tmp_path, "anymod", '''
        from bench import masks
        from bench.registry import variant

        @variant("anymod", masks=(masks.ANY,), score_mods=(masks.ANY,), bottom_right=True, description="x")
        def anymod(case):
            return lambda q, k, v: q
    ''')
    from bench.api import discover

    v = discover([str(path)], entry_points=False)["anymod"]
    why = v.static_reason(case)
    assert "(learned_sink) not supported" in why and "anymod has no term" in why
    assert v.static_reason(case.replace(mask="causal")) is None


def test_a_sink_out_of_range_says_what_is_valid(capsys):
    assert main(["sweep", "--variants", "naive", "--masks", "causal+learned_sink:mean=40", "--device", "cpu",
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "mean -30 to 30" in err and "Traceback" not in err
