"""Attention inside its layer (--scope): the parts' FLOPs, the parts timed beside the whole, the
whole checked against a float64 layer, and the report's crossovers."""

import math

import pandas as pd
import pytest

from bench.case import Case
from bench.model.registry import Variant
from bench.scopes.layer import layer_flops, part_flops
from tests.conftest import run_cli


def _case(**kw):
    base = dict(batch=2, heads=4, kv_heads=2, head_dim=16, q_len=32, kv_len=32, mask="none")
    return Case(**(base | kw))


# -- FLOPs -------------------------------------------------------------------------------------------

def test_the_parts_flops_are_the_formulas_worked_by_hand():
    # encoder, d_model 64 (4 x 16), GQA: k and v 32 wide, FFN 256 (mlp: 2 maps), no mask, n 32, batch 2
    enc = _case(scope="encoder", ffn="mlp:256")
    got = part_flops(enc)
    assert got["qkv"] == 2 * 2 * 32 * 64 * (64 + 32 + 32)
    assert got["out"] == 2 * 2 * 32 * 64 * 64
    assert got["ffn"] == 2 * 2 * 32 * 64 * 256 * 2
    assert got["core"] == 2 * 2 * 4 * 32 * 32 * (16 + 16)  # every pair kept
    assert got["norms"] is None  # elementwise: not counted
    assert layer_flops(enc) == sum(v for v in got.values() if v)
    # decoder with SwiGLU (3 maps), an encoder output of 48 tokens: the cross K and V over 48, under padding
    dec = _case(scope="decoder", ffn="swiglu:100", kv_len=48, mask="causal")
    got = part_flops(dec)
    assert got["qkv"] == 2 * 2 * 64 * (32 * (64 + 32 + 32) + 32 * 64 + 48 * (32 + 32))
    assert got["out"] == 2 * 2 * 2 * 32 * 64 * 64
    assert got["ffn"] == 2 * 2 * 32 * 64 * 100 * 3
    assert got["core"] == 2 * 2 * 4 * (32 * 33 // 2) * 32  # causal over the decoder's own 32 tokens
    # padding keeps kv_len - ((b + 1) kv_len) // (2 batch) keys of batch element b: 48 - 12 = 36, 48 - 24 = 24
    assert got["core_cross"] == 2 * 4 * 32 * (36 + 24) * 32
    # a backward: linear maps 2x (the input's and the weight's gradients), the core 2.5x as a core cell's
    bwd = part_flops(enc.replace(direction="bwd"))
    assert bwd["qkv"] == 2 * part_flops(enc)["qkv"] and bwd["ffn"] == 2 * part_flops(enc)["ffn"]
    assert bwd["core"] == 2.5 * part_flops(enc)["core"]
    assert part_flops(enc.replace(direction="fwd+bwd"))["out"] == 3 * part_flops(enc)["out"]
    # the block: no norms, no FFN; a memory of 48 tokens gives K and V
    block = part_flops(_case(scope="block", kv_len=48))
    assert set(block) == {"qkv", "core", "out"}
    assert block["qkv"] == 2 * 2 * 64 * (32 * 64 + 48 * (32 + 32))


def test_a_scope_refuses_what_it_does_not_model_with_what_is_valid():
    assert "kv_len = q_len" in _case(scope="encoder", ffn="mlp:64", kv_len=64).unsupported_reason
    assert "scope core" in _case(scope="block", kv_layout="paged:16").unsupported_reason
    with pytest.raises(ValueError, match="valid: core, block, encoder, decoder"):
        _case(scope="layer")
    with pytest.raises(ValueError, match="mlp:D_FF or swiglu:D_FF"):
        _case(scope="encoder", ffn="gelu:64")


@pytest.mark.slow
def test_bad_scope_and_ffn_flags_exit_2_with_what_is_valid():
    for flags, words in ((["--scope", "layer"], "unknown scope 'layer'; valid: core, block, encoder, decoder"),
                         (["--scope", "encoder", "--ffn", "relu"], "--ffn relu: valid: mlp:D_FF or swiglu:D_FF")):
        proc = run_cli("sweep", "--variants", "naive", "--seq-lens", "16", *flags, "--dry-run")
        assert proc.returncode == 2, proc.stderr
        assert words in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


# -- the whole against float64, and a core wrong only in the layer ------------------------------------

def _ignores_padding(case):
    """Right for the masks a core cell of this test asks (none, causal), wrong under padding: it
    attends every key, as a kernel that drops the encoder's padding mask would."""
    import torch.nn.functional as F

    causal = case.mask == "causal"
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=case.is_gqa)


def _run(variant, case, **settings):
    from bench.engine.cell import run_group
    from bench.measure.settings import MeasureSettings

    rows = []
    run_group([variant], case, MeasureSettings(budget_ms=4.0, rounds=2, **settings), rows.append)
    return rows[0]


def test_a_core_that_drops_the_encoders_padding_is_a_mismatch_in_the_decoder_only():
    wrong = Variant("drops.padding", _ignores_padding, "ignores the padding mask", masks=("none", "causal", "padding"),
                    module="myplugin")
    core = _run(wrong, _case(mask="causal"))
    assert core["status"] == "ok", core["reason"]
    dec = _run(wrong, _case(mask="causal", kv_len=40, scope="decoder", ffn="mlp:128"))
    assert dec["status"] == "mismatch", dec["reason"]
    assert dec["reason"].startswith("the layer's output: relative error") and "float64 layer" in dec["reason"]
    # the same core, right about padding (the registry's naive), passes in the same layer
    from bench.api import discover

    naive = discover(entry_points=False)["naive"]
    assert _run(naive, _case(mask="causal", kv_len=40, scope="decoder", ffn="mlp:128"))["status"] == "ok"


@pytest.mark.parametrize("scope, ffn, direction", [("block", "none", "fwd"), ("encoder", "swiglu:96", "fwd+bwd"),
                                                   ("decoder", "mlp:128", "bwd")])
def test_each_part_is_timed_in_the_wholes_rounds_and_their_sum_is_held_against_it(scope, ffn, direction):
    from bench.api import discover
    from bench.scopes.layer import parts

    naive = discover(entry_points=False)["naive"]
    case = _case(mask="causal", scope=scope, ffn=ffn, direction=direction, kv_len=24 if scope != "encoder" else 32)
    row = _run(naive, case)
    assert row["status"] == "ok", row["reason"]
    layer = row["layer"]
    assert list(layer["parts"]) == list(parts(case))
    assert layer["whole_ms"] == row["median_ms"]
    assert layer["sum_ms"] == pytest.approx(sum(p["median_ms"] for p in layer["parts"].values()))
    assert layer["sum_ratio"] == pytest.approx(layer["sum_ms"] / layer["whole_ms"])
    assert layer["core_ms"] == pytest.approx(sum(p["median_ms"] for n, p in layer["parts"].items()
                                                 if n.startswith("core")))
    assert 0 < layer["core_share"] < 1
    for name, part in layer["parts"].items():
        assert part["median_ms"] > 0 and part["flops"] == part_flops(case)[name]
    assert row["flops"] == layer_flops(case)
    assert row["grad_rel_err"] is not None if direction != "fwd" else row["grad_rel_err"] is None
    assert row["rel_err"] < 1e-4 and row["peak_mem_bytes"]


def test_the_sum_check_flags_parts_that_do_not_add_up_to_the_whole():
    from bench.measure.timing import Timing
    from bench.scopes.layer_run import SUM_AGREES, layer_figures

    case = _case(scope="block")

    def timed(ms):
        return Timing([ms] * 8, 1, 0, "fake").summary()
    parts = {"qkv": timed(1.0), "core": timed(2.0), "out": timed(1.0)}
    agrees = layer_figures(case, timed(4.2), parts)
    assert agrees["sum_ms"] == 4.0 and agrees["sum_ratio"] == pytest.approx(4.0 / 4.2) and agrees["sum_agrees"]
    assert agrees["core_share"] == 0.5 and agrees["rest_ms"] == 2.0
    off = layer_figures(case, timed(4.0 / (1 - SUM_AGREES) + 0.5), parts)
    assert not off["sum_agrees"]


class _TickEvent:
    """A timing event on a fake clock that moves 1 ms at every record: a part's interval is 1 ms
    a call, whatever the machine."""
    clock = [0.0]

    def record(self):
        self.clock[0] += 1.0
        self.at = self.clock[0]

    def elapsed_time(self, end):
        return end.at - self.at


@pytest.mark.parametrize("scope, ffn, calls_each", [("block", "none", {"qkv": 1, "core": 1, "out": 1}),
                                                    ("decoder", "mlp:64", {"qkv": 2, "core": 1, "core_cross": 1,
                                                                           "out": 2, "norms": 3, "ffn": 1})])
def test_the_gpu_events_time_each_part_inside_the_whole_call(scope, ffn, calls_each):
    from bench.api import discover
    from bench.scopes.layer_run import bind_layer, in_call_figures

    case = _case(scope=scope, ffn=ffn, kv_len=24)
    bound = bind_layer(discover(entry_points=False)["naive"], case)
    samples = bound.in_call_parts(calls=3, event=_TickEvent, sync=lambda: None)
    assert {p: xs for p, xs in samples.items() if p != "whole"} == {p: [float(k)] * 3 for p, k in calls_each.items()}
    records = 2 * sum(calls_each.values())  # two events a part call, between the whole's own two
    assert samples["whole"] == [records + 1.0] * 3
    figures = in_call_figures(samples)
    assert figures["sum_ratio"] == pytest.approx(sum(calls_each.values()) / (records + 1))
    assert not figures["sum_agrees"]  # half the ticks fall between parts: the check says so
    assert figures["parts"]["core"]["median_ms"] == 1.0 and figures["calls"] == 3


# -- the report: crossovers and savings --------------------------------------------------------------

def _rows(variant, core_per_n2, rest_per_n, ns, approximate=False):
    """Layer rows whose core takes core_per_n2 x n^2 ms and the rest rest_per_n x n ms, with +-5%
    intervals, and the FLOPs of an analytic model crossing at 1024."""
    out = []
    for n in ns:
        core, rest = core_per_n2 * n * n, rest_per_n * n
        out.append({"variant": variant, "status": "ok", "scope": "encoder", "ffn": "mlp:2048", "device": "cpu",
                    "dtype": "float32", "direction": "fwd", "mask": "none", "window": "-", "heads": 8,
                    "kv_heads": 8, "head_dims": "64", "batch": 1, "kv": "self", "n": n, "approximate": approximate,
                    "layer": {"parts": {"core": {"median_ms": core, "ci_lo_ms": 0.95 * core, "ci_hi_ms": 1.05 * core,
                                                 "flops": float(n * n)},
                                        "ffn": {"median_ms": rest, "ci_lo_ms": 0.95 * rest, "ci_hi_ms": 1.05 * rest,
                                                "flops": 1024.0 * n}},
                              "whole_ms": core + rest, "sum_ratio": 1.0, "sum_agrees": True}})
    return out


def test_the_crossover_is_where_the_core_takes_as_long_as_the_rest():
    from reports.sections.layer import crossover_table, layer_frame, saved_table

    # naive: core = rest at n = 1e-3 / 1e-6 = 1000; fast: at 4000, beyond the lengths swept (extrapolated)
    df = pd.DataFrame(_rows("naive", 1e-6, 1e-3, [256, 512, 2048]) + _rows("fast", 0.25e-6, 1e-3, [256, 512, 2048]))
    table = crossover_table(layer_frame(df)).set_index("variant")
    assert table.loc["naive", "measured crossover n"] == "1,000"
    assert table.loc["fast", "measured crossover n"] == "4,000 (extrapolated)"
    assert table.loc["naive", "analytic crossover n"] == "1,024"
    lo, hi = (int(x.replace(",", "")) for x in table.loc["naive", "95% interval"].split(" .. "))
    # the cores 5% slow and the rest 5% fast cross at 1000 x 0.95 / 1.05; the other way round, 1000 x 1.05 / 0.95
    assert lo == round(1000 * 0.95 / 1.05) and hi == round(1000 * 1.05 / 0.95)
    assert table.loc["naive", "share at largest n"] == f"{100 * 2048 / 3048:.0f}%"
    saved = saved_table(layer_frame(df), "naive").set_index("n")
    assert (saved["fastest exact core"] == "fast").all()
    at = saved.loc[512]
    base_core, fast_core = 1e-6 * 512 ** 2, 0.25e-6 * 512 ** 2
    assert at["saved ms"] == round(base_core - fast_core, 4)
    assert at["saved % of layer"] == round(100 * (base_core - fast_core) / (base_core + 1e-3 * 512), 1)
    # an approximation is never the fastest exact core
    approx = pd.DataFrame(_rows("naive", 1e-6, 1e-3, [512]) + _rows("lossy", 1e-9, 1e-3, [512], approximate=True))
    assert saved_table(layer_frame(approx), "naive").iloc[0]["fastest exact core"] == "naive"


def test_on_a_gpu_the_share_and_crossover_come_from_the_parts_inside_whole_calls():
    """A CUDA forward's parts timed inside whole calls (the cache as the layer leaves it) give the
    share, the crossover and the parts' sum; the parts timed alone stay beside them."""
    from reports.sections.layer import crossover_table, layer_frame

    rows = _rows("naive", 1e-6, 1e-3, [256, 512, 2048])
    for r in rows:  # inside the calls the rest is twice as fast as alone (a warm cache): the crossover halves
        n = r["n"]
        core, rest = 1e-6 * n * n, 0.5e-3 * n
        r["device"] = "cuda"
        r["layer"]["in_call"] = {"parts": {"core": {"median_ms": core, "ci_lo_ms": core, "ci_hi_ms": core},
                                           "ffn": {"median_ms": rest, "ci_lo_ms": rest, "ci_hi_ms": rest}},
                                 "whole_ms": core + rest, "sum_ratio": 0.97, "sum_agrees": True}
    lf = layer_frame(pd.DataFrame(rows))
    assert set(lf["timed"]) == {"in whole calls"} and list(lf["sum_ratio"]) == [0.97] * 3
    table = crossover_table(lf).iloc[0]
    assert table["measured crossover n"] == "500" and table["analytic crossover n"] == "1,024"  # FLOPs: the parts'
    assert table["share at largest n"] == f"{100 * 2048 / (2048 + 500):.0f}%"
    assert table["share alone"] == f"{100 * 2048 / 3048:.0f}%" and table["parts timed"] == "in whole calls"


def test_a_ratio_that_never_rises_has_no_crossover():
    from reports.sections.layer import crossing

    assert crossing([256, 512, 1024], [0.5, 0.5, 0.5]) == (None, False)
    n, extrapolated = crossing([256, 512], [0.25, 0.5])
    assert extrapolated and math.isclose(n, 1024)


def test_an_approximation_in_a_layer_reports_its_error_and_steps_stay_the_cores():
    from bench.api import discover
    from bench.features.steps import run_steps

    registry = discover(entry_points=False)
    approx = next(v for v in registry if v.approximate and "cpu" in v.devices)
    row = _run(approx, _case(scope="encoder", ffn="mlp:128"))
    assert row["status"] == "ok", row["reason"]
    assert row["rel_err"] > 1e-3  # far beyond float32's layer tolerance: reported, not held to it
    with pytest.raises(ValueError, match="scope core, not encoder"):
        run_steps(registry["naive"], _case(scope="encoder", ffn="mlp:128"), 2)


def test_every_series_is_drawn_in_charts_of_at_most_twelve_panels(tmp_path):
    from reports.sections.layer import MAX_PANELS, layer_frame, share_charts

    rows = []
    for heads in range(1, MAX_PANELS + 2):  # one series more than a chart holds
        rows += [r | {"heads": heads, "kv_heads": heads} for r in _rows("naive", 1e-6, 1e-3, [256, 512])]
    charts = share_charts(layer_frame(pd.DataFrame(rows)), tmp_path / "layer_share")
    assert [p.name for p in charts] == ["layer_share.png", "layer_share-2.png"]
    assert all(p.stat().st_size > 0 for p in charts)


def test_under_the_graph_timer_each_part_is_built_on_its_capturing_stream(monkeypatch):
    """--timer graph with a layer backward: the whole and each part are built by the graph timer's
    make_call (run on the stream that captures it), never beforehand on the default stream."""
    from bench.api import discover
    from bench.engine import cell
    from bench.measure.bound import bind_variant
    from bench.measure.settings import MeasureSettings
    from bench.measure.timing import GraphTimer
    from bench.scopes.layer import parts

    naive = discover(entry_points=False)["naive"]
    case = _case(mask="causal", scope="encoder", ffn="mlp:128", direction="bwd")
    bound = bind_variant(naive, case)
    built = []
    real = type(bound).part_calls
    monkeypatch.setattr(type(bound), "part_calls", lambda self, *a, **kw: built.append(kw.get("only")) or
                        real(self, *a, **kw))

    class Item:
        call, checked, parts = None, None, {}
        result = type("R", (), {"bwd_forward": None})()

    item = Item()
    item.bound = bound
    cell._make_timers(item, case.replace(device="cuda"), MeasureSettings(timer="graph"), per_turn=False)
    assert isinstance(item.timer, GraphTimer) and list(item.parts) == list(parts(case))
    assert all(isinstance(t, GraphTimer) for t in item.parts.values()) and built == []  # nothing built yet
    with bound.scope():
        grads = item.parts["ffn"].make_call()()  # what its capture builds and runs, on its stream
    assert built == ["ffn"] and all(g is None or g.shape for g in grads)  # that part's graph alone


@pytest.mark.parametrize("scope, ffn", [("block", "none"), ("decoder", "mlp:64")])
def test_a_layer_backward_beside_other_variants_holds_no_built_graph_between_turns(monkeypatch, scope, ffn):
    """Each turn of a layer backward (the whole's and each part's) builds its graph and drops it after,
    so that at the start of the rounds, and between turns, no timer holds one (a later variant's oom)."""
    from bench.api import discover
    from bench.engine import cell
    from bench.engine.cell import run_group
    from bench.measure.settings import MeasureSettings

    reg = discover(entry_points=False)
    case = _case(mask="causal", scope=scope, ffn=ffn, direction="bwd", kv_len=24 if scope == "decoder" else 32)
    held, real = [], cell.interleave

    def spy(timers, rounds, budget_ms, enter=None, **kw):
        held.append(sum(getattr(t, "call", None) is not None for t in timers.values()))

        @__import__("contextlib").contextmanager
        def watching(key):
            with enter(key):
                yield
            held.append(sum(getattr(t, "call", None) is not None for t in timers.values()))
        return real(timers, rounds, budget_ms, enter=watching, **kw)

    monkeypatch.setattr(cell, "interleave", spy)
    rows = []
    run_group([reg["naive"], reg["sdpa"], reg["sdpa.math"]], case, MeasureSettings(budget_ms=2.0, rounds=2),
              rows.append)
    assert [r["status"] for r in rows] == ["ok"] * 3, [r["reason"] for r in rows]
    assert len(held) > 3 and set(held) == {0}
    assert all(r["bwd_forward"] == "per turn" for r in rows)


@pytest.mark.parametrize("mask", ["causal+alibi", "window"])
def test_the_float64_layer_core_in_query_blocks_is_the_whole_one_and_holds_one_block(monkeypatch, mask):
    """The layer check's float64 core, in checkpointed blocks of queries, gives the whole core's output
    and gradients (score mods and masks that depend on the query's position included), and its forward
    and backward hold about one block's scores at a time, not the n x n of them."""
    import torch

    from bench.measure.memory import peak_cpu
    from bench.scopes import layer_run as layer

    case = _case(mask=mask, window=8 if mask == "window" else None, heads=4, kv_heads=2, q_len=256, kv_len=256)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((2, 4, 256, 16), (2, 2, 256, 16),
                                                                           (2, 2, 256, 16)))
    up = torch.randn(2, 4, 256, 16, generator=g, dtype=torch.float64)

    def run(elements):
        monkeypatch.setattr(layer, "BLOCK_ELEMENTS", elements)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = layer.exact_core(case, [0, 1])(*leaves)
        return out.detach(), torch.autograd.grad(out, leaves, up)

    whole, blocked = run(1 << 30), run(2 * 4 * 256 * 16)  # one block, or 16 rows of 256 keys at a time
    assert torch.allclose(whole[0], blocked[0], rtol=0, atol=1e-12)
    assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(whole[1], blocked[1]))

    def step(elements):
        monkeypatch.setattr(layer, "BLOCK_ELEMENTS", elements)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        core = layer.exact_core(case, [0, 1])
        return lambda: torch.autograd.grad(core(*leaves), leaves, up)

    scores = 2 * 4 * 256 * 256 * 8  # the whole core's float64 scores, in bytes
    whole_peak, blocked_peak = peak_cpu(step(1 << 30)), peak_cpu(step(2 * 4 * 256 * 16))
    assert whole_peak > 2 * scores and blocked_peak < whole_peak / 4  # q, k, v, their gradients and one block


def _drops_causal(case):
    """Attends every key whatever the mask: right at the last query of a causal mask only."""
    import torch.nn.functional as F

    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=case.is_gqa)


@pytest.mark.parametrize("scope, ffn", [("block", "none"), ("encoder", "mlp:128"), ("decoder", "swiglu:96")])
def test_a_layer_too_large_for_a_whole_float64_check_is_checked_on_its_last_queries(monkeypatch, scope, ffn):
    """Above CHECK_ELEMENTS scores a batch element, the float64 layer computes its last queries alone
    (every key and value still made), forward and backward: a right core passes, one that drops the
    causal mask is caught, and the float64 cores are given only the checked rows."""
    import torch

    from bench.api import discover
    from bench.scopes import layer_run

    case = _case(mask="causal", q_len=64, kv_len=64 if scope != "decoder" else 48, scope=scope, ffn=ffn,
                 direction="fwd+bwd", batch=1)
    monkeypatch.setattr(layer_run, "CHECK_ELEMENTS", 4 * 64 * 16)  # 16 rows of 64 keys for each of 4 heads
    assert layer_run.check_rows(case) == slice(48, 64)
    seen = []
    exact = layer_run.exact_core

    def spy(c, batches, first_row=0):
        fn = exact(c, batches, first_row)
        return lambda q, k, v: (seen.append((first_row, q.shape[2], k.shape[2])), fn(q, k, v))[1]

    monkeypatch.setattr(layer_run, "exact_core", spy)
    naive = discover(entry_points=False)["naive"]
    bound = layer_run.bind_layer(naive, case)
    with bound.scope():
        right = bound.check()
    assert right.ok, right.reason
    assert seen and all(first == 48 and rows == 16 for first, rows, _ in seen)  # 16 queries, not 64
    assert seen[0][2] == 64  # against every key of the self-attention
    assert right.grad_rel_err is not None and right.grad_rel_err < 1e-4
    wrong = layer_run.bind_layer(Variant("drops.causal", _drops_causal, "attends every key", module="myplugin"), case)
    with wrong.scope():
        caught = wrong.check()
    assert not caught.ok and "the layer's output" in caught.reason
    assert torch.isfinite(torch.tensor(caught.rel_err))
