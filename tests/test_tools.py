"""profile, export, selfcheck, the pytest-benchmark suite and gpu-check, as a user runs them."""

import json
import statistics
import subprocess
import sys

import pandas as pd
import pytest
import torch

from bench.case import Case
from bench.cli import main
from bench.engine import store
from bench.measure.profiler import CATEGORIES, categorize, profile_case
from tests.conftest import ROOT, read_jsonl, run_cli


def test_profile_naive_on_cpu_writes_trace_and_breakdown(registry, tmp_path):
    case = Case("cpu", "float32", 1, 4, 4, 256, 256, 32, "causal", None, "fwd")
    res = profile_case(registry["naive"], case, tmp_path)
    trace = json.loads(res["trace"].read_text())
    events = trace["traceEvents"]
    assert any(e.get("name") == "aten::bmm" for e in events)
    csv = pd.read_csv(res["csv"])
    assert abs(csv["share_pct"].sum() - 100) < 0.5
    assert abs(sum(res["categories"].values()) - 100) < 0.5
    assert res["categories"]["matmul"] > 10 and res["categories"]["softmax"] > 1
    names = set(csv["name"])
    assert {"aten::bmm", "aten::_softmax"} <= names
    assert set(csv["category"]) <= set(CATEGORIES)


@pytest.mark.slow
def test_profile_command_prints_breakdown(tmp_path):
    proc = run_cli("profile", "--variant", "sdpa.flash", "--seq-lens", "256", "--heads", "2",
                   "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "by category:" in proc.stdout and "fused attention" in proc.stdout
    assert list(tmp_path.glob("trace_sdpa.flash_*.json")) and list(tmp_path.glob("breakdown_*.csv"))
    bad = run_cli("profile", "--variant", "nope")
    assert bad.returncode == 2 and "unknown variant 'nope'" in bad.stderr


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


@pytest.mark.slow
def test_export_is_read_by_pytest_benchmark(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,sdpa.math", "--seq-lens", "64", "--heads", "2",
                   "--head-dims", "16", "--masks", "none,causal", "--budget-ms", "5", "--out", out,
                   "--no-report", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert main(["export", str(out), "--format", "pytest-benchmark"]) == 0
    path = out / "pytest-benchmark.json"
    from pytest_benchmark.storage.file import FileStorage

    class _Log:
        def info(self, *a, **k):
            pass

        warning = error = debug = info

    storage = FileStorage(str(tmp_path / "storage"), logger=_Log(), default_machine_id="m")
    loaded = list(storage.load_benchmarks(str(path)))
    assert len(loaded) == 4
    assert {b["name"].split("[")[0] for b in loaded} == {"naive", "sdpa.math"}
    rows = {f"{r['variant']}[{Case.from_dict(r).label().replace(' ', '-')}]": r for r in store.read_rows(out)}
    for b in loaded:  # the loader flattens stats: each benchmark carries its cell's own samples, in seconds
        samples = rows[b["name"]]["samples_ms"]
        assert b["rounds"] == len(samples) >= 1
        assert b["median"] == pytest.approx(statistics.median(samples) / 1e3)
        assert b["min"] == pytest.approx(min(samples) / 1e3)
    cli = subprocess.run([sys.executable, "-c", "from pytest_benchmark.cli import main; main()",
                          "compare", str(path), "--columns", "min,median,rounds"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "naive" in cli.stdout and "sdpa.math" in cli.stdout


@pytest.mark.slow
def test_selfcheck_pairs_the_tools_round_by_round(monkeypatch):
    """The two tools take turns (harness, tub, harness, tub, ...), and the ratio is the median
    of the per-round ratios, with its spread."""
    import bench.measure.selfcheck as sc
    from bench.case import Case
    from bench.registry import discover

    order = []
    real_interleave = sc.interleave

    def spy(timers, rounds, budget_ms, **kw):
        for name, t in timers.items():
            inner = t.run_round
            t.run_round = lambda ms, min_samples=1, _n=name, _f=inner: (order.append(_n), _f(ms, min_samples))
        return real_interleave(timers, rounds, budget_ms, **kw)

    monkeypatch.setattr(sc, "interleave", spy)
    case = Case("cpu", "float32", 1, 2, 2, 128, 128, 16, "none", None, "fwd")
    row = sc.check_cell(discover()["sdpa.math"], case, budget_ms=60, rounds=3)
    assert order == ["harness", "tub"] * 3
    assert row["ratio_tub_lo"] <= row["ratio_tub"] <= row["ratio_tub_hi"]
    assert 0.5 < row["ratio_tub"] < 2.0  # the same call, timed by two tools
    assert row["harness_samples"] >= 3 and {"cpu_util", "other_cpu", "contended"} <= set(row)
    assert sc._ratio([2.0, 4.0, 3.0], [1.0, 2.0, 2.0]) == (2.0, 1.5, 2.0)


@pytest.mark.slow
def test_selfcheck_command_prints_a_paired_ratio_per_cell():
    proc = run_cli("selfcheck", "--variants", "naive,sdpa.math", "--seq-lens", "128", "--heads", "2",
                   "--budget-ms", "50")
    assert proc.returncode == 0, proc.stderr
    assert "median of the per-round ratios" in proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("naive", "sdpa.math"))]
    assert len(lines) == 2 and all("-" in ln.split()[-3] for ln in lines)  # the per-round spread


def test_benchmark_suite_runs_under_pytest_benchmark(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/benchmarks", "--benchmark-only", "-q",
                           "-k", "naive or sdpa.math", "--benchmark-max-time=0.02",
                           f"--benchmark-json={out}", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {b["name"] for b in json.loads(out.read_text())["benchmarks"]}
    assert any(n.startswith("test_variant[naive-") for n in names)
    assert any(n.startswith("test_variant[sdpa.math-") for n in names)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_gpu_check_refuses_cleanly_without_gpu(capsys, tmp_path):
    assert main(["gpu-check", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "needs an NVIDIA GPU" in err and "Traceback" not in err


@pytest.mark.slow
def test_gpu_check_dry_run_on_cpu(tmp_path, capsys):
    """The GPU check's own steps (sweeps, profiles, self-check, final table) on the CPU."""
    assert main(["gpu-check", "--device", "cpu", "--seq-len", "32", "--variants", "naive,window.chunked",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "status and median per cell" in out and "statuses: ok" in out
    assert "profile naive:" in out and "ratio_tub" in out
    for sub in ("matrix", "cross", "scaling-causal", "scaling-window"):
        assert (tmp_path / sub / "report" / "index.html").exists()
    scaled = {(r["variant"], r["mask"]) for r in read_jsonl(tmp_path / "scaling-causal" / "results.jsonl")}
    assert scaled == {("naive", "causal")}  # causal for naive and SDPA, window for the windowed ones
    scaled = {(r["variant"], r["mask"]) for r in read_jsonl(tmp_path / "scaling-window" / "results.jsonl")}
    assert scaled == {("window.chunked", "window")}
    assert list(tmp_path.glob("trace_naive_*.json"))
    assert out.strip().splitlines()[-1] == "PASS"


@pytest.mark.slow
def test_gpu_check_refuses_a_used_folder_and_a_bad_length(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("an earlier run")
    assert main(["gpu-check", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["gpu-check", "--device", "cpu", "--seq-len", "abc"]) == 2
    assert "--seq-len takes a positive whole number, got 'abc'" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_check_quick_rehearsal_on_cpu(tmp_path):
    """The device acceptance check, at CPU sizes: five verdicts, one PASS or FAIL line, an
    exit code that agrees, and the verdicts written to quick-check.json."""
    proc = run_cli("gpu-check", "--quick", "--device", "cpu", "--out", tmp_path / "q", timeout=900)
    lines = proc.stdout.strip().splitlines()
    verdicts = {v["check"]: v for v in json.loads((tmp_path / "q" / "quick-check.json").read_text())}
    assert [c[0] for c in verdicts] == ["1", "2", "3", "3", "4", "4", "5"]
    assert (lines[-1] == "PASS") == (proc.returncode == 0) and all(v["ok"] for v in verdicts.values()) == \
        (proc.returncode == 0)
    for name, v in verdicts.items():
        if not name.startswith("4"):  # timer agreement on a shared CPU is the one noisy verdict
            assert v["ok"], (name, v["detail"])
    assert "memory exponent naive" in proc.stdout and "best sdpa" in proc.stdout


def test_profile_categories_for_hopper_kernels_and_annotations():
    from bench.measure.profiler import breakdown, is_annotation

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


def test_a_sticky_cuda_error_neither_masks_the_row_nor_raises(monkeypatch):
    import bench.engine.cell as cell

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    monkeypatch.setattr(torch.cuda, "empty_cache", broken)
    cell._free("cuda")  # the error is already in the row; freeing must not raise again
    row = cell.fail({}, RuntimeError("cuDNN Frontend error: No execution plans support the graph"))
    assert row["status"] == "unsupported"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cell.cuda_broken()  # the worker then exits, and a fresh one takes the next case


@pytest.mark.slow
def test_profile_takes_several_variants(tmp_path):
    proc = run_cli("profile", "--variants", "naive,sdpa.math", "--seq-lens", "64", "--heads", "2",
                   "--head-dims", "16", "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {p.name.split("_")[1] for p in tmp_path.glob("trace_*.json")} == {"naive", "sdpa.math"}
