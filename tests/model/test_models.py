"""Published model shapes (issue 28, part 5): --model sets a sweep's heads, KV heads, head dims,
masks (alternating layers as two) and dtype; flags override it; --total-tokens keeps the tokens of
work per cell fixed; the report names the model."""

from __future__ import annotations

import json

import pytest

from bench.api import discover
from bench.cli import main
from bench.model.models import MODELS
from bench.model.specbuild import build_spec, parse_values
from tests.conftest import read_jsonl, run_cli


def _spec(**given):
    return build_spec(parse_values({"device": "cpu"} | given), discover(entry_points=False))


def test_list_models_names_each_with_its_source(capsys):
    assert main(["list", "--models"]) == 0
    out = capsys.readouterr().out
    for name in ("llama3-8b", "llama3-70b", "mistral-7b", "gemma2-9b", "qwen2.5-7b", "gpt-oss-20b", "deepseek-v3"):
        assert name in out
    assert "huggingface.co/google/gemma-2-9b" in out and "576/512" in out
    assert main(["list", "--models", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["model"] for r in rows} == set(MODELS) and all(r["source"] for r in rows)


@pytest.mark.parametrize("name, heads, kv_heads, dims, masks", [
    ("llama3-8b", 32, 8, 128, ["causal"]),
    ("qwen2.5-7b", 28, 4, 128, ["causal"]),
    ("mistral-7b", 32, 8, 128, ["window:4096"]),
    ("gemma2-9b", 16, 8, 256, ["window:4096+softcap:50", "causal+softcap:50"]),
    ("gpt-oss-20b", 64, 8, 64, ["window:128+learned_sink", "causal+learned_sink"]),
    ("deepseek-v3", 128, 128, "192/128", ["causal"]),
])
def test_a_model_sets_its_shapes_over_the_preset(name, heads, kv_heads, dims, masks):
    spec = _spec(model=name, preset="quick")
    assert (spec.heads, spec.kv_heads, spec.head_dims, spec.masks, spec.dtypes) == \
        ([heads], [kv_heads], [dims], masks, ["bfloat16"])
    assert spec.seq_lens == _spec(preset="quick").seq_lens  # the lengths stay the preset's
    from bench.model import masks as m

    # alternating layers: two masks of one sweep, each at every length and direction
    assert {c.mask for c in spec.cases()} == {m.canonical(x)[0] for x in masks}


def test_flags_override_the_model_and_decode_takes_its_absorbed_form():
    spec = _spec(model="gemma2-9b", preset="quick", masks="causal+softcap:50", heads="8", kv_heads="8")
    assert spec.masks == ["causal+softcap:50"] and spec.heads == [8] and spec.head_dims == [256]
    decode = _spec(model="deepseek-v3", preset="decode")
    assert (decode.heads, decode.kv_heads, decode.head_dims) == ([128], [1], ["576/512"])
    case = decode.cases()[0]
    assert (case.head_dim, case.dv, case.offset) == (576, 512, case.kv_len - case.q_len)


def test_total_tokens_keeps_the_work_per_cell(capsys):
    spec = _spec(seq_lens="256,512,1024", total_tokens="4096", variants="naive")
    assert {c.q_len: c.batch for c in spec.cases()} == {256: 16, 512: 8, 1024: 4}
    for args, says in ((["--total-tokens", "4096", "--batch", "2"], "give it or --batch, not both"),
                       (["--total-tokens", "100", "--seq-lens", "256"], "--total-tokens 100 is below the longest "
                                                                        "length 256"),
                       (["--model", "llama4"], "unknown model 'llama4'; valid: llama3-8b")):
        assert main(["sweep", "--variants", "naive", "--device", "cpu", "--dry-run", *args]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err


@pytest.mark.slow
def test_a_model_sweep_runs_and_its_report_names_the_model(tmp_path):
    """gpt-oss's two layers (a window and global attention, each with a learned sink) at a small
    size: naive computes both, flex and SDPA say why they do not, the report says the model."""
    out = tmp_path / "run"
    proc = run_cli("sweep", "--model", "gpt-oss-20b", "--variants", "naive,sdpa", "--seq-lens", "32",
                   "--heads", "4", "--kv-heads", "2", "--head-dims", "16", "--directions", "fwd", "--budget-ms", "5",
                   "--out", out)
    assert proc.returncode == 0, proc.stderr
    (said,) = [line for line in proc.stderr.splitlines() if line.startswith("model gpt-oss-20b:")]
    given = dict(part.split(" (the model's: ") for part in said.split(": ", 1)[1].split("); ")[:3])
    assert given == {"query heads 4": "64", "KV heads 2": "8", "head dims 16": "64"}  # each given beside the model's
    assert "masks window:128+learned_sink,causal+learned_sink" in said and "dtype bfloat16" in said
    rows = read_jsonl(out / "results.jsonl")
    assert {(r["variant"], r["mask"], r["status"]) for r in rows} == {
        ("naive", "window:128+learned_sink:0", "ok"), ("naive", "causal+learned_sink:0", "ok"),
        ("sdpa", "window:128+learned_sink:0", "unsupported"), ("sdpa", "causal+learned_sink:0", "unsupported")}
    assert all(r["dtype"] == "bfloat16" for r in rows)
    assert json.loads((out / "env.json").read_text())["spec"]["model"] == "gpt-oss-20b"
    html = (out / "report" / "index.html").read_text()
    assert "<title>attnbench report: run (gpt-oss-20b)</title>" in html
