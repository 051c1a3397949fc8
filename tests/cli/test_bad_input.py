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


# -- every integer-valued flag, every subcommand: ASCII digits in range, or exit 2 and one line ----------------

BAD_INTEGERS = ["²", "６", "-1", "0", "1" * 40]
COMMANDS = {"sweep": ["--dry-run"], "frontier": ["--variants", "naive"], "profile": ["--variant", "naive"],
            "selfcheck": ["--variants", "naive"]}


def _integer_settings():
    """(flag, lowest valid value) of every setting whose parser takes whole numbers."""
    import inspect

    from bench.model.spec import SETTINGS, flag

    out = []
    for name, s in SETTINGS.items():
        parse = s.parse
        kind = parse.__qualname__.split(".")[0]
        free = inspect.getclosurevars(parse).nonlocals if parse.__closure__ else {}
        if kind in ("ints", "head_dims") or parse.__name__ == "threads_or_auto":
            out.append((flag(name), free.get("lo", 1)))
        elif kind == "number" and free.get("whole"):
            out.append((flag(name), free["lo"]))
    return out


def _flags_of(command: str) -> set:
    import argparse

    from bench.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {opt for a in sub._actions for opt in a.option_strings}


def test_the_integer_settings_are_found():
    flags = dict(_integer_settings())
    assert {"--seq-lens", "--batch", "--head-dims", "--window", "--heads", "--rounds", "--threads"} <= set(flags)
    assert flags["--steps"] == 0 and flags["--seq-lens"] == 1


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_integer_flag_of_every_subcommand_refuses_what_is_not_an_ascii_whole_number_in_range(command,
                                                                                                    capsys):
    flags = _flags_of(command)
    walked = 0
    for flag_, lo in _integer_settings():
        if flag_ not in flags:
            continue
        for value in BAD_INTEGERS:
            if value == "0" and lo == 0:
                continue  # 0 is valid there (--steps 0: none)
            argv = [command, flag_, value, *COMMANDS[command], "--device", "cpu"]
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
            if not value.isascii():
                assert "ASCII" in err, (argv, err)
            walked += 1
    assert walked >= 20


@pytest.mark.parametrize("argv", [["profile", "--variant", "naive", "--top"], ["gpu-check", "--device", "cpu",
                                                                               "--seq-len"]])
def test_the_commands_own_integer_flags_refuse_the_same(argv, capsys):
    for value in BAD_INTEGERS:
        assert main([*argv, value]) == 2, value
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("spelling", ["²x(4/8)", "1x(4/⁸)", "２x(4/8)", "2x(4/)"])
def test_batch_mix_spellings_take_ascii_digits_and_whole_shapes(spelling, capsys):
    _refused(capsys, ["sweep", "--batch-mix", spelling, "--dry-run", "--device", "cpu"], "--batch-mix")


@pytest.mark.parametrize("argv, words", [
    (["--kv-layout", "paged:²"], "--kv-layout 'paged:²' is not valid"),
    (["--masks", "window:²"], "(ASCII digits 0-9)"),
    (["--lengths", "lognormal:０.5", "--batch", "4"], "--lengths 'lognormal:０.5' is not valid"),
    (["--inputs", "outliers:1e-300"], "1 <= SCALE"),
    (["--model", ""], "--model is empty; valid: llama3-8b"),
    (["--batch-mix", "2x(8/16)", "--total-tokens", "64"], "give it or --total-tokens, not both"),
    (["--seq-lens", "128", "--total-tokens", "200", "--lengths", "lognormal:0.5"], "give --total-tokens 256 or more"),
    (["--plugin", "nofile.py"], "no such file"),
    (["--threads", "999"], "--threads takes auto or a whole number from 1 to"),
    (["--masks", "tree_topk:1024", "--seq-lens", "12", "--kv-lens", "64", "--align", "br", "--variants", "naive"],
     "give a width of at most q_len"),
])
def test_surprising_values_are_refused_with_what_is_valid(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(capsys, ["sweep", *argv, "--dry-run", "--device", "cpu"], words)


def test_two_spellings_of_one_mix_are_one_cell():
    from bench.model.workload import canonical_mix

    assert canonical_mix("1x(4/8)+1x(4/8)") == canonical_mix("2x(4/8)") == "2x(4/8)"
    assert canonical_mix("1x(4/8)+1x(1/8)+1x(4/8)") == "1x(4/8)+1x(1/8)+1x(4/8)"  # another packing order


def test_a_tree_under_top_left_with_a_cache_warns(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--masks", "tree_chain", "--seq-lens", "12", "--kv-lens", "64", "--variants", "naive",
                 "--dry-run", "--device", "cpu"]) == 0
    assert "never see the cache's keys" in capsys.readouterr().err


def test_gpu_check_quick_refuses_the_flags_it_ignores(capsys):
    _refused(capsys, ["gpu-check", "--quick", "--variants", "nosuch"], "--variants is not taken with it")
    _refused(capsys, ["gpu-check", "--device", "cpu", "--variants", "nosuch"], "unknown nosuch; valid:")


# -- nothing already measured is written over --------------------------------------------------------------------


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from tests.conftest import made_once, run_cli

    folder, res = made_once(tmp_path_factory, "measured",
                            lambda f: run_cli("sweep", *SMALL[:-2], "--masks", "none,causal", "--out", f / "run"))
    assert res.returncode == 0, res.stderr
    return folder / "run"


def _snapshot(folder):
    import hashlib

    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # a sweep in a subprocess
def test_export_never_writes_over_a_runs_files_nor_any_file_without_force(measured, tmp_path, capsys):
    before = _snapshot(measured)
    for name in ("results.jsonl", "env.json", "masks.json"):
        _refused(capsys, ["export", measured, "--out", measured / name], "export never writes over a run's files")
        _refused(capsys, ["export", measured, "--out", measured / name, "--force"], "never writes over")
    assert _snapshot(measured) == before
    _refused(capsys, ["export", measured, "--out", tmp_path / "missing" / "x.json"], "does not exist")
    _refused(capsys, ["export", measured, "--out", tmp_path], "a folder is there")
    other = tmp_path / "mine.json"
    other.write_text("keep me")
    _refused(capsys, ["export", measured, "--out", other], "--force replaces it")
    assert other.read_text() == "keep me"
    assert main(["export", str(measured), "--out", str(other), "--force"]) == 0
    assert json.loads(other.read_text())["benchmarks"]


@pytest.mark.slow  # a sweep in a subprocess
def test_no_command_writes_over_an_existing_run_folders_files(measured, tmp_path, capsys, monkeypatch):
    """Every subcommand that reads a run leaves the files it found byte for byte as they were; only
    sweep --resume (its rows), report (report/) and merge (its own merged/ folder) write into one."""
    monkeypatch.chdir(tmp_path)
    before = _snapshot(measured)
    run = str(measured)
    for argv in (["status", run], ["status", run, "--cells"], ["status", run, "--repro", "1"],
                 ["export", run, "--out", str(tmp_path / "e.json")], ["export", run],
                 ["compare", run, run, "--out", str(tmp_path / "cmp")], ["compare", run, run],
                 ["list"], ["sweep", "--resume", run, "--dry-run"]):
        main(argv)
        after = _snapshot(measured)
        assert {k: v for k, v in after.items() if k in before} == before, argv
    capsys.readouterr()


@pytest.mark.slow  # a sweep in a subprocess
def test_report_of_one_run_named_twice_reads_it_once(measured, tmp_path, capsys):
    import pandas as pd

    assert main(["report", str(measured), str(measured), "--out", str(tmp_path / "rep")]) == 0
    assert "named more than once" in capsys.readouterr().err
    assert len(pd.read_csv(tmp_path / "rep" / "results.csv")) == len(
        [line for line in (measured / "results.jsonl").read_text().splitlines() if line])


def test_frontier_refuses_a_folder_that_holds_anything(tmp_path, capsys):
    out = tmp_path / "f"
    out.mkdir()
    (out / "frontier.csv").write_text("variant,largest\nnaive,64\n")
    _refused(capsys, ["frontier", "--variants", "naive", "--device", "cpu", "--memory-budget", "1GiB", "--out", out],
             "not empty")
    assert (out / "frontier.csv").read_text() == "variant,largest\nnaive,64\n"


@pytest.mark.slow  # a sweep in a subprocess
def test_resume_with_another_out_is_refused(measured, tmp_path, capsys):
    _refused(capsys, ["sweep", "--resume", measured, "--out", tmp_path / "other", "--dry-run"], "give one of them")


@pytest.mark.slow
def test_a_frontier_where_nothing_fits_says_so_instead_of_naming_a_chart(tmp_path):
    from tests.conftest import run_cli

    res = run_cli("frontier", "--variants", "naive", "--memory-budget", "1B", "--out", tmp_path / "f")
    assert res.returncode == 0, res.stderr
    assert "chart None" not in res.stdout and "no chart: no variant fits" in res.stdout


def test_batch_mix_is_taken_by_profile_and_selfcheck(tmp_path, capsys):
    mix = ["--batch-mix", "1x(8/8)+2x(1/16)", "--heads", "2", "--head-dims", "8", "--masks", "causal",
           "--device", "cpu"]
    assert main(["profile", "--variant", "naive", *mix, "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    assert list((tmp_path / "p").glob("trace_naive_*.json"))  # the mix's one case, profiled
    assert main(["selfcheck", "--variants", "naive", *mix, "--budget-ms", "5"]) in (0, 1)  # a verdict, not exit 2
    assert "mix=1x(8/8)+2x(1/16)" in capsys.readouterr().out


@pytest.mark.slow  # a sweep in a subprocess
def test_compare_explain_gives_each_runs_own_settings_and_folders(measured, tmp_path, capsys):
    """Run B is run A's rows measured under another budget: each command carries its own run's."""
    other = tmp_path / "b"
    other.mkdir()
    rows = [json.loads(x) for x in (measured / "results.jsonl").read_text().splitlines()]
    (other / "results.jsonl").write_text("".join(json.dumps(r | {"budget_ms": 7.0}) + "\n" for r in rows))
    (other / "env.json").write_text((measured / "env.json").read_text())
    cell = f"naive n=16 {rows[0]['mask']} fwd"
    assert main(["compare", str(measured), str(other), "--explain", cell, "--out", str(tmp_path / "cmp")]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("measure it again")]
    assert len(lines) == 2
    budget = f"--budget-ms {rows[0]['budget_ms']:g} "
    assert budget in lines[0] and "--budget-ms 7 " in lines[1]
    assert all(f"--threads {rows[0]['threads']}" in x for x in lines)
    outs = [x.split("--out ")[1] for x in lines]
    assert outs[0] != outs[1]
    _refused(capsys, ["compare", measured, other, "--explain", ""], "--explain takes words")


@pytest.mark.slow  # a sweep in a subprocess
def test_status_finds_the_newest_runs_sweep_id_once_through_runs_latest(measured, tmp_path, capsys, monkeypatch):
    """runs/latest links to the run it names: a sweep id found through both is in one folder."""
    import shutil

    from bench.runs import store

    monkeypatch.chdir(tmp_path)
    run = store.new_run_dir("cpu")  # runs/<timestamp>-cpu, and runs/latest to it, as a sweep makes them
    for f in measured.iterdir():
        if f.is_file():
            shutil.copy(f, run / f.name)
    latest = tmp_path / store.DEFAULT_ROOT / "latest"
    assert latest.is_symlink() and latest.resolve() == run.resolve()
    sweep_id = json.loads((run / "env.json").read_text())["sweep_id"]
    assert main(["status", sweep_id]) == 0
    assert f"run {store.DEFAULT_ROOT}" in capsys.readouterr().out
    shutil.copytree(run, run.with_name("copy"))  # the same sweep twice, for real
    _refused(capsys, ["status", sweep_id], "is in 2 run folders")


@pytest.mark.slow  # a sweep in a subprocess
def test_compare_explain_with_nothing_to_explain_and_status_repro_with_a_superscript(measured, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    rows = [json.loads(x) | {"variant": "nothing.alike"} for x in (measured / "results.jsonl").read_text().splitlines()]
    (other / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (other / "env.json").write_text((measured / "env.json").read_text())
    _refused(capsys, ["compare", measured, other, "--explain", "naive n=16", "--out", tmp_path / "c"],
             "no matching ok cell to explain")
    _refused(capsys, ["status", measured, "--repro", "²"], "--repro '²'")
