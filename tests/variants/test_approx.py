"""Approximate variants with their error measured, the exact online-softmax variant, decode,
and the roofline."""

import json

import pandas as pd
import pytest
import torch

from bench.case import Case
from bench.measure.envinfo import measure_peak_gbps
from bench.measure.inputs import make_inputs
from bench.measure.memory import peak_bytes
from bench.measure.timing import timed_call
from bench.model.specbuild import build_spec
from tests.conftest import read_jsonl, run_cli


def test_online_softmax_holds_one_key_block_of_scores(registry):
    """chunked.online's scores are (B, H, n, BLOCK) where naive's are (B, H, n, n): its peak
    memory at n = 1024 is a fraction of naive's."""
    case = Case("cpu", "float32", 1, 4, 4, 1024, 1024, 32, "causal", None, "fwd")
    q, k, v = make_inputs(case)
    peaks = {name: peak_bytes("cpu", timed_call(case, registry[name].prepare(case).fn, q, k, v))
             for name in ("naive", "chunked.online")}
    scores = 4 * 1024 * 1024 * 4  # one (1, 4, 1024, 1024) float32 tensor
    assert peaks["naive"] >= scores
    assert peaks["chunked.online"] < peaks["naive"] / 3


def test_performer_features_are_orthogonal_blocks_with_gaussian_norms():
    from variants.approx import orthogonal_features

    w = orthogonal_features(96, 32, seed=3)
    assert w.shape == (96, 32)
    block = w[:32] / w[:32].norm(dim=1, keepdim=True)
    assert torch.allclose(block @ block.T, torch.eye(32), atol=1e-5)  # one orthogonal block
    assert torch.equal(w, orthogonal_features(96, 32, seed=3))  # seeded
    assert 4.0 < float(w.norm(dim=1).mean()) < 7.0  # chi(32) norms: mean about 5.6


def test_nystrom_pseudo_inverse_inverts_a_well_conditioned_kernel():
    from variants.approx import pinv_iterative

    a = torch.softmax(torch.randn(3, 16, 16) * 0.1, -1) + torch.eye(16)
    assert torch.allclose(pinv_iterative(a, iters=20) @ a, torch.eye(16).expand(3, 16, 16), atol=1e-4)


def test_the_copy_bandwidth_is_measured():
    gbps = measure_peak_gbps("cpu", threads=1)
    assert 0.5 < gbps < 2000  # GB/s: any real memory system


def test_peak_runs_last_as_long_as_the_sweeps_budget_within_bounds(monkeypatch):
    import math
    import time

    from bench.measure import envinfo

    step = 2.0 ** -8  # seconds per call, exact in binary: a clock that only the calls advance
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    calls = []

    def op():
        calls.append(1)
        now[0] += step

    for budget_ms, run_ms in ((5, envinfo.PEAK_RUN_MIN_MS), (60, 60), (300, envinfo.PEAK_RUN_MS["cpu"])):
        calls.clear()
        assert envinfo.peak_run_ms("cpu", budget_ms) == run_ms
        rate = envinfo._best_rate(op, 1.0, "cpu", lambda: None, 1, envinfo.peak_run_ms("cpu", budget_ms))
        per_run = math.ceil(run_ms / 1e3 / step)  # calls until a run has lasted run_ms
        assert len(calls) == envinfo.PEAK_RUNS * per_run and rate == pytest.approx(1 / step)


def test_decode_preset_is_one_query_against_a_gqa_kv_cache(registry):
    spec = build_spec({"preset": "decode", "device": "cpu"}, registry)
    cases = spec.cases()
    assert {c.q_len for c in cases} == {1, 4} and max(c.kv_len for c in cases) == 32768
    assert {(c.heads, c.kv_heads, c.head_dim, c.mask, c.align) for c in cases} == {(32, 8, 128, "causal",
                                                                                   "bottom-right")}
    assert set(spec.variants) == {"naive", "sdpa", "sdpa.math", "sdpa.flash", "flex"}


def test_roofline_columns_follow_the_ceilings():
    from reports.frames import with_peaks

    df = pd.DataFrame({"run": "r", "dtype": "float32", "flops": [1e9, 1e12], "bytes": [1e8, 1e8],
                       "tflops": [0.01, 0.5], "gbps": [1.0, 0.1]})
    out = with_peaks(df, [{"run": "r", "peaks_tflops": {"float32": 1.0}, "peak_gbps": 20.0}])
    assert list(out["intensity"]) == [10.0, 10000.0]
    # intensity 10 FLOP/B x 20 GB/s = 0.2 TFLOP/s < 1: memory-bound; 10^4 x 20 GB/s > 1: compute-bound
    assert list(out["bound"]) == ["memory", "compute"]
    assert list(out["roof_tflops"]) == pytest.approx([0.2, 1.0])
    assert list(out["pct_roof"]) == pytest.approx([5.0, 50.0])
    assert list(out["pct_bw"]) == pytest.approx([5.0, 0.5])
    # a variant's own traffic model, where it gives one, sets its intensity
    modelled = with_peaks(df.assign(traffic_bytes=[None, 1e12]), [{"run": "r", "peaks_tflops": {"float32": 1.0},
                                                                   "peak_gbps": 20.0}])
    assert list(modelled["intensity"]) == [10.0, 1.0] and list(modelled["bound"]) == ["memory", "memory"]


def test_naive_declares_the_traffic_of_the_scores_it_materialises(registry):
    from bench.measure.flops import DIRECTION_FACTOR, min_bytes
    from reports.frames import tidy, with_peaks

    case = Case("cpu", "float32", 2, 4, 4, 256, 128, 32, "causal", None, "fwd")
    info = registry["naive"].prepare(case).info
    scores = 2 * 4 * 256 * 128 * 4  # bytes of one (B, H, Lq, Lk) float32 tensor
    assert info["materialised_bytes"] == 8 * scores  # QK^T, scale, mask, softmax, @V
    rows = [case.replace(direction=d).to_dict() | {"variant": "naive", "status": "ok", "flops": 1e9, "median_ms": 1.0,
                                                   "bytes": min_bytes(case.replace(direction=d)),
                                                   "materialised_bytes": 8 * scores, "run": "r"}
            for d in ("fwd", "bwd")]
    df = with_peaks(tidy(pd.DataFrame(rows)), [{"run": "r", "peaks_tflops": {"float32": 1.0}, "peak_gbps": 20.0}])
    for (_, r), d in zip(df.iterrows(), ("fwd", "bwd")):  # the report's traffic: the minimum and the scores
        moved = min_bytes(case.replace(direction=d)) + 8 * scores * DIRECTION_FACTOR[d]
        assert r["intensity"] == pytest.approx(1e9 / moved)


@pytest.mark.slow
def test_approximate_variants_are_timed_with_their_errors_and_charted(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,linear.elu,performer,nystrom,chunked.online", "--seq-lens",
                   "64,128", "--heads", "2", "--head-dims", "16", "--masks", "none,causal", "--budget-ms", "10",
                   "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    by = {(r["variant"], r["mask"], r["q_len"]): r for r in rows}
    assert by[("nystrom", "causal", 64)]["status"] == "unsupported"  # bidirectional only, as declared
    timed = [r for r in rows if r["status"] == "ok"]
    worse = [r for r in rows if r["status"] == "mismatch"]  # FAVOR+ on unit-spread logits can do worse than zeros
    assert len(timed) + len(worse) == 18  # 5 variants x 2 masks x 2 lengths, less nystrom's causal
    assert len(timed) >= 14
    for r in worse:
        assert r["variant"] == "performer" and r["rel_err"] >= 1 and r["median_ms"] is None
        assert r["reason"].startswith("worse than returning zeros")
    for r in timed:
        assert r["median_ms"] > 0 and r["samples"] >= 1 and 0 <= r["rel_err"] and -1 <= r["cosine"] <= 1
        assert r["approximate"] == (r["variant"] in ("linear.elu", "performer", "nystrom"))
        assert (r["tflops"] is None) == r["approximate"]  # no achieved TFLOP/s for work it does not do
        if not r["approximate"]:
            assert r["rel_err"] < 1e-5  # exact: naive, and the online softmax
    assert all(by[("linear.elu", m, n)]["rel_err"] > 0.1 for m in ("none", "causal") for n in (64, 128))
    assert json.loads((out / "env.json").read_text())["peak_gbps"] > 0
    charts = out / "report" / "charts"
    for name in ("error", "pareto", "roofline"):
        assert (charts / f"{name}.png").stat().st_size > 5000
    html = (out / "report" / "index.html").read_text()
    assert "% of the roofline" in html and "relative error against the float64 reference" in html
