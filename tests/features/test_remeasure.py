"""A shaky number is re-measured, not only flagged: --retry shaky, the end-of-sweep
re-measurement, compare's Shaky count, the trust line's history, the crossover note, memory
drawn filled, --threads auto, and a projection that learns from earlier sweeps."""

import json
import shlex
import subprocess
import sys

import pandas as pd
import pytest

from bench.api import discover
from bench.cli import main
from bench.features.cost_model import plan
from bench.model.specbuild import build_spec, parse_values
from bench.runs import store
from reports.frames import tidy
from tests.conftest import read_jsonl, run_cli
from tests.support.runs import run_folder as _run_folder
from tests.support.runs import timed_rows as _timed_rows
from tests.support.text import count, numbers, value

SETTINGS = {"variants": ["naive"], "seq_lens": [16, 32], "heads": [2], "head_dims": [8], "masks": ["none"],
            "directions": ["fwd"], "budget_ms": 5, "device": "cpu", "dtypes": ["float32"], "batch": [1],
            "visits": 1}  # one visit: tests/engine/test_visits.py prices and measures the later ones


def _run_with_rows(path, flags=lambda n: {}):
    """A run folder of the small spec with a row per cell (each flagged by ``flags(n)``), as a sweep leaves it."""
    spec = build_spec(parse_values(SETTINGS), discover(entry_points=False))
    rows = [{"variant": "naive", **c.to_dict(), "status": "ok", "reason": "", "median_ms": 1.0, "noisy": False,
             "contended": False} | flags(c.q_len) for c in spec.cases()]
    return _run_folder(path, rows, env={"spec": spec.to_dict()})


def test_retry_shaky_on_a_clean_folder_measures_nothing_and_says_so(capsys, tmp_path):
    run = _run_with_rows(tmp_path / "run")
    before = (run / "results.jsonl").read_text()
    assert main(["sweep", "--resume", str(run), "--retry", "shaky"]) == 0
    out = capsys.readouterr()
    assert "no cell of" in out.out and "is shaky (by its newest row)" in out.out and "nothing to measure" in out.out
    assert (run / "results.jsonl").read_text() == before


def test_retry_shaky_plans_the_shaky_cells_only(capsys, tmp_path):
    run = _run_with_rows(tmp_path / "run", lambda n: {"contended": n == 32})
    assert main(["sweep", "--resume", str(run), "--retry", "shaky", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("1 cells in 1 cases")
    assert main(["sweep", "--resume", str(run), "--retry", "noisy", "--dry-run"]) == 0  # none is noisy
    assert "nothing to measure" in capsys.readouterr().out
    assert main(["sweep", "--resume", str(run), "--retry", "crash,contended", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("1 cells in 1 cases")


def test_bad_remeasure_and_retry_values_exit_2(capsys, tmp_path):
    run = _run_with_rows(tmp_path / "run")
    for argv, words in ((["sweep", "--remeasure", "-1"], "--remeasure takes a whole number from 0 to 10, got -1"),
                        (["sweep", "--retry", "wobbly", "--resume", str(run)],
                         "flags few_samples, noisy, contended, throttled, shaky")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1


def test_compare_counts_shaky_cells_apart_and_strict_trust_fails_on_them(capsys, tmp_path):
    a = _run_folder(tmp_path / "a", _timed_rows("naive", 1.0, 0.03))
    slow = [r | {"contended": True, "contended_why": "timed with 0.45 of its cores", "cpu_util": 0.45}
            for r in _timed_rows("naive", 2.0, 0.03)]
    b = _run_folder(tmp_path / "b", slow)
    # 2x slower at 0.45 of its cores: the load alone could explain up to 2.2x, so no cell is judged
    assert main(["compare", str(a), str(b), "--fail-on-regression", "5"]) == 4
    out = capsys.readouterr()
    assert [value(out.out, k) for k in ("Better", "Same", "Worse", "Unsure", "Shaky")] == [0, 0, 0, 0, 3]
    assert count(out.out, "matching cells") == 3
    (gate,) = [line for line in out.err.splitlines() if line.startswith("gate:")]
    assert numbers(gate)[:2] == [3, 3] and "exit 4" in gate and count(gate, "shaky within") == 3
    assert "trust A: trustworthy" in out.out and "trust B: read with care" in out.out
    assert "worst: naive at n=" in out.out and "timed with 0.45 of its cores" in out.out
    assert main(["compare", str(a), str(b), "--strict-trust"]) == 1
    err = capsys.readouterr().err
    (strict,) = [line for line in err.splitlines() if line.startswith("strict trust:")]
    assert count(strict, "matching cell(s)") == 3 and "shaky" in strict


def test_a_doubled_cell_timed_at_084_of_its_cores_fails_the_gate(capsys, tmp_path, calibrated):
    """Contended is not a pass: a cell timed at 0.84 of its cores cannot be 2x slower from its load alone."""
    calibrated({"device": "cpu"}, sigma=0.03)  # an A/A here measured 3% drift per run
    a = _run_folder(tmp_path / "a", _timed_rows("naive", 1.0, 0.03))
    slow = [r | {"contended": True, "contended_why": "timed with 0.84 of its cores", "cpu_util": 0.84}
            for r in _timed_rows("naive", 2.0, 0.03)]
    b = _run_folder(tmp_path / "b", slow)
    assert main(["compare", str(a), str(b), "--fail-on-regression", "10"]) == 1
    out = capsys.readouterr()
    assert value(out.out, "Worse") == 3 and value(out.out, "Shaky") == 0
    (said,) = [line for line in out.err.splitlines() if "cell(s) slower by more than" in line]
    assert numbers(said) == [3, 10] and "load" in said
    # the same doubling at 0.84 of its cores with no reading of the load at all bounds nothing: unjudged
    unread = [{k: v for k, v in r.items() if k != "cpu_util"} for r in slow]
    c = _run_folder(tmp_path / "c", unread)
    assert main(["compare", str(a), str(c), "--fail-on-regression", "10"]) == 4
    assert "exit 4" in capsys.readouterr().err


def test_the_trust_line_names_each_invocation_and_says_when_conditions_differ():
    from reports.trust import trust_line

    df = tidy(pd.DataFrame(_timed_rows("naive", 1.0, 0.03))).assign(run="r", peak_unreliable=False)
    one = {"run": "r", "history": [{"loadavg_start": [0.1], "loadavg_end": [0.2], "peaks_end": {"float32": 0.2}}]}
    assert "invocations" not in trust_line(df, [one])
    quiet_then_busy = {"run": "r", "history": one["history"] + [
        {"loadavg_start": [2.3], "loadavg_end": [2.1], "peaks_end": {"float32": 0.1}}]}
    line = trust_line(df, [quiet_then_busy])
    said = line[line.index("r: 2 invocations"):]
    assert numbers(said[:said.index(")")]) == [2, 1, 0.1, 0.2, 32, 0.2, 2, 2.3, 2.1, 32, 0.1]  # each one's load, peak
    assert "the folder mixes them" in line
    alike = {"run": "r", "history": one["history"] * 2}
    assert "2 invocations" in trust_line(df, [alike]) and "mixes" not in trust_line(df, [alike])


def test_crossovers_say_when_shaky_points_left_too_few_to_tell():
    from reports.scaling import crossover_note, crossovers

    rows = _timed_rows("naive", 1.0, 0.01) + _timed_rows("sdpa", 0.5, 0.01)
    clean = tidy(pd.DataFrame(rows))
    clean_note = crossover_note(clean, crossovers(clean))
    assert "overtakes" in clean_note and "shaky" not in clean_note and not numbers(clean_note)
    shaky = tidy(pd.DataFrame([r | {"contended": True} for r in rows]))
    note = crossover_note(shaky, crossovers(shaky))
    assert "Not enough clean points" in note and count(note, "shaky") == 6


def test_memory_points_are_drawn_filled_whatever_the_timing_flags(tmp_path, monkeypatch):
    import reports.charts as charts

    rows = [r | {"contended": True, "peak_mem_bytes": 2**20 * r["q_len"]} for r in _timed_rows("naive", 1, 0.01)]
    df = tidy(pd.DataFrame(rows))
    faces = {}

    def keep(fig, out):
        faces[out.name] = [line.get_markerfacecolor() for ax in fig.axes for line in ax.get_lines()
                           if line.get_marker() not in (None, "None", "")]
        return []

    monkeypatch.setattr(charts, "save_figure", keep)
    style = charts.variant_style(["naive"], None)
    charts.chart(df, "mem_mib", "MiB", "memory", style, None, tmp_path / "memory")
    charts.chart(df, "median_ms", "ms", "time", style, None, tmp_path / "time")
    assert faces["memory"] and "white" not in faces["memory"]  # counted in a pass of its own: never hollow
    assert "white" in faces["time"]  # the same cells' times are shaky: hollow


def test_threads_auto_takes_the_free_cores_when_others_load_the_machine(monkeypatch):
    from bench.measure import cpuload

    spec = build_spec(parse_values(SETTINGS), discover(entry_points=False))
    assert spec.threads is None  # auto is the default
    monkeypatch.setattr(cpuload, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(cpuload, "free_cores", lambda window_s=0.5: 0.7)
    n, note = cpuload.auto_threads(spec)
    assert n == 1 and "using 1.3 of the 2 cores" in note and "--threads 1" in note
    monkeypatch.setattr(cpuload, "free_cores", lambda window_s=0.5: 1.9)
    assert cpuload.auto_threads(spec) == (None, "")  # quiet: one thread per core
    assert cpuload.auto_threads(spec.replace(threads=2)) == (None, "")  # a count given is kept
    monkeypatch.setattr(cpuload, "free_cores", lambda window_s=0.5: pytest.fail("probed twice"))
    assert cpuload.auto_threads(spec, others=1.3)[0] == 1  # the plan's probe, taken as it is: not probed again
    assert cpuload.auto_threads(spec, others=0.1) == (None, "")


def test_the_projection_learns_from_what_earlier_sweeps_took(tmp_path, registry):
    spec = build_spec(parse_values(SETTINGS), registry)
    cells = [("naive", c) for c in spec.cases()]
    plain = plan.project(cells, registry, spec, history=plan.History.empty(), report=False)
    quiet = {"others_cores_start": 0.1, "contended_share": 0.0, "model": plan.MODEL}
    _run_folder(tmp_path / "runs" / "earlier", _timed_rows("other", 1.0, 0.01),
                env={"history": [{"spec": {"device": "cpu"}, "model_rest_s": 10.0, "measured_rest_s": 30.0} | quiet,
                                 # an older model's times: its error is not this one's
                                 {"spec": {"device": "cpu"}, "model_rest_s": 10.0, "measured_rest_s": 72.4}
                                 | quiet | {"model": plan.MODEL - 1},
                                 {"spec": {"device": "cuda"}, "model_rest_s": 10.0, "measured_rest_s": 1.0} | quiet,
                                 # not learnt from: a busy start, mostly contended cells, or a load not recorded
                                 {"spec": {"device": "cpu"}, "model_rest_s": 10.0, "measured_rest_s": 72.4,
                                  "others_cores_start": 1.8, "contended_share": 0.0},
                                 {"spec": {"device": "cpu"}, "model_rest_s": 10.0, "measured_rest_s": 72.4,
                                  "others_cores_start": 0.0, "contended_share": 0.7},
                                 {"spec": {"device": "cpu"}, "model_rest_s": 10.0, "measured_rest_s": 72.4}]})
    history = plan.load_history(tmp_path / "runs", "cpu")
    assert history.wall_factor == pytest.approx(3.0) and history.factor_runs == 1  # clean cpu sweeps of this model
    learnt = plan.project(cells, registry, spec, history=history, report=False)
    setup = sum(g.setup_s for g in plan.groups(cells, registry, spec.budget_ms))
    assert learnt.cells_s == pytest.approx(setup + 3 * (plain.cells_s - setup))  # setups are not scaled
    assert learnt.model_rest_s == pytest.approx(plain.model_rest_s)  # what a sweep is compared with
    assert "x3.00 learnt from 1 earlier sweep(s)" in learnt.lines()[0]


def test_a_busy_start_scales_the_projection_and_says_so(registry, monkeypatch):
    """Two cores, other processes using 1.8 of them: --threads auto takes 1 thread, which gets
    2 x 1 / (1 + 1.8) of a core (1.4x slower); its
    threads and the others' are 0.8 beyond the cores, so 0.8 of its cells are expected contended
    and timed again, with the end-of-sweep pass's one look at the load (its one thread has no
    core of its own)."""
    from bench.features.contention.remeasure import QUIET_LOOK_S
    from bench.measure import cpuload

    monkeypatch.setattr(cpuload, "usable_cpus", lambda: [0, 1])
    spec = build_spec(parse_values(SETTINGS | {"remeasure": 1}), registry)
    cells = [("naive", c) for c in spec.cases()]
    quiet = plan.project(cells, registry, spec, history=plan.History.empty(), report=False, others=0.2)
    loaded = plan.project(cells, registry, spec, history=plan.History.empty(), report=False, others=1.8)
    assert quiet.busy is None and not any("busy" in line for line in quiet.lines())
    assert loaded.busy.threads == 1 and loaded.busy.slowdown == pytest.approx(1 / (2 / 2.8))
    assert loaded.busy.contended_share == pytest.approx(0.8) and loaded.busy.waits_for_quiet
    assert loaded.remeasure_s == pytest.approx(QUIET_LOOK_S + 0.8 * quiet.per_worker_s[0])
    cells_s = loaded.busy.slowdown * quiet.per_worker_s[0]
    assert loaded.wall_s == pytest.approx(quiet.fixed_s + cells_s + loaded.remeasure_s)
    assert loaded.model_rest_s == pytest.approx(quiet.model_rest_s)  # what the sweep is later compared with
    said = " ".join(loaded.lines())
    assert "busy machine" in said and count(said, "of the 2 cores") == 1.8 and "1.4x slower" in said
    assert "1 thread(s) per worker" in said and "assuming the load stays" in said
    assert loaded.busy.fewer_threads == 2.0  # auto runs 1 thread where a quiet machine gives it 2
    naive = registry["naive"]
    short, long_ = spec.cases()[0], spec.cases()[0].replace(q_len=4096, kv_len=4096, heads=16, head_dim=128)
    assert plan.cell_cost_s(naive, short, 1000.0, fewer_threads=2.0) == plan.cell_cost_s(naive, short, 1000.0)
    call_s = plan.work_flops(naive, long_) / plan.default_rate(naive, "cpu")
    assert call_s >= max(plan.PARALLEL_CALL_S, plan.DEFAULT_CEILING_MS / 1e3 / plan.DEFAULT_ROUNDS)  # 1 call a round
    assert plan.cell_cost_s(naive, long_, 1000.0, fewer_threads=2.0) - plan.cell_cost_s(naive, long_, 1000.0) \
        == pytest.approx(5 * call_s)  # its check, memory pass and 3 timed calls, each twice as long
    # one thread of its own beside one busy core: a free core each, nothing to wait for, nothing re-measured
    own = plan.project(cells, registry, spec.replace(threads=1), history=plan.History.empty(), report=False,
                       others=1.0)
    assert own.busy.slowdown == 1.0 and own.remeasure_s == 0.0
    # two workers of one thread beside one busy core: 2 x 2 / 3 of the cores for their 2 threads, one of
    # three threads without a core (half the sweep's cells contended), and a free core for each worker's
    # thread once the others are counted against the sweep's cores: no long wait
    two = plan.busy(1.0, 2, 1, workers=2)
    assert two.threads == 1 and two.slowdown == pytest.approx(1.5)
    assert two.contended_share == pytest.approx(0.5) and not two.waits_for_quiet


def test_the_plan_line_of_a_sweep_started_beside_a_busy_process(monkeypatch, capsys):
    """The CLI measures the others' load before it projects (its own workers, importing, are not
    others) and prints the busy projection; env.json's history keeps the load for the next plans."""
    from bench.measure import cpuload

    seen = []
    monkeypatch.setattr(cpuload, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(cpuload, "others_busy", lambda window_s=0.25, tree=False: seen.append(tree) or 1.6)
    assert main(["sweep", "--variants", "naive", "--seq-lens", "16", "--heads", "2", "--head-dims", "8",
                 "--masks", "none", "--directions", "fwd", "--device", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert seen == [True]
    assert "busy machine" in out and count(out, "of the 2 cores") == 1.6 and "assuming the load stays" in out


def test_a_compiled_variants_setup_is_cold_for_a_new_case_and_cached_for_one_set_up_before(tmp_path, registry):
    """The first folder compiled its cases from nothing; a later one found them in the compiler's
    cache.  A case either set up comes from the cache (what the later folder took), a new one is
    cold, whatever the history took (a first run cannot tell a cold compile from a cached one)."""
    import os

    from bench.model.case import Case

    cold = [r | {"setup_ms": 9000.0} for r in _timed_rows("flex", 1.0, 0.01)]  # the first run: compiles from nothing
    warm = [r | {"setup_ms": 600.0} for r in _timed_rows("flex", 1.0, 0.01)]
    os.utime(_run_folder(tmp_path / "runs" / "a", cold), (1, 1))  # the older folder
    _run_folder(tmp_path / "runs" / "b", warm)
    flex = registry["flex"]
    history = plan.load_history(tmp_path / "runs", "cpu")
    done = Case.from_dict(cold[0])
    assert history.warm_s[("flex", "cpu")] == pytest.approx(0.6)
    assert plan.cell_setup_s(flex, done, history) == pytest.approx(0.6)
    assert plan.cell_setup_s(flex, done.replace(q_len=4096, kv_len=4096), history) == plan.COMPILE_COLD_S["cpu"]
    only_cold = plan.load_history(tmp_path / "runs", "cpu", limit=1)  # the newest folder alone: nothing set up before
    assert not only_cold.warm_s and plan.cell_setup_s(flex, done, only_cold) == plan.COMPILE_S["cpu"]
    # a case its probe refused here is not priced again, until a later run measures it
    refused = [r | {"direction": "fwd+bwd", "status": "unsupported", "reason": "no backward on CPU"} for r in cold]
    os.utime(_run_folder(tmp_path / "runs" / "c", refused), (2, 2))
    key = ("flex", plan.case_key(done.replace(direction="fwd+bwd").to_dict()))
    assert key in plan.load_history(tmp_path / "runs", "cpu").unsupported
    _run_folder(tmp_path / "runs" / "d", [r | {"status": "ok"} for r in refused])
    assert key not in plan.load_history(tmp_path / "runs", "cpu").unsupported


@pytest.mark.slow
def test_a_sweep_re_measures_its_contended_cells_at_its_end(tmp_path, monkeypatch):
    """Busy loops on every core while the cells are timed; stopped just before the end-of-sweep
    pass: the worker times its contended cases again in place at the end of its pass (the loops
    still running), then the cells still contended are measured again whole, and every row stays."""
    from bench.engine import sweep
    from bench.features.contention import remeasure
    from bench.measure.cpuload import usable_cpus

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in usable_cpus()]

    def stop_loops_then_wait(threads, *a, **k):  # the load is gone: the look finds it so
        for p in loops:
            p.kill()
            p.wait()
        return True, 0.0

    monkeypatch.setattr(remeasure, "wait_for_quiet", stop_loops_then_wait)
    try:
        spec = build_spec(parse_values(SETTINGS | {"seq_lens": [64, 128], "threads": 2}), discover())
        summary = sweep.run_sweep(spec, tmp_path / "run", sweep.SweepOptions(progress=False))
    finally:
        for p in loops:
            p.kill()
    rows = store.read_rows(tmp_path / "run")
    first = rows[:2]
    assert any(r["contended"] for r in first), "two busy loops per core left the cells uncontended"
    contended = {(r["variant"], r["q_len"]) for r in first if r["contended"]}
    in_pass = []
    for r in rows[2:]:  # right after the first rows: the worker's re-timing of what it held
        if not r.get("retimed"):
            break
        in_pass.append(r)
    assert {(r["variant"], r["q_len"]) for r in in_pass} == contended  # each held case, at the end of the pass
    assert all(r["retimed"].startswith("in place; its first timing: ") for r in in_pass)
    still = {(r["variant"], r["q_len"]) for r in in_pass if r["contended"]}
    whole = [r for r in rows[2 + len(in_pass):] if not r.get("retimed")]  # the end pass's (and its own re-timing)
    assert {(r["variant"], r["q_len"]) for r in whole} == still  # whole, once the loops were gone
    assert summary.remeasured[0].startswith(f"re-timed {len(in_pass)} cell(s) of contended cases in place")
    if whole:
        assert summary.remeasured[1].startswith(f"re-measured {len(whole)} contended cell(s)")
    history = json.loads((tmp_path / "run" / "env.json").read_text())["history"][-1]
    assert history["cells_wall_s"] > 0 and history["loadavg_start"] and history["peaks_end"]["float32"] > 0
    assert history["measured_rest_s"] <= history["cells_wall_s"]
    assert history["contended_share"] > plan.CLEAN_SHARE and not plan.clean(history)  # the next plans ignore it


def test_the_end_pass_does_not_wait_for_a_load_that_stays_and_says_so(tmp_path, monkeypatch):
    """Cells still contended at the end and a load that has not dropped: one look, no idle wait, no
    re-measurement, and a note that says why; what the workers re-timed in place is said first."""
    from bench.features.contention import remeasure

    spec = build_spec(parse_values(SETTINGS | {"remeasure": 2}), discover())
    cells = [("naive", c) for c in spec.cases()]
    looks, measured = [], []
    monkeypatch.setattr(remeasure, "wait_for_quiet", lambda threads, **k: looks.append(k) or (False, 0.5))
    monkeypatch.setattr(remeasure.store, "read_current",
                        lambda run_dir: [{"variant": "naive", **c.to_dict(), "status": "ok", "contended": True,
                                          "contended_why": "x"} for _, c in cells])
    notes, timed = remeasure.remeasure(cells, tmp_path, spec, 2, lambda cs: measured.append(cs) or 1.0, (3, 1))
    assert measured == [] and timed == 0.0 and looks == [{"limit_s": 0.0, "step_s": remeasure.QUIET_LOOK_S}]
    assert notes[0].startswith("re-timed") and count(notes[0], "cell(s)") == 3
    assert (count(notes[0], "now clean"), count(notes[0], "not")) == (1, 2)
    assert count(notes[1], "contended cell(s)") == len(cells) and "not measured again" in notes[1]


def _plain_run(path):
    """A run folder as an ordinary sweep leaves it: its spec in env.json, two cells of four measured."""
    spec = build_spec(parse_values({"variants": ["naive", "sdpa"], "seq_lens": [32, 48], "heads": [2],
                                    "head_dims": [8], "masks": ["causal"], "directions": ["fwd"],
                                    "budget_ms": 5.0, "device": "cpu"}), discover())
    rows = [r | {"variant": v, "q_len": n, "kv_len": n, "heads": 2, "kv_heads": 2, "head_dim": 8, "mask": "causal",
                 "budget_ms": 5.0, "threads": 1, "precision": 0.02}
            for v, n, r in (("naive", 32, _timed_rows("naive", 1.0, 0.01)[0]),
                            ("sdpa", 32, _timed_rows("sdpa", 1.0, 0.01)[0] | {"few_samples": True}))]
    return _run_folder(path, rows, env={"spec": spec.to_dict(), "sweep_id": "sweep-cpu-plain"})


def test_status_answers_for_an_ordinary_run_and_by_its_sweep_id(capsys, tmp_path, monkeypatch):
    run = _plain_run(tmp_path / "runs" / "r1")
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "2 of 4 cells measured: ok 2" in out and count(out, "with too few samples") == 1
    assert f"the rest: python -m bench sweep --resume {run}" in out
    monkeypatch.chdir(tmp_path)  # runs/ is here: the sweep id finds the folder
    assert main(["status", "sweep-cpu-plain"]) == 0 and "2 of 4 cells measured" in capsys.readouterr().out
    assert main(["status", "sweep-nothing"]) == 2
    assert "no run or sweep 'sweep-nothing'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_cell_can_be_measured_alone_again_from_its_row(capsys, tmp_path):
    run = _plain_run(tmp_path / "r1")
    assert main(["status", str(run), "--cells"]) == 0
    listing = capsys.readouterr().out
    assert "naive float32 b=1 h=2/2 n=32 d=8 causal fwd" in listing
    assert main(["status", str(run), "--repro", "sdpa n=32"]) == 0
    command = capsys.readouterr().out.strip()
    assert command.startswith("python -m bench sweep --variants sdpa --device cpu --dtypes float32")
    assert "--seq-lens 32" in command and "--budget-ms 5" in command and "--threads 1" in command
    assert main(["status", str(run), "--repro", "n=32"]) == 2  # two cells match: it says so
    assert "2 cells match" in capsys.readouterr().err
    argv = shlex.split(command.replace("runs/repro-", str(tmp_path / "repro-")))[3:]
    proc = run_cli(*argv, "--no-report", "--quiet")
    assert proc.returncode == 0, proc.stderr
    (row,) = read_jsonl(next(tmp_path.glob("repro-*")) / "results.jsonl")
    assert (row["variant"], row["q_len"], row["mask"], row["budget_ms"], row["status"]) == ("sdpa", 32, "causal", 5.0,
                                                                                            "ok")


def test_the_merge_command_status_suggests_names_a_free_folder(tmp_path, capsys, monkeypatch):
    from bench.cli import status

    sweep = tmp_path / "sweep"
    (sweep / "merged").mkdir(parents=True)
    (sweep / "merged" / "results.jsonl").write_text("")
    monkeypatch.setattr("bench.features.shards.jobs.read_sweep", lambda folder: {"sweep_id": "s", "executor": "local",
                                                                        "submitted": "now"})
    monkeypatch.setattr("bench.features.shards.jobs.job_states", lambda record: [
        {"shard": "1/1", "job_id": "1", "state": "DONE", "cells_done": 2, "cells": 2, "folder": "f1"}])
    assert status._jobs(sweep) == 0
    assert f"--out {sweep / 'merged-2'}" in capsys.readouterr().out
