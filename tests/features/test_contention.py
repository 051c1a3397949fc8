"""Contention detection: the signs it reads, and a real sweep next to real busy loops."""

import subprocess
import sys
import time

import pytest

from bench.features.contention import contention
from bench.measure import cpuload
from tests.conftest import read_jsonl, run_cli


def test_samples_on_scheduler_quanta_are_caught_and_a_stable_kernel_is_not():
    on_quanta = [8.01, 12.02, 7.98, 12.0, 8.0, 16.03, 11.99, 8.02]  # 4 ms slices: 2, 3, 4 of them
    assert contention.quantum_ms(on_quanta) == 4.0
    stable = [12.01, 12.02, 11.99, 12.0, 12.01, 12.02]  # one tight cluster: a stable kernel
    assert contention.quantum_ms(stable) is None
    spread = [9.3, 10.7, 12.5, 9.9, 13.4, 11.1, 10.2, 12.8]  # noisy, but not on multiples
    assert contention.quantum_ms(spread) is None
    assert contention.quantum_ms([8.0, 12.0, 16.0]) is None  # too few samples to say


def test_verdict_leaves_free_cores_to_others():
    two_threads = contention.verdict(cpu_util=0.95, other_cpu=1.0, threads=2, cpu_count=2)
    assert two_threads["contended"] and "other processes used 1.00 cores" in two_threads["contended_why"]
    one_thread = contention.verdict(cpu_util=0.98, other_cpu=1.0, threads=1, cpu_count=2)
    assert not one_thread["contended"]  # the other process had the core we left free
    starved = contention.verdict(cpu_util=0.45, other_cpu=None, threads=2, cpu_count=2)
    assert starved["contended"] and "timed with 0.45 of its cores" in starved["contended_why"]
    # one thread waits in no parallel region: next to two loops (0.86 of a core) it is contended
    alone = contention.verdict(cpu_util=0.86, other_cpu=1.3, threads=1, cpu_count=2)
    assert alone["contended"] and "timed with 0.86 of its cores (cpu_util < 0.9)" in alone["contended_why"]
    assert not contention.verdict(cpu_util=0.99, other_cpu=1.0, threads=1, cpu_count=2)["contended"]
    quiet = contention.verdict(cpu_util=0.97, other_cpu=0.05, threads=2, cpu_count=2)
    assert quiet == {"cpu_util": 0.97, "other_cpu": 0.05, "quantum_ms": None, "contended": False,
                     "contended_why": ""}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_load_window_sees_a_real_busy_process():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        window = cpuload.LoadWindow().start()
        time.sleep(1.0)
        other = window.stop()
    finally:
        burner.kill()
        burner.wait()
    assert other is not None and other > 0.6  # about one core's worth


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sweep_next_to_two_busy_loops_is_flagged(tmp_path):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        proc = run_cli("sweep", "--out", tmp_path / "run", "--variants", "naive,sdpa.math", "--seq-lens", "64,128",
                       "--heads", "2", "--head-dims", "16", "--masks", "none", "--budget-ms", "30",
                       "--threads", "2", "--quiet", "--no-report")
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert proc.returncode == 0, proc.stderr
    ok = [r for r in read_jsonl(tmp_path / "run" / "results.jsonl") if r["status"] == "ok"]
    assert len(ok) == 4
    assert sum(r["contended"] for r in ok) >= 3
    assert all(r["threads"] == 2 and r["other_cpu"] is not None for r in ok)
    assert "CPU was shared" in proc.stderr and "--threads 1" in proc.stderr


def test_the_start_counts_other_processes_runnable_threads_not_only_what_they_got(monkeypatch):
    """At a sweep's start its own workers import beside it and take cores from the others: the
    others' use understates what they want, so their runnable threads count where higher.  The
    sweep's own tree is never counted: a child of this process spinning is not another's load.
    Fake /proc readings (2 CPUs, 100 ticks each over the window): the machine's busy ticks grow by
    150, this process's own by 20, its tree's (with a spinning child) by 100."""
    readings = {"machine": [(1000, 4000), (1150, 4200)], "own": [500, 520], "tree": [900, 1000]}
    at = {"end": False}

    def reader(name):
        return lambda *_args: readings[name][1 if at["end"] else 0]

    monkeypatch.setattr(cpuload, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(cpuload, "_machine_ticks", reader("machine"))
    monkeypatch.setattr(cpuload, "_own_ticks", reader("own"))
    monkeypatch.setattr(cpuload, "_tree_ticks", reader("tree"))
    plain, tree = cpuload.LoadWindow(tree=False).start(), cpuload.LoadWindow(tree=True).start()
    at["end"] = True  # the window's time has passed
    assert plain.stop() == pytest.approx(1.3)  # (150 - 20) busy ticks of others over 100 ticks of one CPU
    assert tree.stop() == pytest.approx(0.5)  # the spinning child is this tree's: (150 - 100) / 100

    def others(runnable):  # the start's probe, its window passing in the fake sleep
        at["end"] = False
        monkeypatch.setattr(cpuload.time, "sleep", lambda s: at.__setitem__("end", True))
        monkeypatch.setattr(cpuload, "_runnable_others", lambda: runnable)
        return cpuload.others_busy(window_s=0.05, tree=True)

    assert others(3) == pytest.approx(3.0)  # three threads of others wait to run while they got half a core
    assert others(40) == pytest.approx(8.0)  # counted up to 4 a core
    assert others(0) == pytest.approx(0.5)  # none waiting: what they used
