"""Bad input from the command line: one line that says what is valid, exit 2, no traceback."""

import pytest

from bench.cli import main
from tests.conftest import run_cli, write_plugin


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "plain.txt"
    f.write_text("not a folder")
    return f


def _one_line(capsys, words, code=2, argv=()):
    assert main(list(argv)) == code
    err = capsys.readouterr().err
    assert words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, words", [
    (lambda f: ["sweep", "--out", str(f), "--no-report"], "a file is there; give a folder"),
    (lambda f: ["sweep", "--out", str(f / "under"), "--no-report"], "cannot write there"),
    (lambda f: ["sweep", "--out", "/proc/attnbench-run", "--no-report"], "cannot write there"),
    (lambda f: ["profile", "--variant", "naive", "--out", str(f)], "a file is there; give a folder"),
    (lambda f: ["selfcheck", "--budget-ms", "abc"], "--budget-ms takes a positive, finite number of milliseconds"),
    (lambda f: ["profile"], "give --variant NAME"),
])
def test_paths_and_numbers(capsys, a_file, argv, words):
    _one_line(capsys, words, argv=argv(a_file))


@pytest.mark.parametrize("rule", ["nan", "-5", "fastest:5%", "abc"])
def test_compare_rule_is_checked(capsys, tmp_path, rule):
    _one_line(capsys, "--fail-on-regression takes PCT, PCT% or METRIC:PCT%",
              argv=["compare", str(tmp_path), str(tmp_path), "--fail-on-regression", rule])


def test_report_out_unwritable(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("")
    _one_line(capsys, "cannot write there", argv=["report", str(run), "--out", "/proc/attnbench-report"])


def test_a_plugin_that_exits_at_import_is_named(capsys, tmp_path):
    plugin = write_plugin(tmp_path, "quits", "import sys\nsys.exit(3)\n")
    _one_line(capsys, f"--plugin {plugin}: called sys.exit(3) while being imported",
              argv=["list", "--plugin", str(plugin)])


@pytest.mark.slow
def test_window_without_the_window_mask_warns(tmp_path):
    proc = run_cli("sweep", "--out", tmp_path / "run", "--variants", "naive", "--seq-lens", "16", "--heads", "2",
                   "--head-dims", "16", "--masks", "causal", "--window", "8", "--budget-ms", "5", "--device", "cpu",
                   "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if line.startswith("warning: --window 8")]
    assert "no effect" in warning and "--masks (causal)" in warning


def test_a_reader_that_goes_away_gets_no_traceback(tmp_path):
    """``python -m bench list | head -1``: the reader closes the pipe early; the command ends without a
    BrokenPipeError traceback (``true`` reads nothing and is gone before the table is written)."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    err = tmp_path / "err.txt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(f"'{sys.executable}' -m bench list 2>'{err}' | true", shell=True, env=env, cwd=tmp_path,
                   timeout=120)
    assert "Traceback" not in err.read_text() and "BrokenPipe" not in err.read_text(), err.read_text()
