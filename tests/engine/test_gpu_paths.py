"""The CUDA paths' logic, on the CPU: CUDA-graph capture of a backward, the cross-check kept apart
from the timing, ragged SDPA without host syncs, NVML by UUID, throttling from NVML's reasons,
energy without the L2 flush, the worker's environment, paged flex's block mask, the timer in
compare, and the install metadata.  Each thin call into CUDA is replaced by a stand-in that
behaves as the real one does where it matters; ``gpu-check --quick`` runs the real ones."""

from __future__ import annotations

import contextlib
import math
import types

import pandas as pd
import pytest
import tomllib
import torch

from bench.features.gpu_state import nvml
from bench.measure.bound import bind_variant
from bench.measure.settings import MeasureSettings
from bench.model.case import Case
from tests.conftest import ROOT
from tests.support.text import count, numbers

# -- a stand-in for torch.cuda: streams, capture and events ------------------------------------------


class FakeCuda:
    """torch.cuda's stream, graph and event calls.  Like CUDA, it refuses work issued during a
    capture on a stream other than the capturing one (PyTorch issue 15623); ``op(stream)`` is
    what a kernel launch does, and autograd launches a backward op on its forward op's stream."""

    class Stream:
        def __init__(self, name="side"):
            self.name = name

        def wait_stream(self, other):
            pass

        def synchronize(self):
            pass

    def __init__(self):
        self.default = FakeCuda.Stream("default")
        self.current = self.default
        self.capturing = None  # the stream a capture runs on
        self.t = 0.0
        self.captured = []

    def current_stream(self):
        return self.current

    @contextlib.contextmanager
    def stream(self, s):
        before, self.current = self.current, s
        try:
            yield
        finally:
            self.current = before

    def op(self, stream):
        if self.capturing is not None and stream is not self.capturing:
            raise RuntimeError("operation would make the legacy stream depend on a capturing blocking stream")
        if self.capturing is not None:
            self.captured.append(stream.name)
        self.t += 0.01

    class CUDAGraph:
        def __init__(self):
            self.replays = 0

        def replay(self):
            self.replays += 1

    @contextlib.contextmanager
    def graph(self, g, stream=None):
        stream = stream or FakeCuda.Stream("pool")
        before, self.current, self.capturing = self.current, stream, stream
        try:
            yield
        finally:
            self.current, self.capturing = before, None

    def synchronize(self):
        pass

    def Event(self, enable_timing=True):  # noqa: N802 (torch.cuda's name)
        cuda = self

        class Event:
            def record(self):
                self.at = cuda.t
                cuda.t += 0.02

            def elapsed_time(self, end):
                return end.at - self.at

        return Event()


def _backward_call(cuda):
    """A ``bwd`` timed call as bound.timed() builds it: the forward runs now, on the current
    stream, and the returned call replays the backward on that same (the forward's) stream."""
    forward_stream = cuda.current_stream()
    cuda.op(forward_stream)  # the forward
    return lambda: cuda.op(forward_stream)  # autograd: each backward op on its forward's stream


def test_a_backward_is_captured_on_the_stream_its_forward_ran_on():
    from bench.measure.timing import GraphTimer

    cuda = FakeCuda()
    timer = GraphTimer(lambda: _backward_call(cuda), cuda=cuda)
    timer.run_round(1.0)
    assert cuda.captured == ["side"] and timer.result().samples_ms  # captured, replayed and timed
    # the call built on the default stream first (the forward outside the capture's stream), as the
    # harness did before: the capture refuses it, as CUDA does
    cuda = FakeCuda()
    prebuilt = _backward_call(cuda)
    with pytest.raises(RuntimeError, match="capturing blocking stream"):
        GraphTimer(lambda: prebuilt, cuda=cuda).run_round(1.0)


def _timed(registry, case):
    """The naive variant bound on ``case``, and its result as the worker holds it after a timing
    of median 0.05 ms."""
    from bench.engine.result import CellResult
    from bench.measure.timing import Timing

    timing = Timing([0.05] * 10, 1, 5, "cuda-events").summary()
    return bind_variant(registry["naive"], case), CellResult("naive", case, MeasureSettings(), timing=timing)


def test_a_failed_cross_check_is_recorded_and_never_wipes_the_timing(registry):
    from bench.features.gpu_state.kernels import gpu_check_columns
    from bench.model.row import Status

    class Uncapturable:
        def __init__(self, make_call):
            make_call()

        def run_round(self, budget_ms):
            raise RuntimeError("operation would make the legacy stream depend on a capturing blocking stream")

    case = Case(batch=1, heads=2, kv_heads=2, q_len=32, kv_len=32, head_dim=8, direction="bwd")
    bound, result = _timed(registry, case)
    result.gpu_checks = gpu_check_columns(bound, result.timing.median_ms, MeasureSettings(),
                                    names_of=lambda call, dev: (["flash_bwd_kernel"], 0.04), graph_timer=Uncapturable)
    row = result.decide(Status.OK).row()
    assert row["median_ms"] == 0.05 and row["graph_median_ms"] is None  # the timing stays
    assert row["graph_error"].startswith("RuntimeError:") and "legacy stream" in row["graph_error"]
    assert row["kernels"] == ["flash_bwd_kernel"] and "kernels_error" not in row

    def no_profiler(call, dev):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    bound, result = _timed(registry, case.replace(direction="fwd"))
    result.gpu_checks = gpu_check_columns(bound, result.timing.median_ms, MeasureSettings(budget_ms=5.0),
                                    names_of=no_profiler, graph_timer=lambda make: _FixedGraph(make, 0.049))
    row = result.decide(Status.OK).row()
    assert row["kernels_error"] == "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    assert row["graph_median_ms"] == pytest.approx(0.049) and row["median_ms"] == 0.05


class _FixedGraph:
    def __init__(self, make_call, ms):
        make_call()
        self.ms = ms

    def run_round(self, budget_ms):
        pass

    def result(self):
        from bench.measure.timing import Timing

        return Timing([self.ms] * 10, 20, 5, "cuda-graph")


# -- ragged SDPA: no host sync in the call, the layout change said and timed ------------------------------


def test_ragged_sdpa_passes_the_extreme_lengths_and_reports_its_layout_change(registry, monkeypatch):
    case = Case(batch=4, heads=4, kv_heads=2, q_len=64, kv_len=64, head_dim=16, lengths="lognormal:0.5")
    lens = case.seq_lengths()
    bound = bind_variant(registry["sdpa.math"], case)
    built = []
    real = torch.nested.nested_tensor_from_jagged

    def spy(*args, **kwargs):
        nt = real(*args, **kwargs)
        built.append(nt)
        return nt

    monkeypatch.setattr(torch.nested, "nested_tensor_from_jagged", spy)
    with bound.scope():
        out = bound.fn(*bound.inputs)
    assert out.shape == bound.inputs[0].shape and len(built) == 3
    for nt in built:  # cached on the tensor: SDPA never asks the device for them (an .item() sync)
        assert (nt._maybe_min_seqlen, nt._maybe_max_seqlen) == (min(lens), max(lens))
    info = bound.prepared.info
    assert info["layout_ms"] > 0 and info["layout_change"].startswith("in the timed call")
    assert "repeated per query head (GQA)" in info["layout_change"]


# -- NVML: the right GPU, throttling from its reasons, energy without the flush -------------------------


class FakeNvml:
    """nvidia-ml-py over two GPUs, each replaying a scripted history of (clock MHz, reason bits);
    the energy counter advances by ``mj_per_read`` millijoules at each sample."""
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, histories: dict, app_clock=1980, limit_mw=700_000, mj_per_read=1000.0):
        self.histories = {u: list(h) for u, h in histories.items()}
        self.reads = dict.fromkeys(histories, 0)
        self.app_clock, self.limit_mw, self.mj = app_clock, limit_mw, mj_per_read
        self.energy = dict.fromkeys(histories, 0.0)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.histories:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return uuid

    def _now(self, h):
        hist = self.histories[h]
        return hist[min(self.reads[h], len(hist) - 1)]

    def nvmlDeviceGetClockInfo(self, h, kind):
        self.reads[h] += 1
        return self._now(h)[0]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._now(h)[1]

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_000

    def nvmlDeviceGetTemperature(self, h, kind):
        return 70

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.energy[h] += self.mj
        return self.energy[h]

    def nvmlDeviceGetApplicationsClock(self, h, kind):
        return self.app_clock

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self.limit_mw


class FakeTorchCuda:
    def __init__(self, uuids):
        self.uuids = uuids

    def current_device(self):
        return 0

    def get_device_properties(self, i):
        return type("Props", (), {"uuid": self.uuids[i]})()


def test_nvml_opens_the_gpu_torch_uses_by_its_uuid_not_nvml_index_0():
    # a worker with CUDA_VISIBLE_DEVICES=5: torch's device 0 is the machine's GPU 5
    fake = FakeNvml({"GPU-aaaa": [(1410, 0)], "GPU-ffff": [(1980, 0)]})
    uuid = nvml.device_uuid(torch_cuda=FakeTorchCuda(["ffff"]))
    assert uuid == "GPU-ffff"
    gpu = nvml.open_nvml(fake, uuid)
    assert nvml.sample(gpu).sm_clock_mhz == 1980 and fake.reads == {"GPU-aaaa": 0, "GPU-ffff": 1}
    assert nvml.open_nvml(fake, None) is None  # no UUID: no figures rather than another GPU's
    assert nvml.device_uuid(torch_cuda=FakeTorchCuda(["MIG-1234"])) == "MIG-1234"


def _turns(fake, uuid, turns=2):
    gpu = nvml.open_nvml(fake, uuid)
    device = nvml.device_info(gpu)
    cell = nvml.Cell()
    for _ in range(turns):
        cell.turn(nvml.sample(gpu), nvml.sample(gpu), calls=10, seconds=0.6)
    return cell.columns(device, tokens=8)


def test_throttling_comes_from_nvmls_slowdown_reasons_against_the_application_clock():
    idle_then_hot = FakeNvml({"GPU-a": [(345, 0x1), (1500, 0x40), (1500, 0x40), (1500, 0x40)]})
    cols = _turns(idle_then_hot, "GPU-a")  # the first sample idle: a ratio to it would never flag
    assert cols["throttled"] and cols["throttle_reasons"] == "hw thermal slowdown"
    why = cols["throttled_why"]
    assert "hw thermal slowdown" in why and numbers(why) == [1500, 0.76, 1980]  # the clock, its ratio, the reference
    capped = FakeNvml({"GPU-a": [(1980, 0x0), (1700, 0x4), (1650, 0x4), (1650, 0x4)]})
    cols = _turns(capped, "GPU-a")  # boost at first, then held at its power cap under load: how it runs
    assert not cols["throttled"] and cols["throttle_reasons"] == "sw power cap"
    assert cols["power_limit_w"] == 700.0 and cols["sm_clock_end_mhz"] == 1650


def test_energy_per_call_leaves_out_the_l2_flushes():
    fake = FakeNvml({"GPU-a": [(1980, 0)]}, mj_per_read=0.0)
    gpu = nvml.open_nvml(fake, "GPU-a")
    clock = iter(range(10_000))

    def flush():  # each flush costs 5 mJ on the counter
        fake.energy["GPU-a"] += 5.0

    per_flush = nvml.flush_energy_mj(gpu, flush, lambda: None, seconds=3, clock=lambda: next(clock))
    assert per_flush == pytest.approx(5.0)
    start = nvml.sample(gpu)
    fake.energy["GPU-a"] += 10 * 2.0 + 10 * 5.0  # 10 calls of 2 mJ, each after a 5 mJ flush
    end = nvml.sample(gpu)
    cell = nvml.Cell()
    cell.turn(start, end, calls=10, flushes=10, seconds=1.2)
    cols = cell.columns(nvml.device_info(gpu), tokens=4, flush_mj=per_flush)
    assert cols["energy_j_per_call"] == pytest.approx(0.002) and cols["energy_j_per_token"] == pytest.approx(0.0005)
    assert "energy_j_per_call" not in cell.columns(None, tokens=4)  # flushed turns, no flush figure: no guess


def test_the_gpu_state_step_counts_each_turns_calls_and_flushes_between_its_samples(monkeypatch):
    """nvml.Turns, the step's watch: samples after a synchronize at each turn's start and end, and
    the calls and flushes the timer made inside the turn (warm-up included), per variant."""
    fake = FakeNvml({"GPU-a": [(1980, 0)]}, mj_per_read=0.0)
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    clock = iter(range(0, 100, 3))  # each turn lasts 3 s on a fake clock
    monkeypatch.setattr(nvml.time, "perf_counter", lambda: next(clock) / 5)  # 0.6 s per turn
    watch = nvml.Turns(nvml.open_nvml(fake, "GPU-a"))
    timer = types.SimpleNamespace(warmup_calls=0, rounds=[], number=1, flushes=0)
    for round_calls in (3, 5):
        with watch.turn("sdpa", timer):
            timer.warmup_calls += 1
            timer.rounds.append([0.1] * round_calls)
            timer.flushes += round_calls
            fake.energy["GPU-a"] += 7.0 * (round_calls + 1)  # 7 mJ per call
    cell = watch.cells["sdpa"]
    assert (cell.calls, cell.flushes, len(syncs)) == (10, 8, 4)
    cols = cell.columns(nvml.Device(None, None), tokens=1, flush_mj=0.0)
    assert cols["energy_j_per_call"] == pytest.approx(0.007)  # 70 mJ over 10 calls, in 1.2 s of turns
    assert list(watch.cells) == ["sdpa"]


def test_a_throttled_row_is_shaky(tmp_path):
    from bench.runs import store
    from reports.frames import tidy

    row = dict(device="cuda", dtype="bfloat16", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
               window=None, direction="fwd", reason="", status="ok", variant="sdpa", q_len=128, kv_len=128,
               median_ms=0.05, throttled=True)
    assert bool(tidy(pd.DataFrame([row]))["shaky"].iloc[0])
    assert not store.done_keys([row], frozenset({"shaky"}))  # --retry shaky measures it again


# -- the worker's environment -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_runs_with_cupti_torn_down(tmp_path):
    """A real worker process: the variant reads the environment torch was imported under."""
    from bench.engine.runner import Worker, WorkerSettings
    from tests.conftest import write_plugin

    plugin = write_plugin(tmp_path, "envprobe", """
        import os

        import torch.nn.functional as F
        from bench.registry import Prepared, variant

        @variant("envprobe", description="reports the worker's environment", devices=("cpu",), dtypes=("float32",),
                 masks=("none",), backward=False)
        def envprobe(case):
            return Prepared(F.scaled_dot_product_attention,
                            {"teardown_cupti": os.environ.get("TEARDOWN_CUPTI", "unset")})
    """)
    worker = Worker(WorkerSettings(MeasureSettings(budget_ms=5.0, rounds=1), plugins=[str(plugin)]))
    try:
        rows = []
        tag, _ = worker.run_group(["envprobe"], Case(batch=1, heads=1, kv_heads=1, q_len=8, kv_len=8, head_dim=8),
                                  60.0, rows.append)
    finally:
        worker.stop()
    assert tag == "done" and rows[0]["status"] == "ok", (rows[0]["status"], rows[0]["reason"])
    assert rows[0]["extra"]["teardown_cupti"] == "1"


# -- paged flex: each query block visits its own sequence's pages only --------------------------------------


def _paged_block_mask(registry_case):
    import variants.flex as flex_module

    seen = {}

    def flex(q, k, v, **kw):  # stands in for the compiled flex_attention: keeps what it was given
        seen.update(kw)
        return q

    attention, info = flex_module._paged(registry_case, flex)
    from bench.measure.inputs import make_inputs

    attention(*make_inputs(registry_case))
    return seen["block_mask"], info


def test_paged_flex_visits_only_each_sequences_own_pages():
    case = Case(batch=4, heads=4, kv_heads=2, q_len=4, kv_len=256, head_dim=16, kv_layout="paged:16")
    bm, info = _paged_block_mask(case)
    table = case.page_table()
    pages, per_page = len(table[0]), 16 // info["kv_block"]
    assert info["kv_block"] == 16 and bm.kv_indices.shape[-1] == 4 * pages * per_page
    for b in range(4):
        own = {p * per_page + i for p in table[b] for i in range(per_page)}
        n = int(bm.kv_num_blocks[b, 0, 0]) + int(bm.full_kv_num_blocks[b, 0, 0])
        visited = set(bm.kv_indices[b, 0, 0, :int(bm.kv_num_blocks[b, 0, 0])].tolist()) | \
            set(bm.full_kv_indices[b, 0, 0, :int(bm.full_kv_num_blocks[b, 0, 0])].tolist())
        assert visited == own and n == pages * per_page  # its own pages, every one, nothing else
    assert info["kv_blocks_visited"] == pytest.approx(1 / 4)  # was ~0.9: batch x the work


def test_paged_flex_builds_a_block_mask_per_head_for_a_mask_that_depends_on_the_head(monkeypatch):
    from bench.model import maskdefs

    monkeypatch.setattr(maskdefs, "_DEFS", dict(maskdefs._DEFS))

    @maskdefs.mask("by_head", description="head h keeps keys of its own parity and the first one")
    def by_head(b, h, q_idx, kv_idx):
        return (kv_idx % 2 == h % 2) | (kv_idx == 0)

    case = Case(batch=2, heads=2, kv_heads=2, q_len=2, kv_len=256, head_dim=16, mask="by_head", kv_layout="paged:128")
    bm, _ = _paged_block_mask(case)
    assert bm.kv_num_blocks.shape[:2] == (2, 2)  # each head its own rows (with H=None: head 0's for both)
    # every kept pair is in a partial block, where the mask is evaluated per head at the slot's logical position
    b, h, q, kv = 1, 1, torch.tensor(0), torch.arange(2 * 2 * 128)
    keep = bm.mask_mod(torch.tensor(b), torch.tensor(h), q, kv)
    slot_page = torch.tensor(case.page_table()[b]).repeat_interleave(128) * 128 + torch.arange(128).repeat(2)
    expected = torch.zeros(2 * 2 * 128, dtype=torch.bool)
    expected[slot_page] = by_head(b, h, q, torch.arange(256))
    assert torch.equal(keep, expected)


# -- compare: a timer change is not a speed change -------------------------------------------------------------


def test_compare_counts_cells_timed_with_another_timer_apart():
    from reports.compare import Drift, compare_frames
    from reports.frames import tidy

    base = dict(device="cuda", dtype="bfloat16", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
                window=None, direction="fwd", reason="", status="ok", variant="sdpa", q_len=128, kv_len=128)
    a = [base | dict(median_ms=0.060, q1_ms=0.059, q3_ms=0.061, timer="cuda-events+l2-flush")]
    b = [base | dict(median_ms=0.030, q1_ms=0.029, q3_ms=0.031, timer="cuda-graph")]
    m = compare_frames(tidy(pd.DataFrame(a)), tidy(pd.DataFrame(b)))
    assert list(m["verdict"]) == ["other timer"]  # twice as fast, but a graph has no launch gaps or cold L2
    same = compare_frames(tidy(pd.DataFrame(a)), tidy(pd.DataFrame([b[0] | {"timer": "cuda-events+l2-flush"}])),
                          drift=Drift(0.01, 0.01))
    assert list(same["verdict"]) == ["faster"]


def test_compare_gate_never_fails_on_another_timer(tmp_path, capsys):
    from bench.cli import main
    from tests.support.runs import run_folder as _run_folder
    from tests.support.runs import timed_rows as _timed_rows

    a = _run_folder(tmp_path / "a", [r | {"timer": "cuda-graph"} for r in _timed_rows("naive", 1.0, 0.01)])
    b = _run_folder(tmp_path / "b", [r | {"timer": "cuda-events+l2-flush"} for r in _timed_rows("naive", 2.0, 0.01)])
    assert main(["compare", str(a), str(b), "--fail-on-regression", "5"]) == 4  # unjudged, not a pass
    out = capsys.readouterr()
    assert "3 timed with another timer" in out.err
    assert "Other timer 3" in out.out and "timed with different timers (cuda-graph in A, cuda-events+l2-flush" \
        in out.err


# -- the install: xformers is an extra ---------------------------------------------------------------------


def test_xformers_is_an_extra_so_installing_never_replaces_torch():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.split(">")[0].split("=")[0].strip() == "xformers" for d in meta["dependencies"])
    assert any(d.startswith("xformers") for d in meta["optional-dependencies"]["xformers"])
    ci = (ROOT / ".ci" / "run").read_text()
    assert "xformers" in ci and "download.pytorch.org/whl/cpu" in ci
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in readme
    assert "pip install -e '.[xformers]'" in readme


def test_energy_math_has_no_nan_for_zero_flush():
    cell = nvml.Cell()
    s = nvml.Sample(1980, 600.0, 60, 0, 100.0)
    cell.turn(s, nvml.Sample(1980, 600.0, 60, 0, 120.0), calls=4, seconds=1.5)
    assert math.isclose(cell.columns(None, tokens=2)["energy_j_per_call"], 0.005)


def test_energy_per_call_needs_a_window_of_a_second_and_says_why_it_is_left_out():
    """The quick check's turns last about 17 ms (50 ms over 3 rounds), and NVML's energy counter
    advances in steps of about 10 ms: no figure from a window under a second, and the row says why."""
    short = nvml.Cell()
    for _ in range(3):
        short.turn(nvml.Sample(1980, 600.0, 60, 0, 100.0), nvml.Sample(1980, 600.0, 60, 0, 110.0), calls=4,
                   seconds=0.017)
    cols = short.columns(None, tokens=2)
    assert "energy_j_per_call" not in cols and "0.051 s, under the 1 s" in cols["energy_why"]
    unknown = nvml.Cell()
    unknown.turn(nvml.Sample(1980, 600.0, 60, 0, 100.0), nvml.Sample(1980, 600.0, 60, 0, 110.0), calls=4)
    assert "energy_j_per_call" not in unknown.columns(None, tokens=2)  # a window not measured is no window
    long = nvml.Cell()
    for _ in range(3):
        long.turn(nvml.Sample(1980, 600.0, 60, 0, 100.0), nvml.Sample(1980, 600.0, 60, 0, 110.0), calls=4,
                  seconds=0.4)
    assert math.isclose(long.columns(None, tokens=2)["energy_j_per_call"], 30 / 12 / 1e3)


def test_deterministic_cells_run_with_cublas_fixed_workspace(monkeypatch):
    """--deterministic on CUDA needs CUBLAS_WORKSPACE_CONFIG before cuBLAS starts, or every matmul under
    deterministic algorithms raises: the cell sets it (keeping a value the user gave) before it runs."""
    import os

    from bench.engine.cell import deterministic_env, run_group

    assert deterministic_env(True) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"} and deterministic_env(False) == {}
    from bench.api import discover

    naive = discover(entry_points=False)["naive"]
    case = Case(batch=1, heads=1, kv_heads=1, q_len=8, kv_len=8, head_dim=8)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    rows = []
    try:
        run_group([naive], case, MeasureSettings(budget_ms=2.0, rounds=1, deterministic=True), rows.append)
        assert rows[0]["status"] == "ok" and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        run_group([naive], case, MeasureSettings(budget_ms=2.0, rounds=1, deterministic=True), rows.append)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's own
    finally:
        import torch

        torch.use_deterministic_algorithms(False)


def test_a_cpu_worker_on_a_gpu_host_asks_cuda_nothing(monkeypatch):
    """A CPU worker names the CPU it measures on and never calls into CUDA (no context, no GPU name
    in env.json's worker_devices); a CUDA worker names the GPU; the after-job check of a worker that
    never initialised CUDA asks it nothing."""
    from bench.engine import cell, runner
    from bench.measure.envinfo import cpu_name

    asked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: asked.append("is_available") or True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: asked.append("name") or "Fake H100")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert runner._device_name("cpu") == cpu_name() and asked == []
    assert cell.cuda_broken() is False and asked == []
    assert runner._device_name("cuda") == "Fake H100" and asked == ["is_available", "name"]


def test_a_parked_worker_is_reused_only_for_the_same_device_and_determinism():
    """cuBLAS reads CUBLAS_WORKSPACE_CONFIG at a process's first GEMM: a worker kept from a sweep
    without --deterministic is not handed to one with it, nor a CPU worker to a CUDA sweep."""
    from bench.engine import runner

    class Parked:
        alive = True

        def __init__(self, settings):
            self.settings = settings

    base = runner.WorkerSettings(measure=MeasureSettings(threads=1), device="cpu")
    kept = Parked(base)
    runner._PARKED.append(kept)
    try:
        for other in (runner.WorkerSettings(measure=MeasureSettings(threads=1, deterministic=True), device="cpu"),
                      runner.WorkerSettings(measure=MeasureSettings(threads=1), device="cuda"),
                      runner.WorkerSettings(measure=MeasureSettings(threads=1, heap="system"), device="cpu")):
            assert runner._place(other) != runner._place(base)
        assert runner.reuse(runner.WorkerSettings(measure=MeasureSettings(threads=1), device="cpu")) is kept
    finally:
        if kept in runner._PARKED:
            runner._PARKED.remove(kept)


def test_a_layer_s_attention_kernel_is_found_past_its_gemms(registry):
    """A decoder launches at least 11 GEMMs, each longer than its attention kernel: the backend is
    read from every kernel that ran, the row keeps the longest few."""
    from bench.features.gpu_state.kernels import TOP, gpu_check_columns

    gemms = [f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_{i}" for i in range(11)]
    case = Case(batch=1, heads=2, kv_heads=2, q_len=32, kv_len=32, head_dim=8, direction="fwd")
    bound, result = _timed(registry, case)
    bound.prepared.info["backend"] = "flash"
    cols = gpu_check_columns(bound, 5.0, MeasureSettings(), names_of=lambda call, dev: ([*gemms, "flash_fwd_kernel"],
                                                                                       1.0))
    assert cols["backend_ran"] == "flash" and cols["kernel_mismatch"] is None
    assert cols["kernels"] == gemms[:TOP]
    cols = gpu_check_columns(bound, 5.0, MeasureSettings(), names_of=lambda call, dev: (gemms, 1.0))
    assert cols["backend_ran"] == "math" and cols["kernel_mismatch"]  # no attention kernel at all: math's


@pytest.mark.skipif(torch.cuda.is_available(), reason="plans a GPU sweep on a machine without one")
def test_a_gpu_sweep_is_planned_on_a_machine_without_a_gpu(tmp_path, monkeypatch, capsys):
    """``sweep --device cuda --dry-run`` prices the sweep where it cannot run, and says whose rates
    it prices with: none recorded here, the cost model's defaults."""
    from bench.cli import main
    from bench.runs import store

    monkeypatch.setattr(store, "DEFAULT_ROOT", tmp_path / "runs")
    assert main(["sweep", "--device", "cuda", "--variants", "naive,sdpa", "--seq-lens", "1024,2048",
                 "--masks", "none,causal", "--heads", "8", "--head-dims", "64", "--batch", "1", "--dtypes", "bf16",
                 "--directions", "fwd", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert count(out, "cells in") == 8 and "projected wall time" in out
    assert "planned for cuda" in out and "defaults for cuda" in out
    assert main(["sweep", "--device", "cuda", "--variants", "naive", "--seq-lens", "64"]) == 2  # running it: refused
    assert "CUDA is not available" in capsys.readouterr().err
