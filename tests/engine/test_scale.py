"""Scaling out: workers side by side, shards of a spec, merge, submitit's local executor, the plan."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cli import main
from bench.engine.placement import Slot, parse_gpus, place
from bench.errors import UsageError
from bench.features.cost_model import plan
from tests.conftest import ROOT, read_jsonl, run_cli, write_plugin
from tests.support.text import count

SMALL = ["--seq-lens", "32,64", "--heads", "2", "--head-dims", "16", "--masks", "none,causal", "--budget-ms", "5",
         "--threads", "1", "--quiet", "--device", "cpu", "--remeasure", "0", "--visits", "1"]


# --- placement: pure logic, tested without GPUs -----------------------------------------------

def test_each_gpu_worker_sees_only_its_own_gpu():
    slots = place("cuda", None, parse_gpus("0,1,3", visible=4), [], None)
    assert [s.label for s in slots] == ["cuda:0", "cuda:1", "cuda:3"]
    assert [s.env for s in slots] == [{"CUDA_VISIBLE_DEVICES": g, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
                                      for g in ("0", "1", "3")]
    assert place("cuda", 2, None, [], None)[1].env["CUDA_VISIBLE_DEVICES"] == "1"  # --workers 2: the first two
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in place("cuda", None, parse_gpus("all", 2), [], None)] == ["0", "1"]
    assert place("cuda", None, None, [], None) == [Slot("cuda")]  # one worker, nothing pinned
    for text, visible, words in [("0,0", 2, "distinct"), ("x", 2, "all or distinct"), ("2", 2, "GPU 2 does not exist"),
                                 ("all", 0, "no GPU is visible")]:
        with pytest.raises(UsageError, match=words):
            parse_gpus(text, visible)
    with pytest.raises(UsageError, match="one worker per GPU"):
        place("cuda", 3, [0, 1], [], None)


def test_the_plan_counts_the_reference_on_the_cpu_over_the_slice_it_checks():
    from bench.case import Case
    from bench.measure.flops import flops

    big = Case("cuda", "bfloat16", 4, 16, 16, 16384, 16384, 128, "none", None, "fwd")  # checked on a slice
    share = 2 / 4 * 1 / 16  # the first and last batch element, one query head per KV head group of 1
    want = plan.GROUP_OVERHEAD_S + share * flops(big) / plan.REFERENCE_RATE  # float64 on the CPU, GPU or not
    assert plan.group_cost_s([], big, 100.0) == pytest.approx(want)
    small = Case("cuda", "bfloat16", 1, 2, 2, 256, 256, 64, "none", None, "fwd")
    assert plan.group_cost_s([], small, 100.0) == pytest.approx(plan.GROUP_OVERHEAD_S + flops(small) / 1e10)


def test_gpu_workers_inherit_the_gpus_a_scheduler_gave_this_process():
    from bench.engine.placement import visible_ids

    limited = visible_ids({"CUDA_VISIBLE_DEVICES": "4,5"})  # a Slurm job given GPUs 4 and 5
    assert limited == ["4", "5"] and visible_ids({}) is None
    slots = place("cuda", None, parse_gpus("all", len(limited)), [], None, limited)
    assert [s.label for s in slots] == ["cuda:0", "cuda:1"]  # this process's numbers
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["4", "5"]  # the GPUs it was given
    uuids = ["GPU-3f1c", "GPU-9a2e"]
    assert place("cuda", 2, None, [], None, uuids)[1].env["CUDA_VISIBLE_DEVICES"] == "GPU-9a2e"


def test_local_executor_shards_beyond_the_gpus_are_refused(monkeypatch, tmp_path):
    pytest.importorskip("submitit")
    from bench.features.shards import jobs
    from bench.model.spec import Spec

    monkeypatch.setattr(jobs, "_local_gpus", lambda spec: [0, 1])
    spec = Spec(variants=["naive"], seq_lens=[64], heads=[2], head_dims=[16], batch=[1], dtypes=["bfloat16"],
                masks=["none"], window=[64], directions=["fwd"], device="cuda", executor="local", shards=3)
    with pytest.raises(UsageError, match="--shards 3: this machine has 2 GPU"):
        jobs.submit(spec, tmp_path / "sweep", 3, 60.0)
    assert not (tmp_path / "sweep").exists()  # refused before anything is written


def test_cpu_workers_get_disjoint_cores_and_threads_to_match():
    slots = place("cpu", 3, None, list(range(8)), None)
    assert [s.cpus for s in slots] == [(0, 1, 2), (3, 4, 5), (6, 7)]  # every core once, none shared
    assert [s.threads for s in slots] == [3, 3, 2] and [s.label for s in slots] == ["cpu:0-2", "cpu:3-5", "cpu:6-7"]
    assert [s.threads for s in place("cpu", 2, None, [4, 5, 6, 7], 1)] == [1, 1]  # --threads 1: fewer than its cores
    assert place("cpu", None, None, [0, 1], 2) == [Slot("cpu", threads=2)]
    with pytest.raises(UsageError, match="each worker needs one of its own"):
        place("cpu", 3, None, [0, 1], None)
    with pytest.raises(UsageError, match="each worker has 1 core"):
        place("cpu", 2, None, [0, 1], 2)
    with pytest.raises(UsageError, match="--gpus places workers on GPUs"):
        place("cpu", None, [0], [0, 1], None)


# --- shards and the plan ------------------------------------------------------------------

def _cells(registry, preset="default", device="cpu"):
    from bench.model.specbuild import build_spec

    spec = build_spec({"preset": preset, "device": device}, registry)
    return spec, [(n, c) for c in spec.cases() for n in spec.variants]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_cover_every_cell_once_keep_cases_whole_and_balance_the_cost(registry, n):
    spec, cells = _cells(registry)
    shards = [plan.shard_cells(cells, registry, spec.budget_ms, (i, n)) for i in range(1, n + 1)]
    flat = [c for s in shards for c in s]
    assert sorted(map(str, flat)) == sorted(map(str, cells)) and len(flat) == len(set(flat))  # each cell once
    for s in shards:  # all the variants of a case in one shard
        cases = {c for _, c in s}
        assert all(c not in {c2 for _, c2 in other} for other in shards if other is not s for c in cases)
    assert shards == [plan.shard_cells(cells, registry, spec.budget_ms, (i, n)) for i in range(1, n + 1)]
    groups = plan.groups(cells, registry, spec.budget_ms)
    loads = [sum(g.cost_s for g in b) for b in plan.split(groups, n)]
    assert max(loads) <= sum(loads) / n + max(g.cost_s for g in groups) + 1e-9  # LPT's bound
    if n > 1:  # by cost, not by count: the long cases are spread, so counts differ
        counts = [len({c for _, c in s}) for s in shards]
        assert max(loads) < 1.5 * min(loads) or len(set(counts)) > 1


def test_the_plan_counts_compiles_cold_or_cached_and_the_budget(registry):
    from bench.model.case import Case

    case = Case(q_len=256, kv_len=256, heads=4, kv_heads=4, head_dim=64)
    naive, flex = registry["naive"], registry["flex"]
    assert plan.cell_setup_s(naive, case) == plan.SETUP_S
    assert plan.cell_setup_s(flex, case) == plan.COMPILE_COLD_S["cpu"]  # never compiled here: from nothing
    cached = plan.History({}, {}, seen=frozenset({("flex", plan.case_key(case.to_dict()))}))
    assert plan.cell_setup_s(flex, case, cached) == plan.COMPILE_S["cpu"]  # the compiler's cache has it
    warm = plan.History({("flex", "cpu"): 9.0}, {}, seen=cached.seen, warm_s={("flex", "cpu"): 0.3})
    assert plan.cell_setup_s(flex, case, warm) == 0.3  # what a case set up before took here
    assert plan.cell_setup_s(flex, case.replace(q_len=512, kv_len=512), warm) == plan.COMPILE_COLD_S["cpu"]
    refused = plan.History({}, {}, unsupported=frozenset({("flex", plan.case_key(case.to_dict()))}))
    both = [("naive", case), ("flex", case)]  # flex's probe refused this case in an earlier run here: not timed
    assert plan.groups(both, registry, 100)[0].cost_s - plan.groups(both, registry, 100, refused)[0].cost_s == \
        pytest.approx(plan.cell_cost_s(flex, case, 100))
    big = case.replace(q_len=8192, kv_len=8192)  # a call beyond the budget: a few calls, whatever the budget
    rate = plan.default_rate(naive, "cpu")
    assert rate == plan.DEFAULT_RATE["cpu"] * naive.traits.rate("cpu")  # the share naive declares
    assert plan.cell_cost_s(naive, big, 1) >= plan.MIN_CALLS * 4 * 8192 ** 2 * 64 * 4 / rate
    history = plan.History({("naive", "cpu"): 2.0}, {("naive", "cpu", "float32", "fwd"): 1e12})  # earlier runs
    call = 4 * 256 ** 2 * 64 * 4 / 1e12  # its FLOPs at the measured rate
    assert plan.cell_cost_s(naive, case, 100, history) == pytest.approx(2.0 + 2 * call + plan.SAMPLES_WANTED * call)


def test_a_call_is_priced_by_the_pairs_its_variant_computes(registry):
    """A variant that computes every pair pays for the pairs a window drops; one that skips them
    does not; SDPA's kernels skip a causal mask's upper triangle only; an approximation costs about
    what exact attention over APPROX_KEYS keys does."""
    from bench.measure.flops import flops
    from bench.model.case import Case

    dense = Case(q_len=2048, kv_len=2048, heads=4, kv_heads=4, head_dim=64)
    window, causal = dense.replace(mask="window", window=128), dense.replace(mask="causal")
    assert flops(window) < flops(dense) / 8  # the window keeps under an eighth of the pairs
    for name in ("naive", "sdpa.math", "chunked.online"):
        assert plan.work_flops(registry[name], window) == pytest.approx(flops(dense))
    for name in ("flex", "window.chunked"):
        assert plan.work_flops(registry[name], window) == pytest.approx(flops(window))
    assert plan.work_flops(registry["sdpa"], causal) == pytest.approx(flops(causal))
    assert plan.work_flops(registry["sdpa"], window) == pytest.approx(flops(dense))
    assert plan.work_flops(registry["linear.elu"], dense) == pytest.approx(flops(dense) * plan.APPROX_KEYS / 2048)
    from bench.model.registry import Variant

    plugin = Variant("a.plugin", lambda case: None, "declares nothing")
    assert plan.work_flops(plugin, window) == pytest.approx(flops(dense))  # not declared: every pair
    assert plan.default_rate(plugin, "cpu") == plan.DEFAULT_RATE["cpu"]
    # the history's rates are of the same work: a naive row on the window teaches its dense rate
    row = {"variant": "naive", "mask": "window", "flops": flops(window), "density": flops(window) / flops(dense),
           "kv_len": 2048}
    assert plan._row_work(row, registry) == pytest.approx(flops(dense))
    assert plan._row_work(row | {"variant": "flex"}, registry) == pytest.approx(flops(window))
    assert plan._row_work(row | {"variant": "linear.elu", "mask": "none", "density": 1.0, "flops": flops(dense)},
                          registry) == pytest.approx(flops(dense) * plan.APPROX_KEYS / 2048)


def test_the_timing_takes_the_calls_the_timer_takes():
    """bench.measure.timing.interleave: each round takes its share of the budget, or the calls
    the rounds need for an interval (2 a round of 3) while its share of the ceiling lasts; a
    short call stops at its precision."""
    budget, ceiling = 300.0, 2000.0  # 0.1 s a round, 0.667 s of ceiling a round
    assert plan.timing_s(0.5, budget, 3, ceiling) == pytest.approx(3 * 2 * 0.5)  # 2 calls a round
    assert plan.timing_s(0.9, budget, 3, ceiling) == pytest.approx(3 * 1 * 0.9)  # past the ceiling: 1 a round
    assert plan.timing_s(0.04, budget, 3, ceiling) == pytest.approx(3 * 3 * 0.04)  # the budget's 3 a round
    assert plan.timing_s(1e-4, budget, 3, ceiling) == pytest.approx(plan.SAMPLES_WANTED * 1e-4)  # at its precision
    assert plan.timing_s(1e-6, budget, 3, ceiling) == plan.MIN_TIMING_S
    assert plan.timing_s(0.0, budget, 3, ceiling) == plan.MIN_TIMING_S  # a case of no work (nothing kept)
    assert plan.timing_s(0.5, budget, 3, 300.0) == pytest.approx(3 * 1 * 0.5)  # no ceiling past the budget


@pytest.mark.parametrize("argv, words", [
    (["--shard", "0/3"], "--shard takes i/N with 1 <= i <= N"),
    (["--shard", "4/3"], "--shard takes i/N with 1 <= i <= N"),
    (["--shards", "2"], "--shards N submits N jobs: give it with --executor"),
    (["--executor", "local", "--shard", "1/2"], "give --shards N, not --shard i/N"),
    (["--slurm-partition", "gpu"], "--slurm-partition is a setting of --executor slurm"),
    (["--executor", "pbs"], "unknown executor 'pbs'; valid: local, slurm"),
    (["--workers", "0"], "--workers takes a whole number from 1 to 1024, got 0"),
    (["--gpus", "0,x"], "--gpus takes all or GPU indices"),
    (["--gpus", "0"], "--gpus places workers on GPUs"),
])
def test_bad_scale_settings_exit_2_with_one_line(capsys, argv, words):
    assert main(["sweep", "--device", "cpu", "--variants", "naive", "--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_without_submitit_the_executor_says_what_to_install(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit now raises ImportError
    assert main(["sweep", "--device", "cpu", "--variants", "naive", "--executor", "slurm", "--shards", "2"]) == 2
    assert "pip install -e '.[slurm]'" in capsys.readouterr().err


def test_slurm_without_sbatch_is_refused_before_anything_is_written(capsys, tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on it
    assert main(["sweep", "--device", "cpu", "--variants", "naive", "--seq-lens", "16", "--executor", "slurm",
                 "--shards", "2", "--out", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err
    assert "no Slurm here" in err and "sbatch" in err and "--executor local" in err
    assert not (tmp_path / "sweep").exists()


def test_dry_run_prints_the_projection_and_writes_nothing(capsys, tmp_path, monkeypatch):
    from bench.engine import runner

    monkeypatch.chdir(tmp_path)
    launched = []
    monkeypatch.setattr(runner, "_launch", lambda *a: launched.append(a) or (_ for _ in ()).throw(OSError("none")))
    assert main(["sweep", "--preset", "quick", "--device", "cpu", "--workers", "2", "--threads", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    (plan,) = [line for line in out.splitlines() if "cells in" in line and "cases" in line]
    assert (count(plan, "cells in"), count(plan, "cases"), count(plan, "more cannot run here")) == (152, 16, 56), plan
    assert "(most: xformers: device cpu not supported)" in plan
    assert re.search(r"^per worker: 0: .+, 1: .+$", out, re.M) and "projected wall time:" in out
    assert main(["sweep", "--preset", "quick", "--device", "cpu", "--executor", "local", "--shards", "3",
                 "--dry-run"]) == 0
    assert re.search(r"^per shard: 1: .+, 2: .+, 3: .+$", capsys.readouterr().out, re.M)
    assert not (tmp_path / "runs").exists()  # a dry run makes no folder
    assert launched == []  # and starts no worker
    assert main(["sweep", "--device", "cpu", "--seq-lens", "64,abc"]) == 2  # nor does a value no setting takes
    assert "--seq-lens takes positive integers" in capsys.readouterr().err and launched == []


# --- end to end -----------------------------------------------------------------------------

def _keys(rows):
    return [(r["variant"], r["q_len"], r["mask"], r["direction"]) for r in rows]


@pytest.mark.slow
def test_two_workers_write_every_cell_once_and_a_crash_restarts_only_its_worker(tmp_path):
    plugin = write_plugin(tmp_path, "crashy", """
        import os
        import torch.nn.functional as F
        from bench.registry import variant

        @variant("crashy", masks=("none", "causal"), description="dies on n=64 causal")
        def crashy(case):
            if case.q_len == 64 and case.mask == "causal":
                os._exit(7)
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case.mask == "causal")
    """)
    proc = run_cli("sweep", "--plugin", plugin, "--variants", "naive,sdpa,crashy", "--workers", "2", *SMALL,
                   "--out", tmp_path / "run", "--no-report")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(tmp_path / "run" / "results.jsonl")
    assert len(rows) == 12 and len(set(_keys(rows))) == 12  # 3 variants x 2 lengths x 2 masks, each once
    assert {r["worker"] for r in rows} == {"cpu:0", "cpu:1"}
    crashed = [r for r in rows if r["status"] == "crash"]
    assert [(r["variant"], r["q_len"], r["mask"]) for r in crashed] == [("crashy", 64, "causal")]
    assert all(r["status"] == "ok" for r in rows if r["variant"] != "crashy")
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["workers"] == ["cpu:0", "cpu:1"] and set(env["worker_devices"]) == {"cpu:0", "cpu:1"}
    assert "2 workers (cpu:0, cpu:1)" in proc.stderr and "share the memory bandwidth" in proc.stderr


@pytest.mark.slow
def test_three_shards_cover_the_spec_and_merge_into_one_report(tmp_path, capsys):
    folders = [tmp_path / f"s{i}" for i in (1, 2, 3)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-m", "bench", "sweep", "--variants", "naive,sdpa", *SMALL, "--shard",
                               f"{i}/3", "--out", str(folder), "--no-report"], cwd=ROOT, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, folder in zip((1, 2, 3), folders)]  # three machines, as it were
    for i, proc in zip((1, 2, 3), procs):
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert f"shard {i}/3 of sweep sweep-cpu-" in err
    parts = [read_jsonl(f / "results.jsonl") for f in folders]
    everything = [k for p in parts for k in _keys(p)]
    assert len(everything) == 8 and len(set(everything)) == 8 and all(parts)  # 2 x 2 x 2, each once
    assert len({json.loads((f / "env.json").read_text())["sweep_id"] for f in folders}) == 1
    moved = json.loads((folders[1] / "env.json").read_text())  # shard 2 as measured on another machine
    moved["device_name"] = moved["cpu"] = "Another CPU"
    moved["worker_devices"] = {w: "Another CPU" for w in moved.get("worker_devices") or {"cpu": 0}}
    (folders[1] / "env.json").write_text(json.dumps(moved))
    proc = run_cli("merge", *folders, "--out", tmp_path / "merged")
    assert proc.returncode == 0, proc.stderr
    assert "merged 8 rows of 3 run folders" in proc.stdout
    merged_env = json.loads((tmp_path / "merged" / "env.json").read_text())
    assert [e["shard"] for e in merged_env["shards"]] == ["1/3", "2/3", "3/3"]
    assert merged_env["shards"][1]["device_name"] == "Another CPU" != merged_env["shards"][0]["device_name"]
    from reports.frames import load_runs

    df, _ = load_runs([tmp_path / "merged"])  # each row keeps the hardware it was measured on
    assert set(df["hardware"]) == {"Another CPU", merged_env["shards"][0]["device_name"]}
    assert set(df[df["worker"].str.startswith("shard 2/3")]["hardware"]) == {"Another CPU"}
    assert (tmp_path / "merged" / "report" / "index.html").exists()
    assert sorted(_keys(read_jsonl(tmp_path / "merged" / "results.jsonl"))) == sorted(everything)
    from bench.cli import main  # refusals before anything is written: asked in-process

    assert main(["merge", str(folders[0]), str(folders[1]), str(folders[0]), "--out", str(tmp_path / "m2")]) == 2
    assert "named twice" in capsys.readouterr().err
    other = tmp_path / "other"  # a shard of another spec: one more variant
    shutil.copytree(folders[1], other)
    env_json = json.loads((other / "env.json").read_text())
    env_json["spec"]["variants"] = ["naive", "sdpa", "flex"]
    (other / "env.json").write_text(json.dumps(env_json))
    assert main(["merge", str(folders[0]), str(other), "--out", str(tmp_path / "m3")]) == 2
    err = capsys.readouterr().err
    assert "measure different things" in err and "variants" in err


def _descendants(pid: int) -> list[int]:
    children: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


@pytest.mark.slow
def test_local_executor_runs_shards_as_jobs_resumes_a_killed_one_and_merges(tmp_path):
    pytest.importorskip("submitit")
    plugin = write_plugin(tmp_path, "slow", """
        import time
        import torch.nn.functional as F
        from bench.registry import variant

        @variant("slow", masks=("none", "causal"), description="setup that takes its time")
        def slow(case):
            time.sleep(0.7)
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=case.mask == "causal")
    """)
    sweep = tmp_path / "sweep"
    argv = ["sweep", "--executor", "local", "--shards", "2", "--plugin", plugin, "--variants", "naive,slow",
            "--seq-lens", "32,48,64", *SMALL[2:], "--out", sweep, "--no-report"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    first = subprocess.Popen([sys.executable, "-m", "bench", *map(str, argv)], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    shard1 = sweep / "shard-1-of-2"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not ((shard1 / "results.jsonl").exists()
                                               and (shard1 / "results.jsonl").read_text().count("\n") >= 2):
        time.sleep(0.2)
    record = json.loads((sweep / "sweep.json").read_text())
    job1 = int(record["jobs"][0]["job_id"])
    for pid in reversed(_descendants(job1)):  # the job and everything it started, as a preemption would
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out, err = first.communicate(timeout=300)
    assert first.returncode == 1 and "shard 1/2" in err and "Run the same command again" in err, err
    partial = read_jsonl(shard1 / "results.jsonl")
    assert 2 <= len(partial) < 6  # killed part way: some cells measured, not all
    status = run_cli("status", sweep)
    assert status.returncode == 0 and re.search(r"1/2 .* (INTERRUPTED|FAILED) +\d/6", status.stdout), status.stdout
    again = run_cli(*argv, timeout=600)  # the same command: each shard resumes from its folder
    assert again.returncode == 0, again.stderr
    resumed = read_jsonl(shard1 / "results.jsonl")
    assert resumed[:len(partial)] == partial and len(set(_keys(resumed))) == len(resumed)  # nothing measured twice
    merged = read_jsonl(sweep / "merged" / "results.jsonl")
    assert len(merged) == 12 and len(set(_keys(merged))) == 12  # 2 variants x 3 lengths x 2 masks
    log = "".join(p.read_text() for p in (sweep / "submitit").glob("*_log.err"))
    assert f"{len(partial)} already there" in log  # the resubmitted job said it resumed


@pytest.mark.slow
def test_the_projection_is_compared_with_a_measured_sweep(tmp_path, record_property):
    argv = ["sweep", "--variants", "naive,sdpa", "--seq-lens", "128,512", "--heads", "4", "--head-dims", "32",
            "--masks", "none,causal", "--budget-ms", "40", "--device", "cpu", "--quiet", "--no-report"]
    dry = run_cli(*argv, "--dry-run", "--out", tmp_path / "run")
    assert dry.returncode == 0, dry.stderr
    m = re.search(r"projected wall time: ([\d.]+) (s|min)", dry.stdout)
    projected = float(m.group(1)) * (60 if m.group(2) == "min" else 1)
    t0 = time.perf_counter()
    proc = run_cli(*argv, "--out", tmp_path / "run")
    measured = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    ratio = measured / projected
    record_property("projection_ratio", round(ratio, 3))
    print(f"projected {projected:.1f} s, measured {measured:.1f} s, measured/projected {ratio:.2f}")
    (tmp_path / "projection.json").write_text(json.dumps({"projected_s": projected, "measured_s": measured}))
    assert 0.25 <= ratio <= 4, (projected, measured)  # a projection, not a promise; off by 4x it is useless
