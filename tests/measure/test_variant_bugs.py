"""A plugin's bugs are the plugin's, in every scope: a variant that changes its inputs in place is a
mismatch naming them (and the next variant of the case still runs on the inputs its reference was
computed from); a layer whose core returns no tensor says so, as the core scope does, and never
blames the harness; the FFN's width is refused in one line past its range."""

from __future__ import annotations

import pytest

from bench.cli import main
from bench.model.case import Case
from tests.conftest import write_plugin

MUTATES = """
    import torch
    import torch.nn.functional as F
    from bench.registry import variant

    @variant("mutates", description="right output, then scales q and zeroes k in place",
             masks=("none", "causal", "padding"), backward=True)
    def mutates(case):
        def attention(q, k, v):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=case.mask == "causal", enable_gqa=case.is_gqa)
            with torch.no_grad():  # a leaf that requires grad takes in-place writes under no_grad
                q.mul_(2)
                k.zero_()
            return out
        return attention

    @variant("returns.none", description="returns nothing", masks=("none", "causal", "padding"), backward=True)
    def returns_none(case):
        return lambda q, k, v: None

    @variant("returns.tuple", description="returns (out, lse)", masks=("none", "causal", "padding"), backward=True)
    def returns_tuple(case):
        return lambda q, k, v: (F.scaled_dot_product_attention(q, k, v, enable_gqa=case.is_gqa), None)
"""

SCOPES = [
    pytest.param(dict(), id="core"),
    pytest.param(dict(scope="block"), id="block"),
    pytest.param(dict(scope="block", kv_len=24), id="block-cross"),
    pytest.param(dict(scope="encoder", ffn="mlp:64"), id="encoder"),
    pytest.param(dict(scope="decoder", ffn="swiglu:48", kv_len=24), id="decoder"),
]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    from bench.api import discover

    path = write_plugin(tmp_path_factory.mktemp("bugs"), "buggy", MUTATES)
    return discover([str(path)], entry_points=False)


def _rows(registry, names, case):
    from bench.engine.cell import run_group
    from bench.measure.settings import MeasureSettings

    rows = []
    run_group([registry[n] for n in names], case, MeasureSettings(budget_ms=3.0, rounds=2), rows.append)
    return {r["variant"]: r for r in rows}


def _case(direction, **kw):
    base = dict(batch=2, heads=2, kv_heads=2, head_dim=8, q_len=16, kv_len=16, mask="causal", direction=direction)
    if kw.get("scope") in (None, "block") and kw.get("kv_len", 16) != 16:
        base["mask"] = "none"  # a block over a memory of another length: no causal alignment to ask
    return Case(**(base | kw))


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("scope", SCOPES)
def test_a_variant_that_changes_its_inputs_is_a_mismatch_naming_them(plugin, scope, direction):
    case = _case(direction, **scope)
    rows = _rows(plugin, ["mutates", "naive"], case)
    bad = rows["mutates"]
    assert bad["status"] == "mismatch", bad["reason"]
    assert "changed its inputs q, k in place" in bad["reason"], bad["reason"]
    assert "median_ms" not in bad or bad["median_ms"] is None  # never timed on the inputs it changed
    if case.scope != "core":
        assert f"in the {case.scope}'s" in bad["reason"]
    # the next variant of the case runs on the inputs as they were made: its check against the same
    # reference passes
    assert rows["naive"]["status"] == "ok", rows["naive"]["reason"]


def test_a_cell_timed_unchecked_still_sees_its_inputs_changed(plugin):
    from bench.engine.cell import run_group
    from bench.measure.settings import MeasureSettings

    rows = []
    run_group([plugin["mutates"]], _case("fwd"), MeasureSettings(budget_ms=3.0, rounds=2), rows.append,
              skip_reference="the reference overran its timeout")
    assert rows[0]["status"] == "mismatch" and "inputs q, k in place" in rows[0]["reason"], rows[0]["reason"]


def test_the_guard_names_each_changed_input_and_restores_it():
    import torch

    from bench.measure.correctness import CheckResult, InputGuard

    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    grad = torch.randn(1, 2, 4, 8)
    guard = InputGuard({"q": q, "k": k, "v": v, "grad_out": grad, "none": None})
    kept = v.clone()
    v[0, 0, 0, 0] = torch.nextafter(v[0, 0, 0, 0], torch.tensor(float("inf")))  # one element, one ulp
    grad.neg_()
    assert guard.changed() == ["v", "grad_out"]
    result = guard.verdict(CheckResult(True, 0.0, 0.0))
    assert not result.ok and result.kind == "mismatch-values" and "inputs v, grad_out in place" in result.reason
    assert torch.equal(v, kept) and guard.changed() == []  # restored for the next variant
    untouched = InputGuard({"q": q})
    assert untouched.verdict(CheckResult(True, 0.0, 0.0)).ok


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("scope", SCOPES[1:])
@pytest.mark.parametrize("name, words", [("returns.none", "the variant returned None"),
                                         ("returns.tuple", "the variant returned a tuple of 2 (Tensor, NoneType)")])
def test_a_layer_whose_core_returns_no_tensor_is_the_variants_mismatch(plugin, scope, direction, name, words):
    case = _case(direction, **scope)
    row = _rows(plugin, [name], case)[name]
    assert row["status"] == "mismatch" and row["reason_kind"] == "mismatch-shape", row["reason"]
    assert row["reason"].startswith(words), row["reason"]
    assert "one tensor shaped like q, (2, 2, 16, 8)" in row["reason"]
    core = "self-attention" if case.scope == "decoder" else "attention"
    assert f"(in the {case.scope}'s {core} core)" in row["reason"]
    assert "harness" not in row["reason"] and "AttributeError" not in row["reason"]


def _refused(capsys, argv, *words):
    assert main(list(map(str, argv))) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


SMALL = ["--variants", "naive", "--seq-lens", "16", "--heads", "2", "--head-dims", "8", "--device", "cpu",
         "--no-report", "--quiet", "--dry-run"]


@pytest.mark.parametrize("ffn", ["mlp:²", "mlp:６４", "swiglu:99999999999999999999", "swiglu:1048577", "mlp:0",
                                 "mlp:-3", "mlp:"])
def test_an_ffn_width_past_its_range_or_in_other_digits_exits_2_in_one_line(capsys, ffn):
    _refused(capsys, ["sweep", *SMALL, "--scope", "encoder", "--ffn", ffn], f"--ffn {ffn}", "1 to 1,048,576",
             "ASCII digits")


def test_an_ffn_at_either_end_of_its_range_is_taken(capsys):
    for ffn in ("mlp:1", "swiglu:1048576"):
        assert main(["sweep", *SMALL, "--scope", "encoder", "--ffn", ffn]) == 0
    capsys.readouterr()


def test_an_ffn_mult_that_makes_the_ffn_too_wide_names_the_flag(capsys):
    wide = ["--variants", "naive", "--seq-lens", "16", "--heads", "512", "--head-dims", "512", *SMALL[8:]]
    _refused(capsys, ["sweep", *wide, "--scope", "encoder", "--ffn-mult", "64"], "--ffn-mult 64", "16,777,216",
             "1,048,576")
