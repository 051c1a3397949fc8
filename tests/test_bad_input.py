"""Bad input on the newer surfaces: plugin masks, score-mod parameters, env.json, TOML, the
worker count.  Each is refused before anything runs: exit 2, one line that says what is
wrong and what is valid, nothing written."""

import json

import pytest

from bench.cli import main
from tests.conftest import run_cli, write_plugin

SMALL = ["--variants", "naive", "--seq-lens", "16", "--heads", "2", "--head-dims", "8", "--budget-ms", "5",
         "--device", "cpu", "--no-report", "--quiet"]


def _refused(capsys, argv, words, out=None):
    assert main(list(map(str, argv))) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if out is not None:
        assert not out.exists()  # nothing written


@pytest.mark.parametrize("masks, words", [
    ("causal+softcap:0", "softcap:0': cap=0 is out of range: softcap takes cap > 0"),
    ("causal+softcap:-5", "cap=-5 is out of range: softcap takes cap > 0"),
    ("causal,,none", "--masks causal,,none: an empty value between commas"),
    ("causal++softcap:5", "an empty term between '+' signs"),
    ("window:0", "window=0 is out of range: window takes window 1 to 16777216"),
    ("document:0", "docs=0 is out of range"),
    ("document:4:causal=2", "causal=2 is out of range: document takes docs 1 to 16777216, causal 0 to 1"),
    ("document:lengths=8/0", "lengths=8/0 is out of range"),
    ("chunked_causal:0", "chunk 1 to 16777216"),
    ("dilated:0", "dilation 1 to 16777216"),
    ("sink:-1", "sinks 0 to 16777216"),
    ("bigbird:0", "block 1 to 16777216"),
    ("bigbird:8:random=-1", "random 0 to 4096"),
    ("causal+rel_bias:-1", "max_distance 0 to 65536"),
    ("prefix_lm:-3", "prefix 0 to 16777216"),
])
def test_mask_and_score_mod_parameters_out_of_range_are_refused(capsys, tmp_path, masks, words):
    _refused(capsys, ["sweep", "--masks", masks, "--out", tmp_path / "run", *SMALL], words, tmp_path / "run")


def test_every_built_in_parameter_has_a_documented_range():
    from bench.model import masks

    for d in masks.catalogue().values():
        if d.module == "bench.model.mask_catalog":
            assert set(d.ranges) == set(d.params), d.name
            for k, r in d.ranges.items():
                assert r.holds(d.params[k]), (d.name, k)  # the default is valid
    proc = run_cli("list", "--masks")
    assert proc.returncode == 0 and "cap > 0" in proc.stdout and "valid values" in proc.stdout


def test_a_toml_key_set_at_the_top_level_and_under_sweep_is_refused(capsys, tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text("seq_lens = [64]\n\n[sweep]\nseq_lens = [128]\n")
    _refused(capsys, ["sweep", "--config", config, "--out", tmp_path / "run", "--no-report"],
             "'seq_lens' is set twice (the top level and [sweep]); keep one of them", tmp_path / "run")
    both = tmp_path / "both.toml"  # keys in both places, none twice: both are read
    both.write_text("heads = [2]\n\n[sweep]\nseq_lens = [16]\n")
    from bench.model.specbuild import load_config

    assert load_config(str(both)) == {"heads": [2], "seq_lens": [16]}


def test_resume_with_an_env_json_of_garbage_bytes_is_refused_and_the_rows_stay(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = json.dumps({"variant": "naive", "status": "ok", "device": "cpu", "dtype": "float32", "batch": 1,
                       "heads": 2, "kv_heads": 2, "q_len": 16, "kv_len": 16, "head_dim": 8, "mask": "none",
                       "window": None, "direction": "fwd"}) + "\n"
    (run / "results.jsonl").write_text(rows)
    (run / "env.json").write_bytes(b"\xff\xfe\x00garbage\x9c")
    _refused(capsys, ["sweep", "--resume", run], "env.json is not valid JSON/UTF-8")
    assert (run / "results.jsonl").read_text() == rows


def test_too_many_workers_are_refused_before_any_worker_starts(capsys, tmp_path, monkeypatch):
    import bench.cli.sweep as sweep_cli

    started = []
    monkeypatch.setattr(sweep_cli, "prestart", started.append)
    _refused(capsys, ["sweep", "--workers", "999", "--out", tmp_path / "run", *SMALL],
             "--workers 999: this machine gives the sweep", tmp_path / "run")
    assert started == [0]  # no worker was started ahead for a count that cannot be placed


@pytest.mark.slow
def test_plugin_masks_that_cannot_work_are_refused_before_any_cell_runs(tmp_path):
    plugin = write_plugin(tmp_path, "badmasks", '''
        import torch
        from bench.masks import mask

        @mask("raises", description="its predicate raises")
        def raises(b, h, q_idx, kv_idx):
            raise ValueError("no such layout")

        @mask("pythonic", description="Python `and` on tensors")
        def pythonic(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx and kv_idx >= 0

        @mask("floaty", description="returns a float tensor")
        def floaty(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx).float()
    ''')
    for name, words in (("raises", "it raised ValueError: no such layout"),
                        ("pythonic", "it uses Python if/and/or/not on tensors"),
                        ("floaty", "its predicate returned a torch.float32 tensor; a mask returns a bool tensor")):
        out = tmp_path / f"run-{name}"
        proc = run_cli("sweep", "--plugin", plugin, "--masks", name, "--out", out, *SMALL)
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and not out.exists()
        assert len(err) == 1, proc.stderr
        assert f"mask '{name}'" in err[0] and "badmasks.py" in err[0] and words in err[0], err[0]
        if name == "pythonic":
            assert "combine conditions with &, |, ~ and torch.where" in err[0]
