"""A hostile user's sweeps: two into one folder, a killed parent, a variant that spawns
processes, provenance on resume, rows that lie about themselves."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import ROOT, read_jsonl, read_records, run_cli, write_plugin

S = ["--heads", "2", "--head-dims", "16", "--dtypes", "float32", "--directions", "fwd", "--masks", "none",
     "--quiet", "--no-report", "--device", "cpu", "--remeasure", "0", "--budget-ms", "5"]

HANGING = """
import os, subprocess, time
from pathlib import Path
from bench.registry import variant

@variant("hang.busy", masks=("none",), description="spins forever, telling where it runs")
def busy(case):
    def attention(q, k, v):
        Path(os.environ["HANG_PID"]).write_text(str(os.getpid()))
        while True:
            pass
    return attention

@variant("hang.spawner", masks=("none",), description="starts a process, then hangs")
def spawner(case):
    def attention(q, k, v):
        child = subprocess.Popen(["sleep", "600"])
        Path(os.environ["HANG_PID"]).write_text(str(child.pid))
        time.sleep(600)
    return attention
"""


def _popen_sweep(*args, env=None):
    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    if "--resume" not in map(str, args) and "--visits" not in map(str, args):
        args = (*args, "--visits", "1")  # one visit, as run_cli's sweeps (tests/engine/test_visits.py: the others)
    return subprocess.Popen([sys.executable, "-m", "bench", "sweep", *map(str, args)], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path} never appeared")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc")
def test_a_killed_sweep_takes_its_worker_with_it_and_a_second_sweep_is_locked_out(tmp_path):
    plugin = write_plugin(tmp_path, "hang", HANGING)
    pidfile = tmp_path / "pid"
    out = tmp_path / "run"
    proc = _popen_sweep("--plugin", plugin, "--variants", "hang.busy", "--seq-lens", "16", "--out", out,
                        "--timeout", "600", *S, env={"HANG_PID": str(pidfile)})
    try:
        worker = _wait_for(pidfile)
        second = run_cli("sweep", "--resume", out, *S)
        assert second.returncode == 2
        assert "another sweep is writing" in second.stderr and f"(process {proc.pid})" in second.stderr
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _gone(worker), "the worker outlived its sweep"
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc")
def test_a_timeout_kills_what_the_variant_spawned(tmp_path):
    plugin = write_plugin(tmp_path, "hang", HANGING)
    pidfile = tmp_path / "pid"
    proc = run_cli("sweep", "--plugin", plugin, "--variants", "hang.spawner", "--seq-lens", "16",
                   "--out", tmp_path / "run", "--timeout", "3", *S, env={"HANG_PID": str(pidfile)})
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(tmp_path / "run" / "results.jsonl")
    assert [r["status"] for r in rows] == ["timeout"]
    assert _gone(int(pidfile.read_text())), "the variant's child process survived the timeout"


@pytest.mark.slow
def test_prepared_info_never_shadows_a_core_column_and_must_travel(tmp_path):
    plugin = write_plugin(tmp_path, "liar", """
        import threading
        import torch.nn.functional as F
        from bench.registry import Prepared, variant

        @variant("liar", masks=("none",), description="claims to be another cell")
        def liar(case):
            return Prepared(lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                            info={"variant": "naive", "q_len": 999, "compile_ms": 1.5})

        @variant("lockbox", masks=("none",), description="reports a figure that cannot be sent")
        def lockbox(case):
            return Prepared(lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                            info={"handle": threading.Lock()})
    """)
    proc = run_cli("sweep", "--plugin", plugin, "--variants", "liar,lockbox", "--seq-lens", "16",
                   "--out", tmp_path / "run", *S)
    assert proc.returncode == 0, proc.stderr
    rows = {r["variant"]: r for r in read_records(tmp_path / "run" / "results.jsonl")}  # as stored
    assert set(rows) == {"liar", "lockbox"}
    liar = rows["liar"]
    assert liar["q_len"] == 16 and liar["status"] == "ok" and liar["reason_kind"] == ""
    assert liar["extra"] == {"variant": "naive", "q_len": 999, "compile_ms": 1.5}  # its own namespace
    from bench.runs.store import read_rows

    flat = {r["variant"]: r for r in read_rows(tmp_path / "run")}["liar"]  # as reports read it
    assert flat["compile_ms"] == 1.5 and flat["extra.variant"] == "naive" and flat["variant"] == "liar"
    assert rows["lockbox"]["status"] == "error" and "'handle'" in rows["lockbox"]["reason"]


def test_a_wrong_dtype_or_device_is_a_mismatch():
    from bench.case import Case
    from bench.measure.correctness import run_and_check
    from bench.measure.inputs import make_inputs

    case = Case("cpu", "float32", 1, 2, 2, 16, 16, 8, "none", None, "fwd")
    q, k, v = make_inputs(case)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert run_and_check(case, sdpa, q, k, v).ok
    wide = run_and_check(case, lambda q, k, v: sdpa(q.double(), k.double(), v.double()), q, k, v)
    assert not wide.ok and "dtype torch.float64" in wide.reason and "float32" in wide.reason


@pytest.mark.slow
def test_resume_retry_measures_crashed_cells_again_and_the_report_uses_the_newest(tmp_path, capsys):
    from bench.cli import main
    from reports.frames import load_runs

    out = tmp_path / "run"
    first = run_cli("sweep", "--out", out, "--variants", "naive", "--seq-lens", "16,32", *S)
    assert first.returncode == 0, first.stderr
    lines = (out / "results.jsonl").read_text().splitlines()
    crashed = json.loads(lines[0]) | {"status": "crash", "reason": "worker died with SIGKILL"}
    (out / "results.jsonl").write_text("\n".join([json.dumps(crashed), lines[1]]) + "\n")
    plain = run_cli("sweep", "--resume", out, *S)
    assert "0 cells to run" in plain.stderr  # kept as it is without --retry
    again = run_cli("sweep", "--resume", out, "--retry", "crash,timeout,oom", *S)
    assert again.returncode == 0, again.stderr
    assert "1 cells to run" in again.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert [r["status"] for r in rows] == ["crash", "ok", "ok"]  # both stay in the file
    df, _ = load_runs([out])
    assert sorted(df["status"]) == ["ok", "ok"]  # the report uses the newest
    assert main(["sweep", "--resume", str(out), "--retry", "happy", *S]) == 2  # refused before any worker: in-process
    assert "--retry takes statuses from" in capsys.readouterr().err


def test_an_oom_kill_is_told_apart_from_a_crash(monkeypatch):
    import bench.engine.runner as runner

    counts = iter([4])
    monkeypatch.setattr(runner, "oom_kills", lambda: next(counts))
    status, reason = runner._death(-signal.SIGKILL, kills_before=3)  # the cgroup's count rose
    assert status == "oom" and "OOM killer" in reason
    monkeypatch.setattr(runner, "oom_kills", lambda: None)  # no cgroup counter to read
    status, reason = runner._death(-signal.SIGKILL, kills_before=None)
    assert status == "crash" and "probably out of memory" in reason
    assert runner._death(-signal.SIGSEGV)[0] == "crash" and runner._death(3) == ("crash", "worker exited with code 3")


@pytest.mark.slow
def test_the_timeout_is_the_cells_own_work_beyond_its_budget(tmp_path, capsys):
    from bench.cli import main

    proc = run_cli("sweep", "--out", tmp_path / "run", "--variants", "sdpa", "--seq-lens", "16", "--timeout", "1",
                   *S[:-1], "900")  # a 0.05 ms cell, a 0.9 s budget: 1 s beyond it is plenty
    assert proc.returncode == 0, proc.stderr
    assert [r["status"] for r in read_jsonl(tmp_path / "run" / "results.jsonl")] == ["ok"]
    assert main(["sweep", "--timeout", "0.5", "--budget-ms", "1000"]) == 2
    err = capsys.readouterr().err
    assert "--timeout 0.5 s" in err and "budget" in err


@pytest.mark.slow
def test_provenance_is_kept_and_a_changed_machine_is_refused_or_marked(tmp_path, capsys):
    from bench.cli import main

    out = tmp_path / "run"
    first = run_cli("sweep", "--out", out, "--variants", "naive", "--seq-lens", "16", "--threads", "2", *S)
    assert first.returncode == 0, first.stderr
    # the refusals come before any worker starts: asked in-process
    assert main(["sweep", "--out", str(out), "--variants", "naive", "--seq-lens", "32", *S]) == 2
    assert "already a run folder; --resume" in capsys.readouterr().err
    assert main(["sweep", "--resume", str(out), "--threads", "1", "--seq-lens", "16,32", *S]) == 2
    err = capsys.readouterr().err
    assert "threads: 2 -> 1" in err and "--allow-env-change" in err
    mixed = run_cli("sweep", "--resume", out, "--threads", "1", "--seq-lens", "16,32", "--allow-env-change", *S[:-2],
                    "--budget-ms", "7")
    assert mixed.returncode == 0, mixed.stderr
    env = json.loads((out / "env.json").read_text())
    assert [h["spec"]["seq_lens"] for h in env["history"]] == [[16], [16, 32]]  # the first spec is kept
    assert env["history"][0]["fingerprint"]["threads"] == 2 and env["mixed_env"] == ["threads: 2 -> 1"]
    rows = read_jsonl(out / "results.jsonl")
    assert [(r["q_len"], r["threads"], r["budget_ms"]) for r in rows] == [(16, 2, 5.0), (32, 1, 7.0)]
    assert main(["report", str(out)]) == 0
    assert "MIXED RUN" in (out / "report" / "index.html").read_text()


@pytest.mark.slow
def test_a_report_that_fails_fails_the_sweep_and_keeps_its_rows(tmp_path, monkeypatch, capsys):
    import reports.build
    from bench.cli import main

    def broken(*a, **k):
        raise ValueError("a chart library bug")

    monkeypatch.setattr(reports.build, "build_report", broken)
    with_report = [x for x in S if x != "--no-report"]
    assert main(["sweep", "--out", str(tmp_path / "run"), "--variants", "naive", "--seq-lens", "16",
                 *with_report]) == 1
    err = capsys.readouterr().err
    assert "report could not be built" in err and "(ValueError: a chart library bug)" in err
    assert len(read_jsonl(tmp_path / "run" / "results.jsonl")) == 1


@pytest.mark.parametrize("argv, words, code_wanted", [
    (["sweep", "--timeout", "nan"], "--timeout takes a positive, finite number of seconds", 2),
    (["report", "--help"], "(default: runs/latest)", 0),
    (["compare", "--help"], "the reference run folder", 0)])
def test_numbers_and_help(capsys, argv, words, code_wanted):
    from bench.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # --help
        code = exc.code
    out = capsys.readouterr()
    assert words in out.out + out.err
    assert code == code_wanted


# -- how a worker starts: forked from the fork server, or spawned -----------------------------------------

ENV_PROBE = """
import os

import torch.nn.functional as F
from bench.registry import Prepared, variant

@variant("envprobe", description="reports its process and environment", devices=("cpu",), dtypes=("float32",),
         masks=("none",), backward=False)
def envprobe(case):
    return Prepared(F.scaled_dot_product_attention,
                    {"probe_var": os.environ.get("PROBE_VAR", "unset"), "worker_pid": os.getpid(),
                     "worker_ppid": os.getppid(), "teardown_cupti": os.environ.get("TEARDOWN_CUPTI", "unset")})
"""


def _probe(worker):
    from bench.model.case import Case

    rows = []
    tag, why = worker.run_group(["envprobe"], Case(batch=1, heads=1, kv_heads=1, q_len=8, kv_len=8, head_dim=8),
                                60.0, rows.append)
    assert tag == "done" and rows[0]["status"] == "ok", (tag, why, rows and rows[0]["reason"])
    return rows[0]["extra"]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_worker_takes_the_sweeps_environment_as_it_is_when_it_starts(tmp_path, monkeypatch, method):
    """Forked from the fork server (started with the first worker, under the environment of that
    moment) or spawned: a worker sees the sweep's environment as it is when the worker starts, and
    a worker started again after its first one died sees a fresh process."""
    from bench.engine import runner
    from bench.measure.settings import MeasureSettings

    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} on this platform")
    monkeypatch.setattr(runner, "start_method", lambda: method)
    plugin = write_plugin(tmp_path, "envprobe", ENV_PROBE)
    worker = runner.Worker(runner.WorkerSettings(MeasureSettings(budget_ms=5.0, rounds=1), plugins=[str(plugin)]))
    try:
        monkeypatch.setenv("PROBE_VAR", "first")
        first = _probe(worker)
        worker.kill()  # the next job starts a fresh worker
        monkeypatch.setenv("PROBE_VAR", "second")
        second = _probe(worker)
    finally:
        worker.stop()
    assert (first["probe_var"], second["probe_var"]) == ("first", "second")
    assert first["worker_pid"] != second["worker_pid"] and worker.restarts == 1
    assert first["teardown_cupti"] == second["teardown_cupti"] == "1"
    forked = first["worker_ppid"] != os.getpid()  # a fork server's child, not this process's
    assert forked == (method == "forkserver")
    assert second["worker_ppid"] == first["worker_ppid"]  # the same server, or this process, again


def test_workers_are_spawned_where_a_gpu_driver_is_present(tmp_path, monkeypatch):
    """A fork server imports torch before any worker exists; where a GPU may be used, workers are
    spawned instead, so that none inherits anything of CUDA's."""
    from bench.engine import runner

    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(runner, "GPU_DRIVER_FILES", (str(driver),))
    runner.start_method.cache_clear()
    try:
        assert runner.start_method() == "spawn"
        monkeypatch.setattr(runner, "GPU_DRIVER_FILES", (str(tmp_path / "absent"),))
        runner.start_method.cache_clear()
        assert runner.start_method() == ("forkserver" if sys.platform == "linux" else "spawn")
    finally:
        runner.start_method.cache_clear()


def test_only_the_fork_server_skips_its_interpreters_teardown():
    """The fork server leaves through os._exit (its teardown held a captured pipe of the sweep's
    output open ~1.5 s after the sweep exited); any other process importing the module keeps its
    ordinary exit: a sweep's own exit code and flushed output."""
    from bench.engine import forkserver

    assert not forkserver._in_fork_server()
    out = subprocess.run([sys.executable, "-c", "import bench.engine.forkserver, sys; print('flushed'); sys.exit(3)"],
                         cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert (out.returncode, out.stdout.strip()) == (3, "flushed")
    # a process run as ``python -c`` that has imported multiprocessing.forkserver (a test runner's worker) is
    # not the server: only the server's own command line is
    probe = ("import sys, multiprocessing.forkserver, bench.engine.forkserver as f; sys.argv = ['-c']; "
             "print(f._in_fork_server(), sys.orig_argv[-1].startswith(f.SERVER_COMMAND))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.stdout.split() == ["False", "False"], out.stderr
    as_server = f"{forkserver.SERVER_COMMAND}; import bench.engine.forkserver as f; print(f._in_fork_server())"
    server = subprocess.run([sys.executable, "-c", as_server], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert server.stdout.split() == ["True"], server.stderr  # and it leaves through os._exit(0)
    assert server.returncode == 0
