"""Published anchors (bench.model.anchors, reports.sections.anchors): each figure's implied time
against the times its source quotes beside it, the preset's cases, its refusal off the GPU, and
the report's table from rows as a GPU sweep records them."""

import csv

import pytest

from bench.cli import main
from bench.engine.discovery import discover
from bench.model.anchors import ANCHORS, BY_NAME, chips_in
from bench.model.specbuild import build_spec
from reports.build import build_report
from tests.support.runs import run_folder

# the times the sources print beside their TFLOPS (flash-attention#1310 on H20, #2280 on sm100): the
# implied time of each figure, counted as the source counts, must be these
QUOTED_MS = {"fa2-h20-d64-full-2k": 0.840, "cudnn-h20-d64-full-2k": 0.545, "fa3-h20-d64-full-2k": 0.572,
             "fa2-h20-d64-causal-2k": 0.484, "cudnn-h20-d64-causal-2k": 0.315, "fa3-h20-d64-causal-2k": 0.342,
             "fa2-h20-d128-full-2k": 0.821, "fa3-h20-d128-causal-2k": 0.319,
             "fa-cute-b200-d128-8k-fwd-full": 1.433, "fa-cute-b200-d128-8k-fwd-causal": 0.775,
             "fa-cute-b200-d128-8k-bwd-full": 4.043, "fa-cute-b200-d128-8k-bwd-causal": 2.274}


@pytest.mark.parametrize("name", sorted(QUOTED_MS))
def test_a_figures_implied_time_is_the_time_its_source_quotes(name):
    assert BY_NAME[name].published_ms() == pytest.approx(QUOTED_MS[name], rel=5e-3)


def test_the_mla_conventions_worked_by_hand():
    mem, comp = BY_NAME["flashmla-h800-memory"], BY_NAME["flashmla-h800-compute"]
    kv_bytes = 2 * 128 * 4096 * 1 * 576  # the latent cache, bf16
    q_out_bytes = 2 * 128 * 1 * 16 * (576 + 512)
    assert mem.published_ms() == pytest.approx((kv_bytes + q_out_bytes) / 3000e9 * 1e3)
    assert comp.published_ms() == pytest.approx(2 * 128 * 1 * 128 * 4096 * (576 + 512) / 660e12 * 1e3)


def test_every_anchor_has_a_source_hardware_and_a_case_that_runs_on_the_gpu():
    spec = build_spec({"device": "cuda", "preset": "anchors"}, discover([]), here=False)
    cases = spec.cases()
    assert {(c.batch, c.heads, c.q_len, c.kv_len, c.head_dim, c.mask, c.direction, c.dtype) for c in cases} == \
        {(a.batch, a.heads, a.q_len, a.kv, a.head_dim, a.mask, a.direction, a.dtype) for a in ANCHORS}
    assert all(c.device == "cuda" and c.scope == "core" and not c.unsupported_reason for c in cases)
    assert all(a.source.startswith("https://") and a.hardware and a.figure > 0 for a in ANCHORS)
    assert sorted(spec.seq_lens) == sorted({a.q_len for a in ANCHORS})  # the axes say what the anchors cover


@pytest.mark.parametrize("argv, says", [
    (["--preset", "anchors"], "--preset anchors is a cuda preset"),
    (["--anchors", "all"], "--anchors times the shapes of published GPU figures"),
    (["--anchors", "fa3-h100-d128-2k,nope"], "unknown anchor 'nope'; valid: fa3-h100-d128-512"),
])
def test_anchors_are_refused_on_the_cpu_in_one_line(capsys, argv, says):
    assert main(["sweep", *argv, "--device", "cpu", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and says in err and "\n" not in err and "Traceback" not in err


def test_anchors_and_the_shape_flags_they_replace_are_refused_together():
    with pytest.raises(Exception, match="give it or --seq-lens, not both"):
        build_spec({"device": "cuda", "anchors": ["all"], "seq_lens": [512]}, discover([]), here=False)


def _row(a, variant, median_ms, status="ok", device="cuda", **over):
    fields = a.case_fields() | {"device": device, "lengths": "fixed", "inputs": "normal", "mix": "none",
                                "scope": "core", "ffn": "none"}
    return fields | {"variant": variant, "status": status, "reason": "", "median_ms": median_ms,
                     "samples": 30, "power_limit_w": 700.0, "sm_clock_start_mhz": 1980.0,
                     "sm_clock_end_mhz": 1755.0} | over


def test_the_anchor_table_from_recorded_rows(tmp_path):
    a, h20 = BY_NAME["fa3-h100-d128-16k"], BY_NAME["cudnn-h20-d128-full-2k"]
    pub = a.published_ms()
    rows = [_row(a, "sdpa.flash", pub / 0.8), _row(a, "sdpa.cudnn", pub / 1.1),
            _row(a, "sdpa.efficient", pub, status="mismatch"),  # not ok: not held against the figure
            _row(a, "sdpa", pub, q_len=8192, kv_len=8192),  # another shape
            _row(a, "naive", pub, device="cpu")]  # not a GPU row
    h100 = run_folder(tmp_path / "h200", rows, env={"device": "cuda", "device_name": "NVIDIA H200",
                                                    "driver": "570.86.15"})
    other = run_folder(tmp_path / "h20", [_row(h20, "sdpa.cudnn", h20.published_ms() / 0.5)],
                       env={"device": "cuda", "device_name": "NVIDIA H20", "driver": "550.54"})
    build_report([h100, other], tmp_path / "report")
    with open(tmp_path / "report" / "anchors.csv") as f:
        table = list(csv.DictReader(f))
    # one row is held against every figure published at its shape: on H20, FlashAttention-2's, -3's and cuDNN's
    assert [(r["anchor"], r["variant"]) for r in table] == [
        ("fa3-h100-d128-16k", "sdpa.cudnn"), ("fa3-h100-d128-16k", "sdpa.flash"),  # fastest first
        ("fa2-h20-d128-full-2k", "sdpa.cudnn"), ("fa3-h20-d128-full-2k", "sdpa.cudnn"),
        ("cudnn-h20-d128-full-2k", "sdpa.cudnn")]
    cudnn, flash, fa2_h20, _, on_h20 = table
    assert float(fa2_h20["measured / published"]) == pytest.approx(0.5 * 129.1 / 83.7, abs=1e-3)
    assert float(cudnn["measured / published"]) == pytest.approx(1.1, abs=1e-3)
    assert float(flash["measured / published"]) == pytest.approx(0.8, abs=1e-3)
    assert float(flash["published ms"]) == pytest.approx(4 * 16 * 16384**2 * 128 / 620.73e12 * 1e3, rel=1e-4)
    assert flash["GPU"] == "differs: published on H100" and flash["measured on"] == "NVIDIA H200"
    assert (flash["driver"], flash["power limit W"], flash["SM clock MHz"]) == ("570.86.15", "700", "1755")
    assert on_h20["GPU"] == "same model" and float(on_h20["measured / published"]) == pytest.approx(0.5, abs=1e-3)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Against published figures" in md and "fa3-h100-d128-16k" in md


def test_a_cpu_run_has_no_anchor_section(tmp_path):
    a = BY_NAME["fa3-h100-d128-2k"]
    run = run_folder(tmp_path / "cpu", [_row(a, "naive", 1.0, device="cpu")])
    build_report([run], tmp_path / "report")
    assert not (tmp_path / "report" / "anchors.csv").exists()
    assert "Against published figures" not in (tmp_path / "report" / "report.md").read_text()


def test_gpu_model_words_are_whole_words():
    assert "H20" not in chips_in("NVIDIA H200") and "H100" in chips_in("NVIDIA H100 80GB HBM3")
