"""Workloads as people run them: ragged batches (--lengths) and inputs with structure (--inputs),
checked on real data against the float64 reference and closed-form counts."""

import json

import pytest
import torch

from bench.case import Case
from bench.measure.bound import bind_variant
from bench.measure.correctness import run_and_check
from bench.measure.flops import flops
from bench.measure.inputs import make_inputs
from bench.model import workload
from bench.model.case import CaseError
from bench.registry import available
from bench.runs import store
from tests.conftest import read_jsonl, run_cli

DISTS = ["uniform:16-200", "lognormal:0.5", "lognormal:1.5", "bimodal", "bimodal:1/3:0.5"]


@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("batch,n", [(1, 64), (3, 100), (8, 128), (16, 37)])
def test_a_ragged_batch_averages_n_exactly_and_is_seeded(dist, batch, n):
    lens = workload.parse_lengths(dist).draw(batch, n)
    assert len(lens) == batch and sum(lens) == batch * n and min(lens) >= 1
    assert lens == workload.parse_lengths(dist).draw(batch, n)  # the same batch every time
    if dist.startswith("uniform"):
        assert all(16 <= x <= 200 for x in lens)


def test_the_mixes_are_the_shapes_they_say():
    lens = workload.parse_lengths("bimodal:1/8:0.75").draw(64, 512)
    short, long = min(lens), max(lens)
    assert long / short == pytest.approx(8, rel=0.05) and sum(x < 512 for x in lens) == 48  # 75 % short
    spread = workload.parse_lengths("lognormal:1.0").draw(64, 512)
    assert max(spread) / min(spread) > 5 > max(workload.parse_lengths("lognormal:0.1").draw(64, 512)) / 400


@pytest.mark.parametrize("text,why", [("uniform:200-300", "cannot average n=100"), ("50/100", "averages 75"),
                                      ("50/100/150", "3 lengths, but the batch is 2"), ("paged:0", "not valid"),
                                      ("lognormal:0", "not valid"), ("bimodal:8/1:0.5", "not valid")])
def test_a_distribution_that_cannot_give_the_batch_is_refused(text, why):
    with pytest.raises(CaseError, match=why):
        Case(batch=2, q_len=100, kv_len=100, lengths=text)


def test_a_ragged_batch_is_self_attention_under_masks_that_mean_something_per_sequence():
    with pytest.raises(CaseError, match="self-attention"):
        Case(batch=2, q_len=100, kv_len=200, lengths="lognormal:0.5")
    case = Case(batch=2, q_len=100, kv_len=100, mask="padding", lengths="lognormal:0.5")
    assert "masks none, causal, window" in case.unsupported_reason  # a row per variant says so


@pytest.mark.parametrize("mask,window", [("none", None), ("causal", None), ("window", 7)])
def test_ragged_flops_are_the_closed_form_over_the_real_lengths(mask, window):
    case = Case(batch=5, heads=3, kv_heads=3, q_len=40, kv_len=40, head_dim=16, mask=mask, window=window,
                lengths="lognormal:0.8")
    lens = case.seq_lengths()
    per_seq = {"none": lambda n: n * n, "causal": lambda n: n * (n + 1) // 2,
               "window": lambda n: sum(min(i + 1, 7) for i in range(n))}[mask]
    assert flops(case) == 4 * 3 * 16 * sum(per_seq(n) for n in lens)
    assert flops(case.replace(direction="bwd")) == 2.5 * flops(case)


def _per_sequence_reference(case, q, k, v):
    """Attention of each sequence on its own in float64, written out here (not the harness's)."""
    out, s = [], 0
    for n in case.seq_lengths():
        qs, ks, vs = (t[:, :, s:s + n].double() for t in (q, k, v))
        scores = qs @ ks.transpose(-1, -2) * case.scale
        i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
        keep = {"none": torch.ones(n, n, dtype=torch.bool), "causal": j <= i,
                "window": (j <= i) & (i - j < (case.window or 1))}[case.mask]
        out.append(scores.masked_fill(~keep, float("-inf")).softmax(-1) @ vs)
        s += n
    return torch.cat(out, dim=2)


@pytest.mark.parametrize("dist", ["lognormal:0.5", "bimodal"])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@pytest.mark.parametrize("name", ["naive", "chunked.online", "sdpa"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_ragged_variants_against_the_float64_reference(registry, dist, mask, name, direction):
    case = Case(batch=4, heads=2, kv_heads=2, q_len=48, kv_len=48, head_dim=16, mask=mask,
                window=9 if mask == "window" else None, lengths=dist, direction=direction)
    q, k, v = make_inputs(case, requires_grad=False)
    assert q.shape == (1, 2, 4 * 48, 16)  # packed: the sequences back to back
    expected = _per_sequence_reference(case, q, k, v)
    ok, why = available(registry[name], case)
    if not ok:
        assert name.startswith("sdpa") and mask != "none", why  # nested tensors: no attn_mask, no CPU causal
        pytest.skip(why)
    bound = bind_variant(registry[name], case)
    with bound.scope():
        out = bound.fn(*bound.inputs)
        result = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out)
    assert result.ok, result.reason
    torch.testing.assert_close(out.detach().double(), expected, atol=1e-4, rtol=1e-4)
    assert bound.prepared.info["layout"] == ("nested" if name.startswith("sdpa") else "packed")


def test_a_wrong_ragged_kernel_cannot_pass(registry):
    """The check is over the sequences: attention across them (the padded-batch mistake) fails."""
    case = Case(batch=3, heads=2, kv_heads=2, q_len=32, kv_len=32, head_dim=16, mask="none", lengths="bimodal")
    q, k, v = make_inputs(case)

    def across(q, k, v):  # one sequence of all the tokens: every token sees the other sequences too
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    result = run_and_check(case, across, q, k, v)
    assert not result.ok and result.kind == "mismatch-values"


@pytest.mark.parametrize("kind", ["clustered", "lowrank:4", "outliers:30"])
def test_structured_inputs_are_seeded_and_shaped_as_said(kind):
    case = Case(batch=2, heads=4, kv_heads=2, q_len=256, kv_len=256, head_dim=32, inputs=kind)
    q, k, v = make_inputs(case)
    again = make_inputs(case)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), again))
    assert q.shape == (2, 4, 256, 32) and k.shape == (2, 2, 256, 32)
    if kind.startswith("lowrank"):  # q and k in one 4-dimensional subspace per kv head
        both = torch.cat([q[0, 0], k[0, 0]])
        assert torch.linalg.matrix_rank(both.double(), rtol=1e-4) == 4  # up to float32 rounding
    if kind.startswith("outliers"):
        loud = q[..., ::16].std() / q[..., 1::16].std()
        assert 20 < loud < 40
    if kind == "clustered":  # a query's attention is peaked on its own topic's keys (1 in 8 of them)
        topic = torch.arange(256) * 8 // 256
        same = topic.view(-1, 1) == topic.view(1, -1)

        def own_share(q, k):
            return float(((q[0, 0] @ k[0, 0].T * case.scale).softmax(-1) * same).sum(-1).mean())

        plain = make_inputs(case.replace(inputs="normal"))
        assert own_share(q, k) > 0.8 > 0.2 > own_share(plain[0], plain[1])


def test_on_clustered_inputs_nystrom_is_well_below_the_zeros_line(registry):
    errors = {}
    for kind in ("normal", "clustered"):
        case = Case(batch=1, heads=4, kv_heads=4, q_len=1024, kv_len=1024, head_dim=64, inputs=kind)
        bound = bind_variant(registry["nystrom"], case)
        result = run_and_check(case, bound.fn, *bound.inputs, None, None, registry["nystrom"].error_budget, True)
        errors[kind] = result.rel_err
    assert errors["clustered"] < 0.4 < errors["normal"], errors  # 1.0: the error of answering zeros


def test_rows_of_an_older_folder_keep_their_cells(tmp_path):
    """Rows written before --lengths and --inputs existed count as fixed, normal: a resume does
    not measure them again."""
    case = Case(batch=1, heads=2, kv_heads=2, q_len=16, kv_len=16, head_dim=8)
    old = {k: v for k, v in case.to_dict().items() if k not in ("lengths", "inputs")}
    (tmp_path / store.RESULTS).write_text(json.dumps({"variant": "naive", "status": "ok", **old}) + "\n")
    assert store.cell_key("naive", case) in store.done_keys(store.read_rows(tmp_path))


@pytest.mark.parametrize("args,why", [(["--lengths", "uniform:200-300", "--batch", "4"], "cannot average n=64"),
                                      (["--inputs", "weird"], "unknown --inputs 'weird'; valid: normal"),
                                      (["--lengths", "paged:0"], "--lengths 'paged:0' is not valid; valid: fixed"),
                                      (["--kv-layout", "paged:0"], "--kv-layout 'paged:0' is not valid; valid:")])
def test_bad_workloads_exit_2_and_write_nothing(tmp_path, capsys, args, why):
    from bench.cli import main

    out = tmp_path / "run"
    assert main(["sweep", "--variants", "naive", "--seq-lens", "64", "--device", "cpu", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.slow
def test_a_ragged_sweep_records_its_lengths_layout_and_waste(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,chunked.online,sdpa,linear.elu", "--lengths", "bimodal",
                   "--batch", "4", "--seq-lens", "48", "--heads", "2", "--head-dims", "8", "--masks", "causal",
                   "--budget-ms", "5", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["variant"] for r in ok} == {"naive", "chunked.online"}
    for r in ok:
        lens = r["seq_lengths"]
        assert len(lens) == 4 and sum(lens) == 4 * r["q_len"] and r["layout"] == "packed"
        assert r["flops"] == 4 * 2 * 8 * sum(n * (n + 1) // 2 for n in lens)
        longest = max(lens)
        assert r["padding_waste"] == pytest.approx(4 * longest * (longest + 1) / sum(n * (n + 1) for n in lens),
                                                   rel=1e-5)
        assert r["max_abs_err"] is not None  # reference-checked
    refused = {r["variant"]: r["reason"] for r in rows if r["status"] == "unsupported"}
    assert "ragged batches" in refused["linear.elu"] and "sdpa" in refused  # CPU nested tensors: no causal
    page = (out / "report" / "index.html").read_text()
    assert "Ragged batches" in page and "µs per real token" in page


@pytest.mark.slow
@pytest.mark.parametrize("dist,mask", [("bimodal", "window")])  # a compile a case: one case
def test_flex_takes_a_ragged_batch_as_a_document_block_mask(registry, dist, mask):
    case = Case(batch=4, heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=16, mask=mask,
                window=16 if mask == "window" else None, lengths=dist)
    bound = bind_variant(registry["flex"], case)
    with bound.scope():
        out = bound.fn(*bound.inputs)
        result = run_and_check(case, bound.fn, *bound.inputs)
    assert result.ok, result.reason
    torch.testing.assert_close(out.double(), _per_sequence_reference(case, *bound.inputs), atol=1e-4, rtol=1e-4)
    assert bound.prepared.info["layout"] == "packed" and bound.prepared.info["block_sparsity"] > 0


def test_a_paged_cache_holds_the_same_numbers_behind_a_shuffled_table():
    from bench.measure.inputs import from_pages

    case = Case(batch=3, heads=4, kv_heads=2, q_len=2, kv_len=50, head_dim=8, kv_layout="paged:16")
    table = case.page_table()
    assert sorted(p for row in table for p in row) == list(range(12)) and table != [list(range(i * 4, i * 4 + 4))
                                                                                  for i in range(3)]
    q, k, v = make_inputs(case)
    plain = make_inputs(case.replace(kv_layout="contiguous"))
    assert k.shape == (2, 12, 16, 8)  # (kv heads, pool pages, page, head dim)
    assert torch.equal(from_pages(case, k), plain[1]) and torch.equal(from_pages(case, v), plain[2])
    assert torch.equal(q, plain[0])


@pytest.mark.parametrize("page,mask", [(16, "none"), (7, "causal"), (7, "window")])
@pytest.mark.parametrize("name", ["naive", "sdpa", "chunked.online"])
def test_paged_variants_against_the_float64_reference(registry, page, mask, name):
    case = Case(batch=3, heads=4, kv_heads=2, q_len=4, kv_len=100, head_dim=16, mask=mask,
                window=30 if mask == "window" else None, kv_layout=f"paged:{page}")
    bound = bind_variant(registry[name], case)
    with bound.scope():
        result = run_and_check(case, bound.fn, *bound.inputs)
    assert result.ok, result.reason


def test_a_kernel_that_ignores_the_block_table_cannot_pass():
    case = Case(batch=2, heads=2, kv_heads=2, q_len=4, kv_len=64, head_dim=16, kv_layout="paged:16")
    q, k, v = make_inputs(case)

    def pool_order(q, k, v):  # the pool read as if pages sat in order: the wrong keys for each sequence
        keys, values = (t.view(2, 2, 4, 16, 16).permute(1, 0, 2, 3, 4).reshape(2, 2, 64, 16) for t in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values)

    result = run_and_check(case, pool_order, q, k, v)
    assert not result.ok and result.kind == "mismatch-values"


def test_paged_bytes_are_the_pages_read_and_the_rest_is_refused():
    from bench.measure.flops import min_bytes

    case = Case(batch=2, heads=8, kv_heads=2, q_len=1, kv_len=100, head_dim=64, kv_layout="paged:16")
    pages = 7  # ceil(100 / 16)
    assert min_bytes(case) == 4 * (2 * 2 * 8 * 1 * 64 + 2 * 2 * 2 * pages * 16 * 64) + 8 * 2 * pages
    assert "forward only" in case.replace(direction="bwd").unsupported_reason
    with pytest.raises(CaseError, match="--kv-layout 'paged:0' is not valid; valid: contiguous, or paged:PAGE"):
        Case(kv_layout="paged:0")


@pytest.mark.slow
def test_flex_reads_a_paged_cache_in_place(registry):
    case = Case(batch=3, heads=4, kv_heads=2, q_len=4, kv_len=100, head_dim=16, mask="causal", kv_layout="paged:16")
    bound = bind_variant(registry["flex"], case)
    with bound.scope():
        result = run_and_check(case, bound.fn, *bound.inputs)
    assert result.ok, result.reason
    assert bound.prepared.info["kv_read"] == "pages in place"


def test_fp8_is_forward_only_and_declared_by_sdpa_and_flex_alone(registry):
    case = Case(dtype="fp8", batch=1, heads=2, kv_heads=2, q_len=32, kv_len=32, head_dim=16)
    assert case.dtype == "float8_e4m3fn" and make_inputs(case)[0].dtype == torch.float8_e4m3fn
    assert "forward only" in case.replace(direction="bwd").unsupported_reason
    assert "dtype float8_e4m3fn not supported" in registry["naive"].static_reason(case)
    ok, why = available(registry["sdpa"], case)
    assert not ok and "Float8_e4m3fn" in why  # PyTorch's own refusal on the CPU, from its probe
    assert not available(registry["flex"], case)[0]


def test_the_fp8_tolerance_passes_one_rounding_and_fails_a_wrong_scale():
    from bench.measure.correctness import reference

    case = Case(dtype="fp8", batch=2, heads=2, kv_heads=2, q_len=256, kv_len=256, head_dim=32, mask="causal")
    q, k, v = make_inputs(case)
    exact = reference(case, q, k, v).out

    def rounded_once(q, k, v):  # an exact kernel whose output is rounded to fp8, as an fp8 kernel's is
        return exact.to(torch.float8_e4m3fn)

    def unscaled(q, k, v):  # the 1/sqrt(d) dropped
        qf, kf, vf = (t.float() for t in (q, k, v))
        keep = torch.ones(256, 256, dtype=torch.bool).tril()
        p = (qf @ kf.transpose(-1, -2)).masked_fill(~keep, float("-inf")).softmax(-1)
        return (p @ vf).to(torch.float8_e4m3fn)

    good = run_and_check(case, rounded_once, q, k, v)
    assert good.ok, good.reason
    assert 0.01 < good.rel_err < 0.0625  # 0.025: the fp8 rounding itself, within u
    assert not run_and_check(case, unscaled, q, k, v).ok
