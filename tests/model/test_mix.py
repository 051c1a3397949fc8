"""Mixed serving batches (issue 28, part 2): prefill, chunked prefill and decode sequences of their
own query and key lengths packed into one call, q and k apart, bottom-right within each sequence.
The grammar, the packed mask against a per-sequence computation written here from the segments,
every variant that takes a mix against the float64 reference, the phases' FLOPs and bytes, a
kernel that attends across sequences failing, and a real sweep's rows, repro and report table."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from bench.cli import main
from bench.features.repro import command
from bench.measure import flops
from bench.measure.bound import bind_variant
from bench.measure.correctness import check, reference, run_and_check
from bench.model import masks, workload
from bench.model.case import Case
from bench.model.registry import available
from tests.conftest import check_every_variant, eager_flex, read_jsonl, run_cli

MIX = "2x(24/24)+1x(8/40)+3x(1/17)"  # two prefills, a chunk of 8 continuing a prompt, three decodes


def _case(mask="causal", mix=MIX, direction="fwd", **kw):
    window = 6 if mask == "window" else None
    return Case(heads=4, kv_heads=2, head_dim=16, mask=mask, window=window, mix=mix, direction=direction, **kw)


def test_the_grammar_reads_counts_pairs_and_prefills():
    mix = workload.parse_mix(" 2x512 + 1x(128/4096)+8X(1/2048)+(3/9)")
    assert mix.text() == "2x(512/512)+1x(128/4096)+8x(1/2048)+1x(3/9)"
    assert mix.segments()[:3] == [(512, 512), (512, 512), (128, 4096)] and mix.sequences == 12
    assert (mix.q_tokens, mix.kv_tokens) == (1024 + 128 + 8 + 3, 1024 + 4096 + 8 * 2048 + 9)
    assert [workload.phase(q, kv) for q, kv in [(5, 5), (4, 9), (1, 9), (1, 1)]] == \
        ["prefill", "chunked_prefill", "decode", "prefill"]
    case = _case()
    assert (case.batch, case.q_len, case.kv_len, case.align) == (1, 24 + 24 + 8 + 3, 24 + 24 + 40 + 51, "bottom-right")
    assert case.segments() == [(24, 24), (24, 24), (8, 40), (1, 17), (1, 17), (1, 17)]


@pytest.mark.parametrize("args, says", [
    (["--batch-mix", "2x(64/32)"], "64 query tokens against 32 keys"),
    (["--batch-mix", "2y(64/64)"], "COUNTx(Q/KV)"),
    (["--batch-mix", "0x(4/4)"], "COUNTx(Q/KV)"),
    (["--batch-mix", "2x(4/4)", "--batch", "2"], "give it or --batch, not both"),
    (["--batch-mix", "2x(4/4)", "--align", "tl"], "give it or --align, not both"),
])
def test_bad_mixes_say_what_is_valid(capsys, args, says):
    assert main(["sweep", "--variants", "naive", "--device", "cpu", "--dry-run", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def _per_sequence(case, q, k, v):
    """float64 attention computed one sequence at a time from case.segments(), written here: each
    sequence's queries are its last q_len tokens (bottom-right), causal or windowed within it."""
    outs, qs, ks = [], 0, 0
    group = case.heads // case.kv_heads
    for n, m in case.segments():
        qq = q[:, :, qs:qs + n].double()
        kk, vv = (x[:, :, ks:ks + m].double().repeat_interleave(group, 1) for x in (k, v))
        scores = qq @ kk.transpose(-1, -2) * case.scale
        pos = torch.arange(n).view(-1, 1) + (m - n)
        key = torch.arange(m).view(1, -1)
        keep = torch.ones(n, m, dtype=torch.bool)
        if case.mask in ("causal", "window"):
            keep &= key <= pos
        if case.mask == "window":
            keep &= pos - key < case.window
        outs.append(scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vv)
        qs, ks = qs + n, ks + m
    return torch.cat(outs, 2)


@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_the_packed_mask_is_each_sequence_bottom_right(mask):
    case = _case(mask)
    q, k, v = bind_variant_inputs(case)
    assert torch.allclose(reference(case, q, k, v).out.double(), _per_sequence(case, q, k, v), atol=1e-6)
    # the pairs, counted by key ranges, are those of each sequence counted alone
    keep = masks.bind(case).keep()
    assert int(keep.sum()) * case.heads == masks.bind(case).counts[0]
    qs = ks = 0
    for n, m in case.segments():  # nothing outside a sequence's own block
        assert int(keep[0, 0, qs:qs + n].sum()) == int(keep[0, 0, qs:qs + n, ks:ks + m].sum())
        qs, ks = qs + n, ks + m


def bind_variant_inputs(case):
    from bench.measure.inputs import make_inputs

    return make_inputs(case)


@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_every_variant_that_takes_a_mix_computes_it(registry, mask, direction):
    """naive and chunked.online per sequence; SDPA through nested jagged tensors (no mask) or its
    block-diagonal bool mask; flex below, eager; a variant that does not take a mix says so."""
    case = _case(mask, direction=direction)
    ran = set(check_every_variant(registry, case))
    assert {"naive", "chunked.online", "sdpa.math"} <= ran
    ok, why = available(registry["window.chunked"], case)
    assert not ok and why
    assert registry["window.chunked"].mix is False and registry["flex"].mix and registry["xformers"].mix


def test_sdpa_takes_a_mix_without_a_mask_as_nested_tensors_q_and_k_ragged_apart(registry):
    bound = bind_variant(registry["sdpa.math"], _case("none"))
    assert bound.prepared.info["layout"] == "nested"
    assert bind_variant(registry["sdpa.math"], _case("causal")).prepared.info["layout"] == "dense mask"


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_eager_flex_reads_the_mix_through_its_block_mask(mask):
    case = _case(mask)
    out, (q, k, v) = eager_flex(case)
    assert check(case, out, reference(case, q, k, v).out).ok


def test_xformers_bias_is_the_mix(registry):
    """xformers' block-diagonal bottom-right biases, materialised on the CPU (its kernels are CUDA's),
    keep exactly the pairs of the packed mask."""
    xf = pytest.importorskip("xformers.ops.fmha.attn_bias")
    from variants.xformers_attn import mix_bias

    for mask in ("none", "causal", "window"):
        case = _case(mask)
        bias = mix_bias(xf, case.segments(), case.mask, case.window)
        kept = bias.materialize((case.q_len, case.kv_len)) == 0
        assert torch.equal(kept, masks.bind(case).keep()[0, 0]), mask


def test_the_phases_add_up_to_the_mix():
    case = _case("causal", direction="fwd+bwd")
    phases = flops.mix_phases(case)
    assert list(phases) == ["prefill", "chunked_prefill", "decode"]
    assert phases["decode"]["sequences"] == 3 and phases["chunked_prefill"]["q_tokens"] == 8
    for key, whole in (("flops", flops.flops(case)), ("bytes", flops.min_bytes(case)),
                       ("kv_bytes", flops.kv_bytes(case))):
        assert sum(p[key] for p in phases.values()) == whole, key
    # a chunk of 8 against 40 keys, bottom-right: rows see 33..40 keys; 4 heads; QK and PV at d=16; fwd+bwd 3.5x
    assert phases["chunked_prefill"]["flops"] == 2 * 4 * sum(range(33, 41)) * 32 * 3.5
    assert phases["decode"]["kv_bytes"] == 4 * 2 * 3 * 17 * 32  # float32, 2 kv heads, 3 x 17 keys, k and v


def test_a_kernel_that_attends_across_sequences_fails(registry):
    """Bottom-right causal over the whole packed batch (one long sequence): the decode tokens see every
    sequence before them.  It is a mismatch against the mix's reference; the same kernel on a one-sequence
    mix, where there is nothing to cross, passes."""
    case = _case("causal")
    q, k, v = bind_variant(registry["naive"], case).inputs

    def across(q, k, v):
        k, v = (x.repeat_interleave(2, dim=1) for x in (k, v))
        n, m = q.shape[2], k.shape[2]
        keep = torch.ones(n, m, dtype=torch.bool).tril(m - n)
        return ((q @ k.transpose(-1, -2)) * case.scale).masked_fill(~keep, float("-inf")).softmax(-1) @ v

    result = run_and_check(case, across, q, k, v)
    assert not result.ok and result.kind == "mismatch-values"
    one = _case("causal", mix="1x(8/40)")
    assert run_and_check(one, across, *bind_variant(registry["naive"], one).inputs).ok


def test_a_case_not_modelled_says_so():
    assert "not none" not in (_case("causal").unsupported_reason or "")
    assert "masks none, causal, window" in _case("alibi").unsupported_reason
    assert "paged KV cache and a mixed batch" in _case(kv_layout="paged:8").unsupported_reason


@pytest.mark.slow
def test_a_mixed_sweep_writes_its_phases_repro_and_table(tmp_path):
    out = tmp_path / "run"
    r = run_cli("sweep", "--device", "cpu", "--variants", "naive,sdpa.math,linear.elu", "--batch-mix",
                f"{MIX},1x(16/16)+4x(1/64)", "--heads", "4", "--kv-heads", "2", "--head-dims", "16", "--masks",
                "causal", "--budget-ms", "20", "--rounds", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert {r["mix"] for r in rows} == {MIX, "1x(16/16)+4x(1/64)"}
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["variant"] for r in ok} == {"naive", "sdpa.math"}
    assert all(r["phases"]["decode"]["sequences"] in (3, 4) and r["layout"] for r in ok)
    assert all("mixed batches" in r["reason"] for r in rows if r["variant"] == "linear.elu")
    # the repro command measures the same cell
    again = tmp_path / "again"
    cmd = shlex.split(command(ok[0], out=str(again)))[4:]
    assert "--batch-mix" in cmd and "--seq-lens" not in cmd and "--align" not in cmd
    assert main(["sweep", *cmd, "--dry-run"]) == 0
    report = (out / "report" / "report.md").read_text()
    assert "## Mixed batches" in report and "µs per query token" in report and "1x(16/16)+4x(1/64)" in report
    assert (out / "report" / "frontier.csv").exists()  # every run's (no series of three lengths here: no model)
    env = json.loads((out / "env.json").read_text())
    assert env["spec"]["batch_mix"] == [MIX, "1x(16/16)+4x(1/64)"]


def test_the_serving_preset_runs_three_mixes():
    from bench.api import discover
    from bench.model.specbuild import build_spec

    for device in ("cpu", "cuda"):
        spec = build_spec({"preset": "serving", "device": device}, discover(entry_points=False), here=False)
        cases = spec.cases()
        assert len(cases) == 3 and all(c.mixed and c.mask == "causal" for c in cases)
        kinds = [{workload.phase(q, kv) for q, kv in c.segments()} for c in cases]
        assert all("decode" in k for k in kinds) and any("chunked_prefill" in k for k in kinds)
