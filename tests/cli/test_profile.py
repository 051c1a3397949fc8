"""torch.profiler's breakdown: `python -m bench profile`, `sweep --profile`, the operator categories."""

import json

import pandas as pd
import pytest

from bench.case import Case
from bench.features.profile.profiler import CATEGORIES, categorize, profile_case
from tests.conftest import read_jsonl, run_cli


def test_profile_naive_on_cpu_writes_trace_and_breakdown(registry, tmp_path):
    case = Case("cpu", "float32", 1, 4, 4, 256, 256, 32, "causal", None, "fwd")
    res = profile_case(registry["naive"], case, tmp_path)
    trace = json.loads(res["trace"].read_text())
    events = trace["traceEvents"]
    assert any(e.get("name") == "aten::bmm" for e in events)
    csv = pd.read_csv(res["csv"])
    assert abs(csv["share_pct"].sum() - 100) < 0.5
    assert abs(sum(res["categories"].values()) - 100) < 0.5
    # each kind of work is found and named; its share of the time is the machine's (8-30% matmul here)
    assert res["categories"]["matmul"] > 0 and res["categories"]["softmax"] > 0
    names = set(csv["name"])
    assert {"aten::bmm", "aten::_softmax"} <= names
    assert set(csv["category"]) <= set(CATEGORIES)


@pytest.mark.slow
def test_profile_command_prints_breakdown(tmp_path, capsys):
    proc = run_cli("profile", "--variant", "sdpa.flash", "--seq-lens", "256", "--heads", "2",
                   "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "by category:" in proc.stdout and "fused attention" in proc.stdout
    assert list(tmp_path.glob("trace_sdpa.flash_*.json")) and list(tmp_path.glob("breakdown_*.csv"))
    from bench.cli import main

    assert main(["profile", "--variant", "nope"]) == 2
    assert "unknown variant 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("name, category", [
    ("aten::bmm", "matmul"), ("aten::_softmax", "softmax"), ("aten::expand", "other"),
    ("aten::masked_fill", "mask/elementwise"), ("aten::_scaled_dot_product_flash_attention_for_cpu",
                                               "fused attention"),
    ("aten::copy_", "copy"), ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "fused attention"),
    ("void at::native::vectorized_elementwise_kernel<4, ...>", "mask/elementwise"),
])
def test_categories(name, category):
    assert categorize(name) == category


@pytest.mark.slow
def test_sweep_profile_adds_shares_and_breakdown_chart(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,sdpa.flash", "--seq-lens", "64,128", "--heads", "2",
                   "--head-dims", "16", "--masks", "none", "--budget-ms", "5", "--profile", "--out", out,
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert not any(k.startswith("share_") for r in rows for k in r)  # timed rows: no profiler near them
    profiled = read_jsonl(out / "profile.jsonl")  # the profiled pass, after all the timing
    assert {(r["variant"], r["q_len"]) for r in profiled} == {(r["variant"], r["q_len"]) for r in rows}
    for r in profiled:
        shares = [v for k, v in r.items() if k.startswith("share_")]
        assert len(shares) == len(CATEGORIES) and abs(sum(shares) - 100) < 1
    merged = pd.read_csv(out / "report" / "results.csv")
    assert merged["share_matmul"].notna().all()  # the report puts them beside their cells
    assert (out / "report" / "charts" / "breakdown.png").exists()


def test_profile_categories_for_hopper_kernels_and_annotations():
    from bench.features.profile.profiler import breakdown, is_annotation

    assert categorize("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_TNT") == "matmul"
    assert categorize("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>") == "matmul"
    assert categorize("gemv2T_kernel_val") == "matmul"
    assert categorize("fmha_cutlassF_bf16_aligned_64x128_rf_sm80") == "fused attention"

    class Event:  # a key_averages() row, on the device
        def __init__(self, key, us, annotation=False):
            self.key, self.self_device_time_total, self.count = key, us, 1
            self.is_user_annotation = annotation
            self.device_type = None

        @property
        def self_cuda_time_total(self):  # deprecated: reading it warns
            raise AssertionError("read self_cuda_time_total")

    class Prof:
        def key_averages(self):
            return [Event("nvjet_hsh_gemm", 600.0), Event("triton_per_fused_flex", 400.0),
                    Event("## Call CompiledFxGraph abc ##", 1000.0), Event("region", 1000.0, annotation=True)]

    assert is_annotation(Event("Torch-Compiled Region: 0/0", 1.0))
    rows = breakdown(Prof(), "cuda")
    assert [(r["name"], round(r["share_pct"])) for r in rows] == [("nvjet_hsh_gemm", 60),
                                                                  ("triton_per_fused_flex", 40)]


@pytest.mark.slow
def test_profile_takes_several_variants(tmp_path):
    proc = run_cli("profile", "--variants", "naive,sdpa.math", "--seq-lens", "64", "--heads", "2",
                   "--head-dims", "16", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {p.name.split("_")[1] for p in tmp_path.glob("trace_*.json")} == {"naive", "sdpa.math"}
