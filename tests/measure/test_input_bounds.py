"""Every numeric parameter has both ends, checked against the case before any cell runs: the
largest and smallest valid values pass, the first invalid value on each side is refused with
exit 2 and one line.  What a row records is what was run: nothing is clamped in silence.
Also the mask forms the reference shows (bench/README.md), through every variant that declares them (flex
compiled)."""

from __future__ import annotations

import re

import pytest

from bench.cli import main
from bench.model import masks, workload
from bench.model.case import MAX_LEN, Case, CaseError
from tests.conftest import ROOT, eager_flex, write_plugin
from tests.support.text import count

SMALL = ["--variants", "naive", "--seq-lens", "64", "--heads", "2", "--head-dims", "16", "--budget-ms", "5",
         "--device", "cpu", "--no-report", "--quiet", "--dry-run"]


def _refused(capsys, argv, words):
    assert main(list(map(str, argv))) == 2
    err = capsys.readouterr().err
    assert words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# -- mask parameters: both ends of every built-in's range ----------------------------------------------------

def _bounds():
    for d in masks.catalogue().values():
        if d.module != "bench.model.mask_catalog":
            continue
        for key, r in d.ranges.items():
            yield pytest.param(d, key, r, id=f"{d.name}.{key}")


def _spell(d, key, value) -> str:
    default = d.params[key]
    v = (int(value),) if isinstance(default, tuple) else float(value) if isinstance(default, float) else int(value)
    from bench.model.maskdefs import format_value

    text = format_value(v) if not isinstance(v, float) else repr(v)
    return f"{d.name}:{key}={text}"


@pytest.mark.parametrize("d, key, r", list(_bounds()))
def test_every_built_in_parameter_has_both_ends_and_holds_them(d, key, r):
    assert r.hi is not None, f"{d.name}:{key} has no upper bound"
    whole = not isinstance(d.params[key], float)
    step = 1 if whole else r.hi * 1e-6
    lowest = r.lo + step if r.open_lo else r.lo
    for valid in (lowest, r.hi):
        masks.parse_term(_spell(d, key, valid))  # the largest and smallest valid values
    for invalid in (r.lo if r.open_lo else r.lo - step, r.hi + step):
        with pytest.raises(masks.MaskError, match="out of range"):
            masks.parse_term(_spell(d, key, invalid))


def test_document_parameters_are_held_to_the_case():
    ok = Case(q_len=64, kv_len=64, mask="document:lengths=20/44")
    assert masks.bind(ok).counts[0] == 8 * (20 * 20 + 44 * 44)
    with pytest.raises(masks.MaskError, match="sums to 200, but the case has 64 positions"):
        masks.bind(Case(q_len=64, kv_len=64, mask="document:lengths=100/100"))
    with pytest.raises(masks.MaskError, match="sums to 63"):  # one short is refused too: no hidden document
        masks.bind(Case(q_len=64, kv_len=64, mask="document:lengths=20/43"))
    masks.bind(Case(q_len=64, kv_len=64, mask="document:64"))  # as many documents as positions
    with pytest.raises(masks.MaskError, match="needs 1 <= docs <= 64"):
        masks.bind(Case(q_len=64, kv_len=64, mask="document:65"))


def test_a_spelling_nested_too_deep_or_too_long_is_refused_in_one_line(capsys):
    deep = "document(" * 420 + "causal" + ")" * 420
    _refused(capsys, ["sweep", "--masks", deep, *SMALL], "characters; a spelling has at most 500")
    nested = "document:2(" * 5 + "causal" + ")" * 5
    _refused(capsys, ["sweep", "--masks", nested, *SMALL], "nested 5 deep; document(...) wrappers nest at most 4")
    assert main(["sweep", "--masks", "document:2(" * 4 + "causal" + ")" * 4, *SMALL]) == 0
    capsys.readouterr()
    _refused(capsys, ["sweep", "--masks", "causal&&window:4", *SMALL], "an empty term beside '&'")


def test_a_bare_window_inside_a_document_takes_the_window_flag(capsys):
    assert main(["sweep", "--masks", "document:2(window)", "--window", "8", *SMALL]) == 0
    err = capsys.readouterr().err
    assert "no effect" not in err and "needs a size" not in err
    mask, window = masks.canonical("document:2(window)", 8)
    assert mask == "document:2(window:8)" and window is None


# -- workloads: lengths, inputs, the KV layout -----------------------------------------------------------------

M = workload.MAX_TOKENS


@pytest.mark.parametrize("valid, invalid", [
    ("uniform:1-2", "uniform:0-2"), (f"uniform:1-{M}", f"uniform:1-{M + 1}"), ("uniform:7-8", "uniform:8-8"),
    ("lognormal:1e-06", "lognormal:0"), ("lognormal:4", "lognormal:4.0001"),
    ("bimodal:1/8:1e-06", "bimodal:1/8:0"), ("bimodal:1/8:0.999999", "bimodal:1/8:1"),
    ("bimodal:1/1000000:0.5", "bimodal:1/1000001:0.5"), ("bimodal:1/1.5:0.5", "bimodal:2/2:0.5"),
    ("1/7", "0/8"), (f"1/{M}", f"1/{M + 1}"),
])
def test_lengths_hold_both_ends(valid, invalid):
    workload.parse_lengths(valid)
    with pytest.raises(workload.WorkloadError) as exc:
        workload.parse_lengths(invalid)
    assert exc.value.field == "lengths" and "0 < SIGMA <= 4" in str(exc.value) and "0 < FRAC < 1" in str(exc.value)


def test_a_row_labelled_ragged_is_ragged():
    for spelling, batch in (("bimodal", 2), ("bimodal:1/8:0.9", 4), ("bimodal:1/8:0.1", 4)):
        lens = Case(batch=batch, q_len=64, kv_len=64, lengths=spelling).seq_lengths()
        assert len(set(lens)) > 1 and sum(lens) == 64 * batch, (spelling, lens)
    with pytest.raises(CaseError, match="a ragged batch needs --batch 2 or more"):
        Case(batch=1, q_len=64, kv_len=64, lengths="lognormal:0.5")
    with pytest.raises(CaseError, match="draws 4 equal lengths"):
        Case(batch=4, q_len=64, kv_len=64, lengths="lognormal:1e-06")
    with pytest.raises(CaseError, match="draws 2 equal lengths"):
        Case(batch=2, q_len=64, kv_len=64, lengths="64/64")


@pytest.mark.parametrize("dtype, top", [("float32", 1e4), ("bfloat16", 1e4), ("float16", 8188.0)])
def test_outlier_scale_holds_both_ends_for_each_dtype(dtype, top):
    def case(scale):
        return Case(dtype=dtype, q_len=64, kv_len=64, head_dim=16, inputs=f"outliers:{scale:g}")

    case(1)
    case(top)
    with pytest.raises((CaseError, workload.WorkloadError)):
        case(top * 1.001)
    for small in (0, 1e-300, 0.5):  # below 1 a scale shrinks the channels (1e-300 is zero in float32)
        with pytest.raises(CaseError, match="1 <= SCALE <= 10000"):
            case(small)


def test_input_parameters_are_held_to_the_case():
    Case(q_len=64, kv_len=64, head_dim=16, inputs="lowrank:16")
    with pytest.raises(CaseError, match="a rank-17 subspace needs head_dim >= 17, and the case has head_dim 16"):
        Case(q_len=64, kv_len=64, head_dim=16, inputs="lowrank:17")
    Case(q_len=8, kv_len=64, inputs="clustered:64")  # topics among the keys; the queries take theirs
    with pytest.raises(CaseError, match="65 topics need at least as many keys, and the case has 64"):
        Case(q_len=64, kv_len=64, inputs="clustered:65")
    Case(batch=2, q_len=64, kv_len=64, lengths="lognormal:0.5", inputs="clustered:128")  # the packed batch's keys
    with pytest.raises(CaseError, match="clustered:0"):
        Case(inputs="clustered:0")


def test_a_page_holds_both_ends():
    Case(q_len=1, kv_len=100, kv_layout="paged:1")
    Case(q_len=1, kv_len=100, kv_layout="paged:100")
    with pytest.raises(CaseError, match="a page of 101 tokens is longer than the cache"):
        Case(q_len=1, kv_len=100, kv_layout="paged:101")
    with pytest.raises(CaseError, match="not valid"):
        Case(kv_layout="paged:0")
    with pytest.raises(CaseError, match="not valid"):
        Case(kv_len=MAX_LEN, kv_layout=f"paged:{MAX_LEN + 1}")


@pytest.mark.parametrize("argv, words", [
    (["--inputs", "outliers:1e300"], "--inputs 'outliers:1e300' is not valid"),
    (["--inputs", "outliers:1e30"], "(1 <= SCALE <= 10000)"),
    (["--inputs", "lowrank:64"], "a rank-64 subspace needs head_dim >= 64, and the case has head_dim 16"),
    (["--inputs", "clustered:300"], "300 topics need at least as many keys, and the case has 64"),
    (["--masks", "document:lengths=100/100"], "sums to 200, but the case has 64 positions"),
    (["--lengths", "lognormal:0.5", "--batch", "1"], "a ragged batch needs --batch 2 or more"),
    (["--lengths", "lognormal:9"], "lognormal:SIGMA (0 < SIGMA <= 4)"),
    (["--lengths", "uniform:0-9"], "uniform:LO-HI (whole numbers, 1 <= LO < HI"),
    (["--kv-layout", "paged:65", "--directions", "fwd"], "a page of 65 tokens is longer than the cache (64 keys)"),
])
def test_bad_workloads_exit_2_in_one_line(capsys, argv, words):
    _refused(capsys, ["sweep", *argv, *SMALL], words)


def test_more_threads_than_cores_is_said_and_named_as_the_cause():
    from bench.features.contention import contention
    from bench.measure import cpuload
    from bench.measure.cpuload import auto_threads
    from bench.model.spec import Spec

    cores = len(cpuload.usable_cpus())
    _, note = auto_threads(Spec(device="cpu", threads=cores + 997))
    assert note.startswith(f"warning: --threads {cores + 997} ") and count(note, "cores") == cores
    assert f"--threads {cores} or fewer" in note
    assert auto_threads(Spec(device="cpu", threads=cores))[1] == ""
    row = contention.verdict(cpu_util=0.002, other_cpu=1.9, threads=999, cpu_count=2)
    why = row["contended_why"]
    assert row["contended"] and (count(why, "threads"), count(why, "cores")) == (999, 2) and "--threads 2 or" in why
    assert "other processes" not in row["contended_why"]  # the load is the sweep's own threads


# -- plugin bugs are the plugin's ------------------------------------------------------------------------------

@pytest.mark.parametrize("returned, words", [
    (lambda q, k, v: (q, None), "the variant returned a tuple of 2 (Tensor, NoneType)"),
    (lambda q, k, v: None, "the variant returned None"),
    (lambda q, k, v: [q], "the variant returned a list of 1 (Tensor)"),
])
def test_a_variant_that_returns_no_tensor_is_its_own_mismatch(returned, words):
    from bench.engine.cell import run_group
    from bench.measure.settings import MeasureSettings
    from bench.model.registry import Variant

    bad = Variant("returns.wrong", lambda case: returned, "returns the wrong thing", module="myplugin")
    for direction in ("fwd", "fwd+bwd"):
        rows = []
        case = Case(batch=1, heads=2, kv_heads=2, q_len=16, kv_len=16, head_dim=8, direction=direction)
        run_group([bad], case, MeasureSettings(budget_ms=5.0), rows.append)
        row = rows[0]
        assert row["status"] == "mismatch" and row["reason_kind"] == "mismatch-shape", row["reason"]
        assert row["reason"].startswith(words) and "one tensor shaped like q, (1, 2, 16, 8)" in row["reason"]
        assert "harness" not in row["reason"]


@pytest.mark.slow
def test_a_variant_that_leaves_a_busy_thread_is_marked_and_nothing_is_timed_beside_it(tmp_path):
    from bench.api import build_spec, discover, parse_values, run_sweep

    plugin = write_plugin(tmp_path, "spinner", """
        import os
        import threading

        import torch.nn.functional as F
        from bench.registry import Prepared, variant

        def spin():
            while True:
                pass

        @variant("spinner", description="starts a thread that never ends", devices=("cpu",), dtypes=("float32",),
                 masks=("none",), backward=False)
        def spinner(case):
            threading.Thread(target=spin, daemon=True).start()
            return Prepared(F.scaled_dot_product_attention, {"pid": os.getpid()})

        @variant("pidprobe", description="exact, and says which process timed it", devices=("cpu",),
                 dtypes=("float32",), masks=("none",), backward=False)
        def pidprobe(case):
            return Prepared(F.scaled_dot_product_attention, {"pid": os.getpid()})
    """)
    values = parse_values({"variants": ["spinner", "pidprobe", "naive"], "seq_lens": [32], "heads": [2],
                           "head_dims": [8], "masks": ["none"], "directions": ["fwd"], "budget_ms": 5.0,
                           "device": "cpu", "plugins": [str(plugin)], "remeasure": 0,
                           "visits": 1})
    summary = run_sweep(build_spec(values, discover([str(plugin)])), tmp_path / "run")
    rows = {r["variant"]: r for r in summary.rows}
    spin = rows["spinner"]
    assert spin["status"] == "error" and "left work running" in spin["reason"]
    # the spinning thread, counted by its own CPU time (beside other processes' load, a pool thread still
    # spinning down from the first call can be counted with it: the test's own sweep runs beside others)
    m = re.search(r"(\d+) busy thread\(s\) in the worker using (\d\.\d+) cores", spin["reason"])
    assert m and int(m.group(1)) >= 1 and float(m.group(2)) >= 0.25, spin["reason"]
    assert "spinner.py" in spin["reason"]
    assert rows["pidprobe"]["status"] == "ok" and rows["naive"]["status"] == "ok"
    assert rows["pidprobe"]["pid"] != spin["pid"]  # timed in a fresh worker, never beside the spinning thread


def test_the_leftover_check_reports_a_busy_thread_and_forgets_an_idle_one(monkeypatch):
    """Fake /proc readings and a fake clock: threads appear, idle ones use no CPU over the check's
    window, a busy one a core's worth of it; whatever else the machine does, the check says the same."""
    from bench.features.contention import leftovers

    class Proc:
        def __init__(self):
            self.now, self.tasks, self.busy = 0.0, {"100": 1.0}, set()

        def sleep(self, s):
            self.now += s
            for tid in self.busy:
                self.tasks[tid] += s  # a busy thread: one core's worth of CPU over the window

        def cpu(self):
            return sum(self.tasks.values())

        def start(self, tid, busy=False):
            self.tasks[tid] = 0.0
            if busy:
                self.busy.add(tid)

    proc = Proc()
    monkeypatch.setattr(leftovers, "_threads", lambda: len(proc.tasks))
    monkeypatch.setattr(leftovers, "_task_cpu", lambda: dict(proc.tasks))
    monkeypatch.setattr(leftovers, "_children", lambda: set())
    guard = leftovers.Leftovers(sleep=proc.sleep, cpu=proc.cpu, clock=lambda: proc.now)
    assert guard.check() == ""  # nothing new
    proc.start("101")  # a pool thread that waits: the new normal
    assert guard.check() == "" and guard.threads == 2
    proc.start("102", busy=True)
    proc.start("103")  # an idle one started beside it is not counted
    said = guard.check()
    assert (count(said, "busy thread(s)"), count(said, "cores")) == (1, 1.0), said
    proc.busy.clear()  # it stopped: the next check takes the threads as they are
    assert guard.check() == "" and guard.threads == 4


def test_a_thread_starved_in_the_first_look_is_caught_by_the_longer_one(monkeypatch):
    """On a loaded machine a spinning thread can get under a quarter of a core in 50 ms: the check
    looks again, longer, before it takes a new thread as the new normal (fake clocks and thread
    counts: 0.2 cores in the first window, 0.6 in the second)."""
    from bench.features.contention import leftovers

    now = {"t": 0.0, "cpu": 0.0, "threads": 4}
    shares = iter([0.2, 0.6])  # cores used in each window

    def sleep(s):
        if s in leftovers.WINDOWS_S:
            now["cpu"] += next(shares) * s
        now["t"] += s

    monkeypatch.setattr(leftovers, "_threads", lambda: now["threads"])  # this process's, whatever else runs
    monkeypatch.setattr(leftovers, "_children", lambda: set())
    guard = leftovers.Leftovers(sleep=sleep, cpu=lambda: now["cpu"], clock=lambda: now["t"])
    now["threads"] = 5  # one new thread, so the check looks
    said = guard.check()
    assert (count(said, "busy thread(s)"), count(said, "cores")) == (1, 0.6), said
    assert now["t"] == pytest.approx(leftovers.SETTLE_S + sum(leftovers.WINDOWS_S))
    # idle in both looks: the threads are the new normal, and the next check does not look at all
    shares = iter([0.0, 0.0])
    now["threads"] = 6
    assert guard.check() == ""
    before = now["t"]
    assert guard.check() == "" and now["t"] == before


# -- warnings are said once, by the folder they belong to --------------------------------------------------------

def test_a_corrupted_folder_warns_its_own_readers_once_and_never_the_planner(tmp_path, capsys):
    from bench.features.cost_model import plan
    from bench.runs import store

    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    (run / "results.jsonl").write_text("garbage\n")
    plan.load_history(tmp_path / "runs", "cpu")
    assert capsys.readouterr().err == ""  # another sweep's planner reads it quietly
    store.read_rows(run)
    store.read_rows(tmp_path / "runs" / ".." / "runs" / "a")  # the same folder, named otherwise
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.jsonl:1: skipped, not valid JSON" in err[0]


# -- the mask forms the reference shows, through every variant that declares them ----------------------------

def _readme_spellings() -> list[str]:
    text = (ROOT / "bench" / "README.md").read_text()
    section = text[text.index("## Masks and score mods"):text.index("## Ragged batches")]
    found = re.findall(r"`([a-z_]+(?:[:&(+][a-z0-9_:=/&()+]*)?)`", section)
    found += [m for cmd in re.findall(r"--masks (\S+)", section) for m in cmd.split(",")]
    out = []
    for spelling in dict.fromkeys(found):
        try:
            masks.parse(spelling, window=8)
        except masks.MaskError:
            continue  # a word in backquotes that is no spelling (a function's name, W for a number)
        out.append(spelling)
    return out


README_FORMS = _readme_spellings()


def test_readme_shows_the_mask_algebra():
    assert {"document:4&causal", "causal&window:64+sink:4", "document:4(prefix_lm:16)",
            "document:lengths=64/192(sink:2:window=32)"} <= set(README_FORMS)


def _declaring(spelling: str) -> list[str]:
    from bench.api import discover
    from bench.model.registry import available

    registry = discover(entry_points=False)
    case = _case(spelling)
    return [v.name for v in registry if available(v, case)[0] and not v.approximate
            and not v.shard]  # the context-parallel ones run over ranks: tests/variants/test_cp.py


def _case(spelling: str) -> Case:
    mask, window = masks.canonical(spelling, 8)
    return Case("cpu", "float32", 2, 4, 2, 256, 256, 16, mask, window, "fwd")


@pytest.mark.parametrize("spelling", README_FORMS)
def test_every_readme_mask_form_runs_through_every_variant_that_declares_it(registry, spelling):
    """Flex's mask_mod and score_mod as a sweep builds them, through eager flex_attention (its
    reference implementation: the same create_block_mask and the same checks of what it is
    given); the other variants as they are timed.  Each against the float64 reference."""
    from bench.measure.bound import bind_variant
    from bench.measure.correctness import check, reference, run_and_check

    case = _case(spelling)
    names = _declaring(spelling)
    assert "naive" in names and "flex" in names
    for name in names:
        if name == "flex":
            out, (q, k, v) = eager_flex(case)
            result = check(case, out, reference(case, q, k, v).out)
        else:
            b = bind_variant(registry[name], case)
            with b.scope():
                result = run_and_check(case, b.fn, *b.inputs)
        assert result.ok, (spelling, name, result.reason)


@pytest.mark.slow
def test_the_libraries_pools_are_started_before_the_baseline_so_no_check_looks_for_them():
    """OpenMP's pool and the profiler's thread start on their first use; a worker starts them before
    its leftover baseline (leftovers.warm), so the first cell's check does not spend a look on them.
    Without that, the same calls make the check look (in a fresh process, with two threads)."""
    import subprocess
    import sys

    code = """
import sys, torch
from bench.features.contention import leftovers
torch.set_num_threads(2)
if sys.argv[1] == "warm":
    leftovers.warm()
looks = []
guard = leftovers.Leftovers(sleep=looks.append)
a = torch.ones(128, 128)
(a @ a).sum().item()
from torch.profiler import ProfilerActivity, profile
with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
    (a @ a).sum().item()
guard.check()
print(len(looks))
"""
    runs = {how: subprocess.run([sys.executable, "-c", code, how], capture_output=True, text=True, timeout=120)
            for how in ("warm", "cold")}
    assert all(r.returncode == 0 for r in runs.values()), {h: r.stderr[-500:] for h, r in runs.items()}
    assert runs["warm"].stdout.split()[-1] == "0"  # nothing new: no look
    assert int(runs["cold"].stdout.split()[-1]) > 0  # the pools appeared after the baseline: it looked
