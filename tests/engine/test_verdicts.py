"""A row's status is a verdict: a correct kernel passes, a wrong one cannot, and a failure's
kind comes from where it was raised, not from the words of its message."""

import json
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from bench.case import Case
from bench.engine.cell import run_group
from bench.measure.correctness import check, reference, run_and_check
from bench.measure.inputs import make_grad_out, make_inputs
from bench.measure.settings import MeasureSettings
from bench.model.row import current_rows
from bench.registry import Variant
from bench.runs import store
from tests.support.text import numbers, value

# -- the check's power where values are small: long sequences, bf16, gradients, decode --------


@pytest.mark.slow
def test_all_zero_gradients_fail_at_bf16_n8192_where_every_gradient_is_below_atol():
    case = Case("cpu", "bfloat16", 1, 1, 1, 8192, 8192, 64, "none", None, "bwd")
    q, k, v = make_inputs(case)
    g = make_grad_out(case)
    ref = reference(case, q, k, v, g)
    assert float(ref.grads[0].abs().max()) < 0.16  # so zeros pass the elementwise bf16 check (atol 0.15)
    out = F.scaled_dot_product_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), g)
    assert check(case, out, ref.out, grads, ref.grads).ok  # the correct kernel passes
    zeros = check(case, out, ref.out, tuple(torch.zeros_like(x) for x in grads), ref.grads)
    assert not zeros.ok and zeros.grad_rel_err == pytest.approx(1.0)
    assert "relative error 1 > 0.03 (bfloat16)" in zeros.reason  # the criterion and its figures


def test_an_all_zero_output_fails_at_decode_lengths():
    case = Case("cpu", "bfloat16", 1, 8, 2, 1, 131072, 64, "none", None, "fwd")
    q, k, v = make_inputs(case)
    ref = reference(case, q, k, v)
    assert float(ref.out.abs().max()) < 0.03  # every value below the bf16 atol
    assert check(case, F.scaled_dot_product_attention(q, k, v, enable_gqa=True), ref.out).ok
    zeros = check(case, torch.zeros(case.batch, case.heads, 1, 64, dtype=torch.bfloat16), ref.out)
    assert not zeros.ok and zeros.reason == "output relative error 1 > 0.01 (bfloat16)"


def _zeros(q, k, v):
    return (q + 0 * k.sum() + 0 * v.sum()) * 0  # all-zero output and gradients, graph intact


def _transposed_causal(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).triu()  # key j >= query i: the causal mask transposed
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def _unscaled(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)  # 1/sqrt(d) dropped


def _correct(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("fn, ok", [(_correct, True), (_zeros, False), (_transposed_causal, False),
                                    (_unscaled, False)], ids=["correct", "zeros", "transposed", "unscaled"])
def test_a_wrong_kernel_cannot_pass_and_a_right_one_does(fn, ok, direction):
    case = Case("cpu", "bfloat16", 1, 2, 2, 1024, 1024, 64, "causal", None, direction)
    q, k, v = make_inputs(case)
    result = run_and_check(case, fn, q, k, v, make_grad_out(case) if case.needs_grad else None)
    assert result.ok is ok, result.reason
    if not ok:
        assert result.reason.startswith(("output", "d")) and any(
            w in result.reason for w in ("tolerance", "relative error", "cosine"))


def test_an_approximation_worse_than_zeros_is_a_mismatch(registry):
    performer = registry["performer"]  # FAVOR+ on unit-spread logits: its estimate's variance explodes
    case = Case("cpu", "float32", 2, 4, 4, 96, 96, 32, "none", None, "fwd")
    q, k, v = make_inputs(case)
    result = run_and_check(case, performer.prepare(case).fn, q, k, v, None, None, performer.error_budget,
                           approximate=True)
    assert result.rel_err > 1 and not result.ok
    assert "worse than returning zeros" in result.reason and value(result.reason, "relative error") > 1


# -- statuses by where the exception was raised ------------------------------------------------

def _plugin(tmp_path, body: str):
    """A plugin file's variants, loaded as the sweep loads them."""
    from bench.api import discover

    path = tmp_path / "myplugin.py"
    path.write_text(textwrap.dedent(body))
    return discover([str(path)], entry_points=False)


def _rows(variants, case, **settings):
    rows = []
    run_group(variants, case, MeasureSettings(budget_ms=5, rounds=1, **settings), rows.append)
    return {r["variant"]: r for r in rows}


SMALL = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "none", None, "fwd")


def test_a_plugins_own_not_supported_error_is_an_error_and_a_librarys_refusal_is_unsupported(tmp_path):
    reg = _plugin(tmp_path, '''
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from bench.registry import variant

        @variant("buggy", description="raises in its own code, with a library's words")
        def buggy(case):
            def attention(q, k, v):
                raise ValueError("mode 3 not supported")
            return attention

        @variant("declines", description="declines the case on purpose")
        def declines(case):
            raise NotImplementedError("this variant takes no float32")

        @variant("refused", description="a library that refuses: the efficient backend on the CPU")
        def refused(case):
            def attention(q, k, v):
                with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                    return F.scaled_dot_product_attention(q, k, v)
            return attention

        @variant("shouting", description="a library's refusal in capitals")
        def shouting(case):
            code = compile("raise RuntimeError('cuDNN error: CUDNN_STATUS_NOT_SUPPORTED')", "<cudnn>", "exec")
            def attention(q, k, v):
                exec(code)
            return attention
    ''')
    rows = _rows([reg["buggy"], reg["declines"], reg["refused"], reg["shouting"]], SMALL)
    assert rows["buggy"]["status"] == "error" and rows["buggy"]["reason_kind"] == "error"
    assert "raised in variant code" in rows["buggy"]["reason"] and "myplugin.py" in rows["buggy"]["reason"]
    assert rows["declines"]["status"] == "unsupported" and rows["declines"]["reason_kind"] == "capability"
    assert rows["refused"]["status"] == "unsupported" and rows["refused"]["reason_kind"] == "library"
    assert rows["shouting"]["status"] == "unsupported", rows["shouting"]["reason"]


def test_a_probe_does_not_take_the_variants_own_bug_for_a_refusal(tmp_path):
    reg = _plugin(tmp_path, '''
        import functools
        from bench.probe import run_probe
        from bench.registry import variant

        def factory(case):
            width = case.head_dim + "px"  # a TypeError of the variant's own
            return lambda q, k, v: q

        @variant("probed", description="probed", check=lambda case: run_probe(factory, case))
        def probed(case):
            return factory(case)
    ''')
    row = _rows([reg["probed"]], SMALL)["probed"]
    assert row["status"] == "error" and "TypeError" in row["reason"] and "variant code" in row["reason"]
    from bench.runs.judge import failures

    assert failures([row])  # so --strict fails the sweep


def test_a_failed_memory_pass_keeps_no_timing_figures(monkeypatch):
    from bench.measure import memory

    def no_memory(*a, **k):
        raise MemoryError("the memory pass ran out")

    monkeypatch.setattr(memory, "peak_bytes", no_memory)
    naive = Variant(name="plain", factory=lambda case: F.scaled_dot_product_attention, description="sdpa")
    row = _rows([naive], SMALL)["plain"]
    assert row["status"] == "oom" and row["reason"].startswith("memory pass (after a timing of median")
    assert row["median_ms"] is None and row["samples"] is None and row.get("cpu_util") is None
    assert "samples_ms" not in row and "contended" not in row and row["tflops"] is None
    assert row["rel_err"] is not None  # the check did finish: its figures stay


# -- the newest row decides, everywhere ------------------------------------------------------------

def _row(status, median=None, **extra):
    return {"variant": "naive", **SMALL.to_dict(), "status": status, "reason": "" if status == "ok" else status,
            "median_ms": median} | extra


def test_the_newest_row_of_a_cell_decides_what_is_done_and_what_is_retried():
    rows = [_row("oom"), _row("crash")]
    assert store.done_keys(rows, frozenset({"oom"}))  # its newest row is crash: not asked for
    assert not store.done_keys(rows, frozenset({"crash"}))  # measured again, however old its oom
    assert current_rows(rows) == [rows[1]]
    shaky = [_row("ok", 1.0, contended=True)]
    assert not store.done_keys(shaky, frozenset({"shaky"})) and store.done_keys(shaky, frozenset({"crash"}))


def test_the_summary_and_the_contention_warning_read_the_newest_rows():
    from bench.engine.sweep import contention_warning
    from reports.tables import summary_table

    rows = [_row("ok", 123.0, contended=True, contended_why="timed with 0.40 of its cores"), _row("ok", 7.0)]
    assert "7" in summary_table(rows) and "123" not in summary_table(rows)
    assert contention_warning(rows, None) == ""
    assert "1 of 1 ok cells" in contention_warning(rows[::-1], None)


# -- what a row and a run record ---------------------------------------------------------------------

def test_the_sweep_id_hashes_plugin_contents_not_their_paths(tmp_path):
    from bench.model.spec import Spec, sweep_id

    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    body = "from bench.registry import variant\n"
    (tmp_path / "a" / "p.py").write_text(body)
    (tmp_path / "b" / "p.py").write_text(body)
    (tmp_path / "c" / "p.py").write_text(body + "# changed\n")
    base = dict(variants=["naive"], seq_lens=[64], heads=[2], head_dims=[16], batch=[1], dtypes=["float32"],
                masks=["none"], window=[64], directions=["fwd"], budget_ms=5.0, timeout=30.0)
    ids = [sweep_id(Spec(**base, plugins=[str(tmp_path / d / "p.py")])) for d in ("a", "b", "c")]
    assert ids[0] == ids[1] != ids[2]


def test_a_plugin_masks_prepare_receives_the_real_case(tmp_path):
    from bench.model import masks

    (tmp_path / "seen.py").write_text(textwrap.dedent('''
        from bench.masks import mask

        SEEN = []

        def _prepare(case):
            SEEN.append(case)
            return {}

        @mask("seen_case", prepare=_prepare, description="records the case its prepare gets")
        def seen_case(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx
    '''))
    sys.path.insert(0, str(tmp_path))
    try:
        import seen
    finally:
        sys.path.remove(str(tmp_path))
    case = Case("cpu", "bfloat16", 2, 8, 2, 32, 48, 128, "seen_case", None, "bwd")
    masks.bind(case).keep()
    got = seen.SEEN[-1]
    assert (got.dtype, got.kv_heads, got.head_dim, got.batch, got.kv_len) == ("bfloat16", 2, 128, 2, 48)


def test_contention_counts_the_cpus_of_the_affinity(monkeypatch):
    from bench.features.contention import contention
    from bench.measure import cpuload

    monkeypatch.setattr(cpuload.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert cpuload.usable_cpus() == [0]
    # one usable CPU, one thread: another process's full core is contention, whatever the machine's count
    busy = contention.verdict(cpu_util=0.95, other_cpu=1.0, threads=1)
    assert busy["contended"] and "free: 0" in busy["contended_why"]
    one, all_ = cpuload._machine_ticks([0]), cpuload._machine_ticks(list(range(torch.get_num_threads())))
    if one is not None and all_ is not None and torch.get_num_threads() > 1:
        assert one[1] < all_[1]  # the ticks of the affinity's CPUs, not the machine's


def test_the_max_error_column_is_named_for_what_it_is_and_old_rows_still_read(tmp_path):
    case = SMALL
    q, k, v = make_inputs(case)
    r = run_and_check(case, F.scaled_dot_product_attention, q, k, v)
    ref = reference(case, q, k, v).out
    assert r.columns()["max_err_over_max_ref"] == pytest.approx(r.max_abs_err / float(ref.abs().max()))
    (tmp_path / "results.jsonl").write_text(json.dumps(_row("ok", 1.0, max_rel_err=0.5)) + "\n")
    assert store.read_rows(tmp_path)[0]["max_err_over_max_ref"] == 0.5


# -- the reference at decode lengths: bounded by K/V bytes, no per-head copy of K and V -----------

def test_a_decode_reference_over_a_long_cache_checks_a_slice():
    from bench.measure.correctness import check_slice

    decode = Case("cuda", "bfloat16", 8, 32, 8, 1, 131072, 128, "none", None, "fwd")  # few scores, 17 GB of K, V
    batches, heads, kv_heads = check_slice(decode)
    assert batches == [0, 7] and heads == slice(0, 4) and kv_heads == slice(0, 1)
    small = Case("cpu", "float32", 2, 4, 2, 64, 64, 16, "none", None, "fwd")
    assert check_slice(small)[0] == [0, 1]  # all of a small case


@pytest.mark.slow
def test_the_gqa_reference_equals_attention_with_each_kv_head_repeated_and_does_not_copy_them():
    from bench.measure.memory import peak_bytes

    case = Case("cpu", "float32", 1, 16, 2, 3, 32768, 64, "causal", None, "fwd+bwd")
    q, k, v = make_inputs(case)
    g = make_grad_out(case)
    ref = reference(case, q, k, v, g)
    mha = case.replace(kv_heads=16)  # the same attention, K and V repeated per query head
    kk, vv = (t.detach().repeat_interleave(8, dim=1).requires_grad_() for t in (k, v))
    want = reference(mha, q, kk, vv, g)
    assert torch.allclose(ref.out, want.out, atol=1e-12)
    assert torch.allclose(ref.grads[0], want.grads[0], atol=1e-12)
    assert torch.allclose(ref.grads[1], want.grads[1].view(1, 2, 8, 32768, 64).sum(2), atol=1e-10)
    kv64 = 2 * k.numel() * 8  # K and V in float64
    fwd = case.replace(direction="fwd")
    peak = peak_bytes("cpu", lambda: reference(fwd, q.detach(), k.detach(), v.detach()))
    assert peak < 3 * kv64  # repeating them per head would take 8x


def test_backward_variants_of_a_case_keep_one_forward_graph_alive_at_a_time():
    import weakref

    alive, most = [0], [0]

    def make(name):
        def factory(case):
            def attention(q, k, v):
                out = F.scaled_dot_product_attention(q, k, v)
                alive[0] += 1
                most[0] = max(most[0], alive[0])
                weakref.finalize(out, lambda: alive.__setitem__(0, alive[0] - 1))
                return out
            return attention
        return Variant(name=name, factory=factory, description=name)

    case = SMALL.replace(direction="bwd")
    rows = []
    run_group([make("A"), make("B"), make("C")], case, MeasureSettings(budget_ms=5, rounds=3), rows.append)
    rows = {r["variant"]: r for r in rows}
    assert [rows[n]["status"] for n in "ABC"] == ["ok"] * 3
    assert all(rows[n]["bwd_forward"] == "per turn" and rows[n]["rounds"] == 3 for n in "ABC")
    assert most[0] == 1  # built at its turn, dropped after it: never three graphs at once


# -- the kernels that ran (bench.features.gpu_state.kernels), from names recorded on GPUs ------------------------

@pytest.mark.parametrize("names, backend", [
    (["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)"],
     "flash"),
    (["fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)"],
     "efficient"),
    (["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"], "cudnn"),
    (["triton_tem_fused_0", "triton_poi_fused_1"], "flex"),
    (["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "void at::native::cunn_SoftMaxForward<4>"],
     "math"),
    ([], ""),
])
def test_the_backend_a_cells_kernels_belong_to(names, backend):
    from bench.features.gpu_state.kernels import backend_of

    assert backend_of(names) == backend


def test_a_pinned_sdpa_variant_declares_its_backend_and_a_mismatch_is_named(registry):
    from bench.features.gpu_state.kernels import mismatch

    case = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "none", None, "fwd")
    assert registry["sdpa.flash"].prepare(case).info["backend"] == "flash"
    assert registry["sdpa.cudnn"].prepare(case).info["backend"] == "cudnn"
    said = mismatch("flash", "math")
    assert "backend flash" in said and "math's" in said
    assert mismatch("flash", "flash") == "" and mismatch(None, "math") == ""


def test_the_timers_are_held_against_each_other_and_a_disagreement_is_named():
    from bench.measure.timing import timer_disagreement

    assert timer_disagreement(0.050, 0.048, 0.047) == ""  # within 10%: nothing to say
    launch_bound = timer_disagreement(0.050, 0.021, 0.020)  # a decode cell that launches more than it computes
    assert numbers(launch_bound)[:3] == [0.021, 0.42, 0.05]  # the graph's time, its ratio, the events'
    assert "profiler kernel sum 0.02 ms is 0.40x" in launch_bound
    assert timer_disagreement(0.050, None, None) == "" and timer_disagreement(None, 0.02, None) == ""


def test_graph_timing_is_refused_on_the_cpu(capsys):
    from bench.cli import main

    assert main(["sweep", "--timer", "graph", "--device", "cpu", "--out", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert "--timer graph" in err and "needs --device cuda" in err


# -- the reference as a step of its own ---------------------------------------------------------------

def test_a_reference_that_cannot_be_computed_leaves_the_cells_timed_unchecked(monkeypatch):
    import bench.engine.cell as cell

    def no_memory(*a, **k):
        raise MemoryError("the float64 scores do not fit")

    monkeypatch.setattr(cell, "reference", no_memory)
    plain = Variant(name="plain", factory=lambda case: F.scaled_dot_product_attention, description="sdpa")
    wrong = Variant(name="wrong", factory=lambda case: (lambda q, k, v: q[..., :4]), description="bad shape")
    steps = []
    rows = []
    run_group([plain, wrong], SMALL, MeasureSettings(budget_ms=5, rounds=1), rows.append, at=steps.append)
    rows = {r["variant"]: r for r in rows}
    assert steps[0] == cell.REFERENCE  # its own step, before any variant's: its own deadline in a sweep
    assert rows["plain"]["status"] == "ok" and rows["plain"]["median_ms"] > 0 and rows["plain"]["rel_err"] is None
    assert "raised MemoryError" in rows["plain"]["reference_skipped"]
    assert rows["wrong"]["status"] == "mismatch" and "output shape" in rows["wrong"]["reason"]  # the form still


@pytest.mark.slow
def test_a_reference_past_its_deadline_is_skipped_and_no_variant_is_blamed(tmp_path):
    from tests.conftest import read_jsonl, run_cli, write_plugin

    # the reference made slow on purpose, in the worker (a plugin file is imported there): it overruns its
    # deadline on any machine, while the variant's own steps on this tiny case take milliseconds
    plugin = write_plugin(tmp_path, "slowref", """
        import time

        import bench.engine.cell as cell

        real = cell.reference

        def slow(case, *args, **kwargs):
            if case.head_dim == 24:  # this test's case only
                time.sleep(120)
            return real(case, *args, **kwargs)

        cell.reference = slow
    """)
    proc = run_cli("sweep", "--plugin", plugin, "--variants", "window.chunked", "--masks", "window:8", "--seq-lens",
                   "64", "--heads", "2", "--head-dims", "24", "--directions", "fwd", "--budget-ms", "20", "--timeout",
                   "3", "--out", tmp_path / "run", "--no-report", "--quiet")
    assert proc.returncode == 0, proc.stderr
    (row,) = read_jsonl(tmp_path / "run" / "results.jsonl")
    assert row["status"] == "ok" and row["median_ms"] > 0
    assert "reference timeout" in row["reference_skipped"] and "cell timeout" in row["reference_skipped"]


@pytest.mark.parametrize("inputs", ["normal", "clustered", "lowrank", "outliers"])
def test_the_exact_baseline_is_ok_on_every_input_kind_and_zeros_still_fail(registry, inputs):
    """The elementwise atol grows with the logits' size (outlier channels reach logits near 1000, where a
    correct float32 kernel is off by 1.4e-4, beyond the 1e-4 that holds for normal inputs); the relative
    error does not, so an all-zero answer fails on every input kind, and so does a dropped 1/sqrt(d)."""
    from bench.measure.bound import bind_variant
    from bench.measure.correctness import LOGIT_REF, TOLERANCES, reference, run_and_check

    case = Case("cpu", "float32", 1, 4, 4, 1024, 1024, 64, "causal", None, "fwd", inputs=inputs)
    bound = bind_variant(registry["naive"], case)
    ref = reference(case, *bound.inputs)
    result = run_and_check(case, bound.fn, *bound.inputs, ref=ref)
    assert result.ok, result.reason
    if inputs == "outliers":
        assert result.max_logit > 50 * LOGIT_REF and result.max_abs_err > TOLERANCES["float32"][0][0]
    else:
        assert result.max_logit < 2 * LOGIT_REF
    zeros = run_and_check(case, lambda q, k, v: torch.zeros_like(q), *bound.inputs, ref=ref)
    assert not zeros.ok and zeros.rel_err == 1.0  # whichever criterion says it first

    def unscaled(q, k, v):
        keep = torch.ones(1024, 1024, dtype=torch.bool).tril()
        return torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")), -1) @ v

    assert not run_and_check(case, unscaled, *bound.inputs, ref=ref).ok


# -- determinism -----------------------------------------------------------------------------------------


def _cell(variant, case, **settings):
    from bench.measure.settings import MeasureSettings

    rows = []
    run_group([variant], case, MeasureSettings(budget_ms=5.0, rounds=1, **settings), rows.append)
    return rows[0]


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_a_variant_that_differs_run_to_run_is_flagged_and_an_exact_one_is_not(registry, direction):
    """Each ok cell's later calls on the same inputs (on the CPU, the timer's own) against its checked
    call: bitwise the same, or the largest difference; a backward's gradients, a forward's output."""
    from bench.model.registry import Variant

    def jittery(case):  # exact to 1e-7, but never twice the same bits (as atomics in a backward are not)
        return lambda q, k, v: F.scaled_dot_product_attention(q * (1 + 1e-7 * torch.randn_like(q)), k, v)

    case = Case("cpu", "float32", 1, 2, 2, 32, 32, 16, "none", None, direction)
    row = _cell(Variant("jittery", jittery, "adds noise"), case)
    assert row["status"] == "ok" and row["deterministic"] is False and 0 < row["nondeterminism"] < 1e-5
    row = _cell(registry["naive"], case)
    assert row["status"] == "ok" and row["deterministic"] is True and row["nondeterminism"] is None


def test_deterministic_mode_is_set_in_the_cell_and_a_refusal_is_unsupported():
    from bench.measure.origin import classify
    from bench.model.registry import Prepared, Variant

    def reports(case):
        return Prepared(F.scaled_dot_product_attention,
                        {"deterministic_mode": torch.are_deterministic_algorithms_enabled()})

    case = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "none", None, "fwd")
    try:
        assert _cell(Variant("reports", reports, "x"), case, deterministic=True)["extra"]["deterministic_mode"] is True
        assert _cell(Variant("reports", reports, "x"), case)["extra"]["deterministic_mode"] is False
    finally:
        torch.use_deterministic_algorithms(False)
    refusal = RuntimeError("index_add_cuda_ does not have a deterministic implementation, but you set "
                           "'torch.use_deterministic_algorithms(True)'")  # as PyTorch raises it, from its library
    assert classify(refusal)[:2] == ("unsupported", "library")
