"""End-to-end sweeps in subprocesses: failures become rows, kills lose nothing, resume adds
only what is missing, bad input exits 2 with one line."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bench.cli import main
from bench.cli.sweep import timed_share
from bench.model.parsers import THREADS_PER_CORE, usable_cores
from tests.conftest import ROOT, read_jsonl, run_cli, write_plugin
from tests.support.text import count, numbers, value

THREADS_LIMIT = min(4096, THREADS_PER_CORE * usable_cores())  # --threads beyond this is refused here

SMALL = ["--seq-lens", "32,64", "--heads", "2", "--head-dims", "16", "--masks", "none",
         "--budget-ms", "5", "--no-report", "--quiet", "--device", "cpu",  # the same on a GPU machine
         "--remeasure", "0"]

BAD_PLUGINS = """
import os, time
import torch
import torch.nn.functional as F
from bench.registry import variant

@variant("bad.raises", masks=("none",), description="raises")
def raises(case):
    def attention(q, k, v):
        raise ValueError("deliberate failure\\nsecond line")
    return attention

@variant("bad.wrong", masks=("none",), description="wrong result")
def wrong(case):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * 1.5

@variant("bad.abort", masks=("none",), description="kills its process")
def abort(case):
    def attention(q, k, v):
        os.abort()
    return attention

@variant("bad.sleeps", masks=("none",), description="hangs")
def sleeps(case):
    def attention(q, k, v):
        time.sleep(600)
    return attention
"""


@pytest.mark.slow
def test_failing_variants_become_rows_and_the_sweep_goes_on(tmp_path):
    plugin = write_plugin(tmp_path, "bad", BAD_PLUGINS)
    out = tmp_path / "run"
    proc = run_cli("sweep", "--plugin", plugin, "--out", out, "--timeout", "3",
                   "--variants", "naive,bad.raises,bad.wrong,bad.abort,bad.sleeps,sdpa.math,xformers",
                   *SMALL, "--seq-lens", "32")  # one length: each failure once (a timeout and a crash cost seconds)
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 7
    by = {}
    for r in rows:
        by.setdefault(r["variant"], set()).add(r["status"])
    assert by == {"naive": {"ok"}, "sdpa.math": {"ok"}, "bad.raises": {"error"},
                  "bad.wrong": {"mismatch"}, "bad.abort": {"crash"}, "bad.sleeps": {"timeout"},
                  "xformers": {"unsupported"}}
    reasons = {r["variant"]: r["reason"] for r in rows}
    assert reasons["bad.raises"].startswith("ValueError: deliberate failure (raised in variant code, ")
    assert reasons["bad.raises"].endswith("bad.py:10)")  # where: the plugin's own line
    assert "SIGABRT" in reasons["bad.abort"]
    assert "3 s beyond" in reasons["bad.sleeps"]
    assert "tolerance" in reasons["bad.wrong"]
    assert "cuda" in reasons["xformers"] or "not installed" in reasons["xformers"]
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok:
        for key in ("median_ms", "iqr_ms", "min_ms", "samples", "peak_mem_bytes", "flops", "tflops",
                    "max_abs_err", "threads", "samples_ms"):
            assert r.get(key) is not None, key
        # a sample in each of the 3 rounds at least (the 5 ms budget decides the rest, and a busy machine
        # takes fewer): the count is the raw samples kept
        assert r["samples"] >= r["rounds"] == 3 and len(r["samples_ms"]) == r["samples"]
        assert len(r["round_medians_ms"]) == 3
    env = json.loads((out / "env.json").read_text())
    assert env["torch"] and env["threads"] >= 1 and env["peaks_tflops"]["float32"] > 0
    assert "bad.sleeps" in env["spec"]["variants"]
    assert env["colours"]["naive"] == 11 and "bad.sleeps" not in env["colours"]  # the slots variants declare
    (said,) = [line for line in proc.stdout.splitlines() if line.startswith("statuses:")]
    statuses = ("ok", "mismatch", "unsupported", "error", "timeout", "crash")
    assert [value(said, s) for s in statuses] == [2, 1, 1, 1, 1, 1]


def _line_count(path):
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_killed_sweep_resumes_with_every_cell_exactly_once(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "--out", str(out), "--variants", "naive,sdpa.math,sdpa.flash",
            "--seq-lens", "32,64,128,256", "--masks", "none,causal", "--heads", "2",
            "--head-dims", "16", "--budget-ms", "150", "--no-report", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while _line_count(results) < 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker, mid-run
    proc.wait()
    partial = _line_count(results)
    assert 4 <= partial < 24, "the kill should land mid-sweep"
    resumed = run_cli("sweep", "--resume", out, "--no-report", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    lines = results.read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # every line parses
    keys = [(r["variant"], r["q_len"], r["mask"]) for r in rows]
    assert len(keys) == len(set(keys)) == 3 * 4 * 2
    assert f"{24 - partial} cells to run, {partial} already there" in resumed.stderr


@pytest.mark.slow
def test_resume_with_one_more_variant_measures_only_its_cells(tmp_path):
    out = tmp_path / "run"
    first = run_cli("sweep", "--out", out, "--variants", "naive", *SMALL)
    assert first.returncode == 0, first.stderr
    before = (out / "results.jsonl").read_text()
    plugin = write_plugin(tmp_path, "extra", """
        import torch.nn.functional as F
        from bench.registry import variant

        @variant("extra.sdpa", description="plugin added later")
        def extra(case):
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
        """)
    second = run_cli("sweep", "--resume", out, "--plugin", plugin, "--no-report", "--quiet")
    assert second.returncode == 0, second.stderr
    after = (out / "results.jsonl").read_text()
    assert after.startswith(before)
    new = [json.loads(line) for line in after[len(before):].splitlines()]
    assert {r["variant"] for r in new} == {"extra.sdpa"} and len(new) == 2
    assert all(r["status"] == "ok" for r in new)
    assert "2 cells to run, 2 already there" in second.stderr


@pytest.mark.parametrize("argv, words", [
    (["sweep", "--variants", "naive,nope"], "unknown variant 'nope'; valid: "),
    (["sweep", "--dtypes", "float9"], "unknown dtype 'float9'; valid: float32, float16, bfloat16, float8_e4m3fn"),
    (["sweep", "--masks", "diag"], "unknown mask or score mod 'diag'; masks: none, causal, window, padding, document"),
    (["sweep", "--preset", "huge"], "unknown preset 'huge'; valid: quick, default, full"),
    (["sweep", "--heads", "8", "--kv-heads", "3"], "heads 8 is not divisible by kv_heads 3"),
    (["sweep", "--seq-lens", "0,128"], "--seq-lens takes positive integers up to 16,777,216, got 0"),
    (["sweep", "--seq-lens", "-5"], "--seq-lens takes positive integers up to 16,777,216, got -5"),
    (["sweep", "--seq-lens", "1000000000"], "--seq-lens takes positive integers up to 16,777,216, got 1000000000"),
    (["sweep", "--seq-lens", str(10**20)], f"--seq-lens takes positive integers up to 16,777,216, got {10**20}"),
    (["sweep", "--seq-lens", "64.5"], "--seq-lens takes positive integers up to 16,777,216, got '64.5'"),
    (["sweep", "--directions", "up"], "unknown direction 'up'; valid: fwd, bwd, fwd+bwd"),
    (["sweep", "--resume", "/nonexistent/run"], "no such run folder"),
    (["sweep", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["sweep", "--device", "tpu"], "unknown device 'tpu'; valid: cpu, cuda"),
    (["sweep", "--threads", "0"], f"--threads takes auto or a whole number from 1 to {THREADS_LIMIT}, got 0"),
    (["sweep", "--threads", "two"], f"--threads takes auto or a whole number from 1 to {THREADS_LIMIT}, got 'two'"),
    (["sweep", "--precision", "nan"], "--precision takes a number from 0.1 to 50, got 'nan'"),
    (["sweep", "--rounds", "0"], "--rounds takes a whole number from 1 to 100, got 0"),
    (["sweep", "--budget-ms", "nan"], "--budget-ms takes a positive, finite number of milliseconds, got 'nan'"),
    (["compare", "/nonexistent/a"], "the following arguments are required"),
    (["report", "/nonexistent/run"], "/nonexistent/run: not a run folder (no results.jsonl)"),
    (["compare", "/nonexistent/a", "/nonexistent/b"], "not a run folder"),
    (["export", "/nonexistent/run"], "not a run folder"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("toml, words", [
    ("sweep = 5\n", "'sweep' must be a table"),
    ("seq_lens = [64.5]\n", ": seq_lens takes positive integers up to 16,777,216, got 64.5"),
    ("seq_lens = [true]\n", ": seq_lens takes positive integers up to 16,777,216, got True"),
    ("plugins = 5\n", "plugins takes a list of paths, got 5"),
    ('plugins = "/nonexistent/x.py"\n', "--plugin /nonexistent/x.py: no such file"),
])
@pytest.mark.slow
def test_config_values_are_not_converted_silently(tmp_path, capsys, toml, words):
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    assert main(["sweep", "--config", str(cfg), "--no-report"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_repeated_values_are_one_cell_and_huge_lengths_cost_nothing():
    from bench.api import discover
    from bench.case import Case
    from bench.model import masks
    from bench.model.specbuild import build_spec, parse_values

    given = parse_values({"variants": "naive,naive", "dtypes": "bf16,bfloat16", "seq_lens": "64,64"})
    spec = build_spec(given, discover())
    assert (spec.variants, spec.dtypes, spec.seq_lens) == (["naive"], ["bfloat16"], [64])
    n = 1 << 24  # the largest length: its pairs in closed form, no per-token tensor
    big = Case(batch=2, q_len=n, kv_len=n, mask="window", window=4096)
    assert masks.kept_pairs(big) == 2 * (4096 * 4097 // 2 + (n - 4096) * 4096)  # min(i + 1, w) keys per query


@pytest.mark.slow
def test_malformed_and_unknown_config(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("seq_lens = [128,\n")
    assert main(["sweep", "--config", str(bad)]) == 2
    assert "malformed TOML" in capsys.readouterr().err
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("seq_lenz = [128]\n")
    assert main(["sweep", "--config", str(unknown)]) == 2
    assert "unknown key 'seq_lenz'; valid: variants, seq_lens" in capsys.readouterr().err


@pytest.mark.slow
def test_config_file_with_flag_override(tmp_path):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('[sweep]\nvariants = ["naive"]\nseq_lens = [32, 48]\nheads = [2]\nhead_dims = [8]\n'
                   'masks = ["causal"]\nbudget_ms = 5\nthreads = 1\nprecision = 5\nrounds = 2\n')
    out = tmp_path / "run"
    proc = run_cli("sweep", "--config", cfg, "--seq-lens", "16", "--out", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert [(r["variant"], r["q_len"], r["mask"], r["status"]) for r in rows] == [
        ("naive", 16, "causal", "ok")]
    assert (rows[0]["threads"], rows[0]["precision"], rows[0]["rounds"]) == (1, 0.05, 2)
    env = json.loads((out / "env.json").read_text())
    assert env["threads"] == 1 and env["spec"]["threads"] == 1
    assert len(env["loadavg_start"]) == 3 and len(env["loadavg_end"]) == 3
    assert set(env["peak_checks"]["float32"]) == {"start", "end"}
    assert env["peaks_tflops"]["float32"] == max(env["peak_checks"]["float32"].values())
    lines = proc.stdout.splitlines()
    assert lines[-1] == f"report: {out / 'report' / 'index.html'}"  # the last line: what to open
    last = re.fullmatch(r"timed samples: ([\d.]+) s, (\d+)% of the cells' ([\d.]+) s wall and (\d+)% of the command's "
                        r"([\d.]+) s \(start-up, peaks and summary ([\d.]+) s, report ([\d.]+) s\); "
                        r"projected ([\d.]+) s, ([\d.]+)x of it measured", lines[-2])
    assert last, lines[-2]
    assert float(last[9]) == pytest.approx(float(last[5]) / float(last[8]), rel=0.05)  # the projection's error
    assert lines[-4].startswith("shaky: ") and " of 1 ok cells" in lines[-4]
    timed, cells, command, rest, report = (float(last[i]) for i in (1, 3, 5, 6, 7))
    assert 0 < timed <= cells < command and report > 0 and rest > 0
    assert abs(cells + rest + report - command) <= 0.01 * command  # the parts add up (3 significant digits each)
    assert abs(int(last[2]) - 100 * timed / cells) <= 2 and abs(int(last[4]) - 100 * timed / command) <= 2


@pytest.mark.slow
def test_cuda_device_refused_without_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["sweep", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA is not available" in err and err.rstrip().endswith("valid here: cpu") and "Traceback" not in err


@pytest.mark.slow
def test_strict_exits_1_when_a_cell_failed(tmp_path):
    plugin = write_plugin(tmp_path, "bad", BAD_PLUGINS)
    proc = run_cli("sweep", "--plugin", plugin, "--out", tmp_path / "run", "--variants", "naive,bad.raises",
                   "--strict", *SMALL)
    assert proc.returncode == 1
    assert count(proc.stderr, "failed cell(s)") == 2 and "bad.raises error at n=32" in proc.stderr
    fine = run_cli("sweep", "--out", tmp_path / "fine", "--variants", "naive,xformers", "--strict", *SMALL)
    assert fine.returncode == 0, fine.stderr  # unsupported with a reason is not a failure


PROBE_PLUGIN = """
import multiprocessing
import os
import torch.nn.functional as F
from bench.registry import variant

def where_checked(case):
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write("worker\\n" if multiprocessing.parent_process() is not None else "sweep\\n")
    return "refused by its own probe" if case.q_len > 32 else None

@variant("probed", masks=("none",), check=where_checked, description="a variant with a probe")
def probed(case):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
"""


@pytest.mark.slow
def test_availability_probes_run_in_the_worker(tmp_path):
    plugin = write_plugin(tmp_path, "probed", PROBE_PLUGIN)
    log = tmp_path / "probe.log"
    proc = run_cli("sweep", "--plugin", plugin, "--out", tmp_path / "run", "--variants", "probed", *SMALL,
                   env={"PROBE_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr
    rows = {r["q_len"]: r for r in read_jsonl(tmp_path / "run" / "results.jsonl")}
    assert rows[32]["status"] == "ok"
    assert rows[64]["status"] == "unsupported" and rows[64]["reason"] == "refused by its own probe"
    assert log.read_text().split() == ["worker", "worker"]  # never in the sweep's own process


def test_process_started_counts_the_interpreter_start_up():
    """The command's wall time starts when the process did, not when the sweep module ran."""
    code = ("import time; time.sleep(0.6); from bench.cli.common import process_started; "
            "print(time.perf_counter() - process_started())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    age = float(proc.stdout)
    if sys.platform.startswith("linux"):
        assert 0.6 <= age < 60  # the sleep, plus the imports: all before the call
    else:
        assert 0 <= age < 1


def test_timed_share_line():
    line = timed_share(timed_s=12.0, cells_s=20.0, command_s=35.0, report_s=10.0)
    assert line.startswith("timed samples:") and numbers(line) == [12, 60, 20, 34, 35, 5, 10]
    # without a report; a clock that disagrees by a hair never gives a negative rest
    short = timed_share(1.0, 2.0, 1.999, 0.0)
    assert numbers(short)[-2:] == [2, 0] and "report" not in short


def test_measure_settings_come_from_the_spec_once_in_one_unit():
    from bench.api import build_spec, discover, parse_values
    from bench.measure.settings import MeasureSettings

    spec = build_spec(parse_values({"variants": ["naive"], "precision": 5, "rounds": 2, "budget_ms": 7,
                                    "threads": 1, "device": "cpu"}), discover(entry_points=False))
    s = MeasureSettings.from_spec(spec)
    assert (s.budget_ms, s.precision, s.rounds, s.threads, s.timer) == (7.0, 0.05, 2, 1, "events")
    assert MeasureSettings.from_spec(spec, threads=3).threads == 3  # a worker's own share of the cores
    row = s.stamp({}, "cuda")
    assert row == {"budget_ms": 7.0, "threads": 1, "precision": None, "heap": "fixed"}  # no precision on the GPU timers


@pytest.mark.slow
def test_every_row_is_stamped_with_the_settings_also_those_that_never_reached_a_worker(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("sweep", "--variants", "naive,xformers", "--seq-lens", "16", "--heads", "1", "--head-dims", "8",
                   "--masks", "none", "--budget-ms", "5", "--precision", "4", "--threads", "1", "--out", out,
                   "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert {r["status"] for r in rows} == {"ok", "unsupported"}  # xformers: refused before any worker ran it
    assert {(r["budget_ms"], r["threads"], r["precision"]) for r in rows} == {(5.0, 1, 0.04)}


def test_a_sweeps_flags_are_read_without_torch():
    """The workers start importing torch as soon as the flags are read, and the flags are read
    without it (a malformed mask alone asks the catalogue), so the two imports overlap and a value
    no setting takes is still refused before any worker starts."""
    import subprocess
    import sys

    code = ("import sys\nfrom bench.cli import build_parser\nfrom bench.cli.common import given_settings\n"
            "given_settings(build_parser().parse_args(['sweep', '--preset', 'quick', '--masks', "
            "'none,causal,window:64,document:4&causal,sink:4+window:256', '--lengths', 'lognormal:0.5', "
            "'--batch-mix', '2x(4/8)', '--inputs', 'clustered', '--head-dims', '192/128', '--device', 'cpu']))\n"
            "print('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr


def test_the_plan_says_what_the_preset_covers_unless_a_flag_changed_it(capsys):
    from bench.cli import main
    from bench.model.specbuild import preset_about

    assert main(["sweep", "--device", "cpu", "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"preset default: {preset_about('cpu', 'default')}" and "128 to 2048" in first
    assert main(["sweep", "--device", "cpu", "--seq-lens", "128", "--dry-run"]) == 0
    assert not capsys.readouterr().out.startswith("preset ")  # the lengths are no longer the preset's


def test_a_cell_that_cannot_run_here_is_a_row_but_not_a_cell_of_the_sweep(tmp_path, capsys):
    """xformers declares CUDA only: on the CPU its cell is counted apart in the plan and the summary,
    never launched, and still a row with its reason (the report's line)."""
    from bench.cli import main

    out = tmp_path / "run"
    assert main(["sweep", "--variants", "naive,xformers", "--seq-lens", "16", "--heads", "2", "--head-dims", "8",
                 "--masks", "none", "--directions", "fwd", "--device", "cpu", "--budget-ms", "3", "--visits", "1",
                 "--no-report", "--quiet", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "1 cells in 1 cases" in captured.err and count(captured.err, "more cannot run here") == 1
    assert "(1 cells swept in" in captured.out and count(captured.out, "that cannot run here") == 1
    rows = {r["variant"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert rows["xformers"]["status"] == "unsupported" and "cpu" in rows["xformers"]["reason"]
    assert rows["naive"]["status"] == "ok"
