"""`python -m bench gpu-check`: its refusals, and its steps rehearsed on the CPU."""

import json

import pytest
import torch

from bench.cli import main
from tests.conftest import read_jsonl, run_cli
from tests.support.text import count, value


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
    for sub in ("matrix", "cross"):  # the scaling sweeps' reports are drawn on a GPU only
        assert (tmp_path / sub / "report" / "index.html").exists()
    scaled = {(r["variant"], r["mask"]) for r in read_jsonl(tmp_path / "scaling-causal" / "results.jsonl")}
    assert scaled == {("naive", "causal")}  # causal for naive and SDPA, window for the windowed ones
    scaled = {(r["variant"], r["mask"]) for r in read_jsonl(tmp_path / "scaling-window" / "results.jsonl")}
    assert scaled == {("window.chunked", "window")}
    from bench.model.row import current_rows

    mixed = current_rows(read_jsonl(tmp_path / "mix" / "results.jsonl"))  # naive takes a mix, window.chunked says why
    assert {r["mix"] for r in mixed} == {"2x(4/4)+1x(2/16)+8x(1/16)"} and len(mixed) == 12
    assert {r["status"] for r in mixed if r["variant"] == "naive"} == {"ok"}
    (line,) = [line for line in out.splitlines() if "mixed batch" in line]
    assert line.split()[-3:] == ["ok", "ok:", "naive"]
    assert list(tmp_path.glob("trace_naive_*.json"))
    assert out.strip().splitlines()[-1] == "PASS"


@pytest.mark.slow
def test_gpu_check_refuses_a_used_folder_and_a_bad_length(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("an earlier run")
    assert main(["gpu-check", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["gpu-check", "--device", "cpu", "--seq-len", "abc"]) == 2
    assert "--seq-len takes a whole number from 16 to" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_check_quick_rehearsal_on_cpu(tmp_path):
    """The device acceptance check, at CPU sizes: five verdicts, one PASS or FAIL line, an
    exit code that agrees, and the verdicts written to quick-check.json."""
    proc = run_cli("gpu-check", "--quick", "--device", "cpu", "--out", tmp_path / "q", timeout=900)
    lines = proc.stdout.strip().splitlines()
    verdicts = {v["check"]: v for v in json.loads((tmp_path / "q" / "quick-check.json").read_text())}
    assert [c[0] for c in verdicts] == ["1", "2", "2", "3", "3", "4", "4", "5", "6", "7", "1"]  # Flex's compiles last
    assert list(verdicts)[-1].startswith("1 flex x mask")
    assert (lines[-1] == "PASS") == (proc.returncode == 0) and all(v["ok"] for v in verdicts.values()) == \
        (proc.returncode == 0)
    for name, v in verdicts.items():
        if not name.startswith("4"):  # timer agreement on a shared CPU is the one noisy verdict
            assert v["ok"], (name, v["detail"])
    assert "memory exponent naive" in proc.stdout and "best sdpa" in proc.stdout


def test_a_sticky_cuda_error_neither_masks_the_row_nor_raises(monkeypatch):
    import bench.engine.cell as cell
    from bench.engine.result import CellResult
    from bench.measure.cellsteps import free_device_memory
    from bench.measure.settings import MeasureSettings
    from bench.model.case import Case

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    monkeypatch.setattr(torch.cuda, "empty_cache", broken)
    free_device_memory("cuda")  # the error is already in the row; freeing must not raise again
    result = CellResult("sdpa.cudnn", Case(device="cuda"), MeasureSettings())
    row = result.fail(RuntimeError("cuDNN Frontend error: No execution plans support the graph")).row()
    assert row["status"] == "unsupported"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert cell.cuda_broken()  # the worker then exits, and a fresh one takes the next case


def test_each_quick_verdict_is_written_and_printed_as_it_is_reached(tmp_path, capsys):
    from bench.cli.gpu_check import Verdicts

    v = Verdicts(tmp_path / "quick-check.json")
    v.add("1 matrix", True, "ok 10")
    assert json.loads((tmp_path / "quick-check.json").read_text()) == [{"check": "1 matrix", "ok": True,
                                                                         "detail": "ok 10"}]
    v.add("2 best SDPA backend TFLOP/s", False, "no SDPA backend ran")  # a window that closes here keeps both
    assert [x["check"] for x in json.loads((tmp_path / "quick-check.json").read_text())] == [
        "1 matrix", "2 best SDPA backend TFLOP/s"]
    assert capsys.readouterr().out.splitlines() == ["ok   1 matrix: ok 10",
                                                    "FAIL 2 best SDPA backend TFLOP/s: no SDPA backend ran"]


def test_the_sdpa_verdict_holds_each_backend_to_its_share_of_the_measured_peak():
    from bench.api import discover
    from bench.runs.judge.acceptance import sdpa_verdict

    registry = discover()
    shares = {n: registry[n].traits.peak_share for n in registry.names() if registry[n].traits.peak_share}
    assert shares["sdpa.cudnn"] == 0.6 and shares["sdpa.flash"] == 0.35  # as the variants declare them
    rows = [{"variant": "sdpa.flash", "status": "ok", "tflops": 380.0},
            {"variant": "sdpa.efficient", "status": "ok", "tflops": 200.0}]
    name, ok, detail = sdpa_verdict(rows, peak=790.0, shares=shares)
    assert ok and detail.startswith("best sdpa.flash 380.0 TFLOP/s (threshold 0.35 x the measured matmul peak 790")
    cudnn = [{"variant": "sdpa.cudnn", "status": "ok", "tflops": 420.0}] + rows
    assert not sdpa_verdict(cudnn, peak=790.0, shares=shares)[1]  # cuDNN below 0.6 x 790 = 474: its verdict, named
    assert "best sdpa.cudnn" in sdpa_verdict(cudnn, peak=790.0, shares=shares)[2]
    assert sdpa_verdict(cudnn, peak=790.0)[1]  # one that declares no share: the table's peak share (0.35 x 790 = 277)
    ok, detail = sdpa_verdict(rows, peak=None)[1:]
    assert not ok and "no matmul peak" in detail
    assert sdpa_verdict(rows, peak=None, absolute=0.0)[1]  # the CPU rehearsal's relaxed threshold


def test_the_kernel_verdict_names_what_ran_and_fails_a_backend_that_ran_anothers_kernels():
    from bench.features.gpu_state.kernels import mismatch
    from bench.runs.judge.acceptance import kernel_verdict

    rows = [{"variant": "sdpa.flash", "status": "ok", "kernels": ["pytorch_flash::flash_fwd_kernel"],
             "backend_ran": "flash"},
            {"variant": "sdpa", "status": "ok", "kernels": ["cudnn_generated_fort_native_sdpa"],
             "backend_ran": "cudnn"}]
    name, ok, detail = kernel_verdict(rows, "cuda")
    assert ok and count(name, "kernels") == 2 and detail == "sdpa.flash -> flash, sdpa -> cudnn"
    wrong = [rows[0] | {"backend_ran": "math", "kernel_mismatch": mismatch("flash", "math")}]
    ok, detail = kernel_verdict(wrong, "cuda")[1:]
    assert not ok and detail == f"sdpa.flash: {mismatch('flash', 'math')}"
    assert kernel_verdict([rows[0] | {"kernels": []}], "cuda")[1] is False


def test_the_gpu_state_verdict_wants_nvml_columns_and_a_graph_time_under_0_1_ms():
    from bench.runs.judge.acceptance import gpu_state_verdict

    row = {"variant": "sdpa", "status": "ok", "direction": "fwd", "median_ms": 0.04, "graph_median_ms": 0.021,
           "kernel_sum_ms": 0.02, "timer_mismatch": "CUDA-graph time 0.021 ms is 0.52x the event time 0.04 ms",
           "sm_clock_start_mhz": 1980, "power_start_w": 120.0, "power_limit_w": 700.0, "energy_j_per_call": 0.0004}
    bwd = row | {"direction": "bwd", "median_ms": 0.08, "graph_median_ms": 0.06}
    graph = {"variant": "sdpa", "status": "ok", "direction": "fwd", "median_ms": 0.021, "timer": "cuda-graph"}
    graphs = [graph, graph | {"direction": "bwd", "median_ms": 0.05}]
    name, ok, detail = gpu_state_verdict([row, bwd], graphs, "cuda")
    assert ok and "fwd: events 0.04 ms, graph 0.021 ms" in detail and "bwd: events 0.08 ms" in detail
    assert "SM 1980 MHz" in detail and "of 700.0" in detail
    assert not gpu_state_verdict([row | {"graph_median_ms": None}, bwd], graphs, "cuda")[1]
    failed = gpu_state_verdict([row, bwd | {"graph_median_ms": None, "graph_error": "RuntimeError: capture"}],
                               graphs, "cuda")
    assert not failed[1] and "bwd: the CUDA-graph cross-check failed (RuntimeError: capture)" in failed[2]
    assert not gpu_state_verdict([row, bwd], [graphs[0] | {"timer": "cuda-events+l2-flush"}, graphs[1]], "cuda")[1]
    assert not gpu_state_verdict([row], graphs, "cuda")[1]  # the bwd cell did not run
    assert gpu_state_verdict([], [], "cpu")[1]


def test_the_workload_verdict_wants_ragged_sdpa_ok_and_paged_flex_on_its_own_pages():
    from bench.runs.judge.acceptance import workload_verdict

    ragged = [{"variant": "sdpa", "status": "ok", "median_ms": 0.3, "layout": "nested", "extra": {"layout_ms": 0.05}}]
    paged = [{"variant": "flex", "status": "ok", "median_ms": 0.02, "batch": 4, "extra": {"kv_blocks_visited": 0.25}}]
    name, ok, detail = workload_verdict(ragged, paged, "cuda")
    assert ok and value(detail, "layout change") == 0.05 and "nested" in detail
    assert count(detail, "of the pool's blocks") == 0.25
    crowded = workload_verdict(ragged, [paged[0] | {"extra": {"kv_blocks_visited": 0.9}}], "cuda")[2]
    assert count(crowded, "of the pool's blocks") == 0.9 and "own pages: 1/4" in crowded
    failed = [{"variant": "sdpa", "status": "error", "reason": "RuntimeError: x"}]
    assert not workload_verdict(failed, paged, "cuda")[1]
    assert workload_verdict(ragged, [], "cpu")[1]  # paged flex is a GPU step


def test_the_quick_check_fits_five_minutes_on_an_h200_by_its_own_projection():
    from bench.api import discover
    from bench.cli.gpu_check import QUICK_LIMIT_S, quick_projection

    every = discover()  # the check's sweeps take every installed variant, xformers included
    projected = quick_projection(every, "cuda")
    assert 60 < projected <= QUICK_LIMIT_S, projected


@pytest.mark.slow  # a few seconds: the quick loop leaves it to the whole suite
def test_gpu_check_sets_teardown_cupti_before_torch_is_imported(tmp_path):
    """The full check profiles in its own process before it times there: TEARDOWN_CUPTI must be in
    the environment when torch starts (Kineto reads it then), not only in the workers."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib.abc, os, sys\n"
        "seen = []\n"
        "class Spy(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' and not seen:\n"
        "            seen.append(os.environ.get('TEARDOWN_CUPTI'))\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "from bench.cli import main\n"
        "main(['gpu-check', '--quick', '--dry-run', '--device', 'cpu'])\n"
        "print('at torch import:', seen)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TEARDOWN_CUPTI"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300).stdout
    assert "at torch import: ['1']" in out, out[-500:]


def test_the_quick_check_and_its_extra_step_dry_run_with_their_cells_and_projections(capsys):
    from bench.api import discover
    from bench.cli.gpu_check import QUICK_LIMIT_S, extra_projection, extra_steps, quick_projection

    assert main(["gpu-check", "--quick", "--dry-run"]) == 0
    quick = capsys.readouterr().out
    assert "matrix-compiled: 8 cells" in quick and "flex cuda bfloat16" in quick
    assert quick.strip().splitlines()[-1].startswith("gpu-check --quick on cuda:")
    assert main(["gpu-check", "--quick", "--extra", "--dry-run"]) == 0
    extra = capsys.readouterr().out
    for step in ("sinks", "mla", "mix", "cross-gqa", "ragged", "decode-gqa", "paged-64"):
        assert f"{step}: " in extra, step
    assert "causal+learned_sink" in extra and "192/128" in extra and "paged:64" in extra and "align=bottom-right" \
        in extra
    every = discover()
    assert set(extra_steps(every, "cuda")) >= {"sinks", "mla", "mix", "cross-gqa", "ragged", "decode-gqa", "paged-64",
                                               "layers", "layer-graph", "fp8", "anchor"}
    assert "scope=decoder" in extra and "float8_e4m3fn" in extra and "python -m bench ab" in extra
    assert quick_projection(every, "cuda") <= QUICK_LIMIT_S
    # one device script of 8 minutes, and beyond them the context-parallel step's fixed costs, which no step
    # before it can share: its process group's start (priced as a worker's) and its ranks' first compile
    # (Ulysses around flex compiles in the rank processes): the parts of the check the 8 minutes cannot also hold
    from bench.features.cost_model.plan import COMPILE_FIRST_S, COMPILE_S, RANK_GROUP_START_S

    assert "ranks: 3 cells" in extra and "cp.ring cuda" in extra and "cp.torch cuda" in extra
    assert "cp.alltoall.flex cuda" in extra
    ranks_fixed = RANK_GROUP_START_S["cuda"] + COMPILE_FIRST_S["cuda"] + COMPILE_S["cuda"]
    assert quick_projection(every, "cuda") + extra_projection(every, "cuda") <= 8 * 60 + ranks_fixed
    assert main(["gpu-check", "--extra"]) == 2  # with --quick only


def test_a_cold_compile_with_a_backward_is_priced_as_one():
    from bench.api import discover
    from bench.features.cost_model import plan
    from bench.model.case import Case

    flex = discover()["flex"]
    fwd = Case("cuda", "bfloat16", 2, 8, 8, 1024, 1024, 64, "causal", None, "fwd")
    assert plan.cell_setup_s(flex, fwd) == plan.COMPILE_COLD_S["cuda"]
    assert plan.cell_setup_s(flex, fwd.replace(direction="bwd")) == plan.COMPILE_COLD_BACKWARD_S["cuda"] >= 20
