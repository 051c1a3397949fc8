"""``python -m bench ab``: two builds taking turns (bench.features.ab).  The logic runs against fake
side servers whose rows carry the noise measured on the 2-core machine (tests/benchmarks/drift.py):
a per-process offset each repeat, and each turn's own drift; the plugin files' renaming runs for
real, and one small real ab runs end to end (slow)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.cli import main
from bench.errors import UsageError
from bench.features import ab
from bench.measure.stats import paired_evidence, t_cdf, t_quantile
from bench.runs import store
from bench.runs.store import ResultWriter
from tests.conftest import ROOT, read_jsonl, run_cli, write_plugin

PROCESS_SD = 0.06  # a repeat's common offset between A's process and B's (the ab A/A above: 0.06)
TURN_SD = 0.14  # each cell's own, turn to turn, beside it (the same A/A: 0.15 in all)
BASE = dict(device="cpu", dtype="float32", batch=1, heads=4, kv_heads=4, head_dim=64, window=None,
            direction="fwd", reason="", status="ok", lengths="fixed", inputs="normal", kv_layout="contiguous",
            align="top-left", mix="none")


class FakeServer:
    """A side's server: each slice's rows, timed with the measured noise and B's slowdown."""

    def __init__(self, side, rng, slowdown: dict):
        self.side, self.rng, self.slowdown = side, rng, slowdown
        self.offset = float(np.exp(rng.normal(0.0, PROCESS_SD)))  # this process's own, for the repeat

    def measure(self, settings, out):
        out.mkdir(parents=True, exist_ok=True)
        w = ResultWriter(out)
        for v in settings["variants"]:
            for mask in settings["masks"]:
                for n in settings["seq_lens"]:
                    base = 1e-5 * n**2 * (1 + len(v)) * (1.5 if mask == "none" else 1)
                    slow = self.slowdown.get(v, 1.0) if self.side.label == "B" else 1.0
                    ms = base * self.offset * slow * float(np.exp(self.rng.normal(0.0, TURN_SD)))
                    w.write(BASE | dict(variant=v, mask=mask, q_len=n, kv_len=n, samples_ms=[ms] * 9))
        w.close()

    def close(self):
        pass


SETTINGS = {"variants": ["naive", "sdpa", "chunked.online"], "masks": ["none", "causal"],
            "seq_lens": [256, 512, 1024], "device": "cpu"}


def _ab(tmp_path, seed, slowdown=None, repeats=5):
    rng = np.random.default_rng(seed)
    sides = (ab.Side("A", "a", sys.executable, str(ROOT)), ab.Side("B", "b", sys.executable, str(ROOT)))
    out = tmp_path / f"ab-{seed}"
    ab.run(sides, SETTINGS, out, repeats, start=lambda s, c=None: FakeServer(s, rng, slowdown or {}))
    cells = ab.rows_by_cell(out, repeats, len(ab.slices(SETTINGS)))
    return ab.analyse(cells, margin=0.05, fdr=0.05), cells


def test_student_t_matches_its_table():
    for dof, t in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert t_cdf(t, dof) == pytest.approx(0.975, abs=2e-4)
        assert t_quantile(0.975, dof) == pytest.approx(t, abs=2e-3)
    assert t_cdf(0.0, 5) == 0.5 and t_cdf(-2.571, 5) == pytest.approx(0.025, abs=2e-4)


def test_the_sides_take_each_slice_in_turn_and_each_repeat_starts_fresh_servers(tmp_path):
    started, order = [], []

    class Recorder(FakeServer):
        def __init__(self, side, *a):
            super().__init__(side, np.random.default_rng(0), {})
            started.append(side.label)

        def measure(self, settings, out):
            order.append((self.side.label, settings["seq_lens"][0]))
            super().measure(settings, out)

    sides = (ab.Side("A", "a", sys.executable, str(ROOT)), ab.Side("B", "b", sys.executable, str(ROOT)))
    ab.run(sides, SETTINGS, tmp_path / "x", 2, start=Recorder)
    assert started == ["A", "B", "A", "B"]  # two fresh servers per repeat
    assert order == [("A", 256), ("B", 256), ("B", 512), ("A", 512), ("A", 1024), ("B", 1024),
                     ("B", 256), ("A", 256), ("A", 512), ("B", 512), ("B", 1024), ("A", 1024)]


def test_a_relative_out_reaches_each_side_s_server_as_one_absolute_folder(tmp_path, monkeypatch):
    """A tree side's server runs in its own tree: a folder relative to the command's directory must
    reach it whole, or each side would write into a folder of its own."""
    seen = []

    class Recorder(FakeServer):
        def __init__(self, side, *a):
            super().__init__(side, np.random.default_rng(0), {})

        def measure(self, settings, out):
            seen.append(Path(out))
            super().measure(settings, out)

    monkeypatch.chdir(tmp_path)
    sides = (ab.Side("A", "a", sys.executable, str(ROOT)), ab.Side("B", "b", sys.executable, str(ROOT)))
    ab.run(sides, SETTINGS, Path("rel"), 1, start=Recorder)
    assert seen and all(p.is_absolute() and p.is_relative_to(tmp_path / "rel") for p in seen)


def test_an_aa_calls_at_most_five_percent_of_cells_changed(tmp_path):
    called = total = 0
    for seed in range(1, 9):
        table, _ = _ab(tmp_path, seed)
        called += sum(r["verdict"] in ("faster", "slower") for r in table)
        total += len(table)
    assert total == 8 * 18 and called <= 0.05 * total, (called, total)


def test_a_slowdown_beyond_the_noise_is_found_and_a_small_one_says_unsure(tmp_path):
    """With the turn-to-turn noise of separate processes on this machine, 5 repeats find a 2x
    slowdown of one variant; a 10% one is left unsure (plugin files interleave within one sweep and
    find it: tests/features/test_ab.py's slow end-to-end test and the closing figures)."""
    table, _ = _ab(tmp_path, 11, {"sdpa": 2.0})
    slowed = [r for r in table if r["variant"] == "sdpa"]
    assert sum(r["verdict"] == "slower" for r in slowed) >= 0.9 * len(slowed)
    assert all(r["verdict"] != "slower" for r in table if r["variant"] != "sdpa")
    small, _ = _ab(tmp_path, 12, {"sdpa": 1.10})
    assert all(r["verdict"] in ("undecided", "slower") for r in small if r["variant"] == "sdpa")


def test_the_aa_drift_separates_a_repeats_common_shift_from_each_cells_own(tmp_path):
    _, cells = _ab(tmp_path, 21, repeats=12)
    cell, run = ab.aa_drift(cells)
    assert cell == pytest.approx(TURN_SD, rel=0.35)  # each ratio holds two turns: sd TURN_SD sqrt(2), / sqrt(2)
    assert run < cell


def test_paired_evidence_tests_the_repeats_against_the_margin():
    e = paired_evidence([1.0] * 5, [1.2, 1.21, 1.19, 1.2, 1.22], margin=0.05)
    assert e.ratio == pytest.approx(1.204, abs=1e-3) and e.lo > 1.05 and e.p_slower < 0.001
    flat = paired_evidence([1.0] * 5, [1.0, 1.3, 0.8, 1.1, 0.9], margin=0.05)
    assert flat.lo < 1 < flat.hi and flat.p > 0.2
    assert paired_evidence([1.0], [2.0]).p == 1.0  # one repeat: no interval, no claim


def test_a_side_is_a_tree_an_interpreter_or_a_plugin_file(tmp_path):
    assert ab.side("A", str(ROOT)).tree == str(ROOT)
    plugin = write_plugin(tmp_path, "mine", "x = 1\n")
    assert ab.side("B", str(plugin)).plugins == (str(plugin.resolve()),)
    assert ab.side("B", sys.executable).python == str(os.path.realpath(sys.executable)) or \
        ab.side("B", sys.executable).python == str(type(ROOT)(sys.executable).resolve())
    with pytest.raises(UsageError, match="a folder without bench/"):
        ab.side("A", str(tmp_path))
    with pytest.raises(UsageError, match="not a source tree"):
        ab.side("A", str(tmp_path / "nothing"))


def test_two_plugin_files_take_turns_in_one_sweep_b_renamed(tmp_path):
    """A's and B's files may define the same variant names: B's are loaded as NAME@B beside A's, and
    each computes its own."""
    from bench.engine.discovery import discover

    body = """
        from bench.registry import variant

        @variant("cand", masks=("none",), description="{what}")
        def cand(case):
            import torch.nn.functional as F
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * {scale}
    """
    a = write_plugin(tmp_path, "a", body.format(what="as it is", scale=1.0))
    b = write_plugin(tmp_path, "b", body.format(what="changed", scale=2.0))
    sides = (ab.side("A", str(a)), ab.side("B", str(b)))
    assert ab.together(sides)
    shim = ab.renamed_plugin(sides[1], tmp_path / "out")
    reg = discover([str(a), shim])
    assert {"cand", "cand@B"} <= set(reg.names())
    assert reg["cand@B"].description == "changed" and reg["cand"].description == "as it is"
    from bench.model.registry import variant as model
    from bench.registry import variant as public

    assert public is model and public.__name__ == "variant"  # restored after B's file was read


def test_bad_ab_input_exits_2_with_one_line(tmp_path, capsys):
    for argv, words in ((["ab", str(tmp_path), str(ROOT)], "a folder without bench/"),
                        (["ab", str(ROOT), str(ROOT), "--repeats", "1"], "--repeats takes a whole number from 2"),
                        (["ab", str(ROOT), str(ROOT), "--seq-lens", "²"], "ASCII")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_ab_end_to_end_with_two_plugin_files(tmp_path):
    body = """
        import time
        from bench.registry import variant

        @variant("cand", masks=("none",), description="sdpa{what}")
        def cand(case):
            import torch.nn.functional as F

            def attention(q, k, v):
                t0 = time.perf_counter()
                out = F.scaled_dot_product_attention(q, k, v)
                end = t0 + {extra}  # an injected wait, far beyond what a loaded machine adds to the call
                while time.perf_counter() < end:
                    pass
                return out
            return attention
    """
    a = write_plugin(tmp_path, "a", body.format(what="", extra=0.0))
    b = write_plugin(tmp_path, "b", body.format(what=", then a wait to 2 ms", extra=0.002))
    res = run_cli("ab", a, b, "--variants", "cand", "--seq-lens", "64", "--heads", "2", "--head-dims", "16",
                  "--masks", "none", "--budget-ms", "20", "--repeats", "2", "--device", "cpu", "--out", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    table = {(r["variant"], r["q_len"]): r for r in __import__("json").loads((tmp_path / "o" / "ab.json").read_text())}
    assert set(table) == {("cand", 64)}
    assert all(r["ratio"] > 1.5 for r in table.values())  # 2 ms against tens of microseconds, measured in turns
    assert "Worse" in res.stdout
    rows = read_jsonl(tmp_path / "o" / "repeat-1" / "AB" / "slice-1" / "results.jsonl")
    assert {r["variant"] for r in rows} == {"cand", "cand@B"}
    assert math.isfinite(table[("cand", 64)]["ratio_lo"])
    # two plugin files together: each repeat visits the cell in fresh workers, A and B in the same round of each,
    # and every visit is a pair of its own (up to 2 repeats x 3 visits; a contended visit is left out)
    visits = read_jsonl(tmp_path / "o" / "repeat-1" / "AB" / "slice-1" / "visits.jsonl")
    assert {(v["variant"], v["visit"]) for v in visits} == {(n, k) for n in ("cand", "cand@B") for k in (2, 3)}
    # the pairs are the visits both sides kept in each repeat (a contended one is left out, so their number
    # follows the machine's load; the rule that counts them does not)
    pairs = 0
    for k in (1, 2):
        kept = {r["variant"]: set(r.get("visit_ids") or [None])
                for r in store.read_rows(tmp_path / "o" / f"repeat-{k}" / "AB" / "slice-1")}
        pairs += len(kept["cand"] & kept["cand@B"])
    assert table[("cand", 64)]["repeats"] == pairs and 2 <= pairs <= 6


class Clock:
    """A fake clock: each repeat takes ``step`` seconds of it."""

    def __init__(self, step: float):
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        return self.t


def _sequential(tmp_path, seed, slowdown, budget_s, gate=None, step=10.0):
    rng = np.random.default_rng(seed)
    clock = Clock(step)
    sides = (ab.Side("A", "a", sys.executable, str(ROOT)), ab.Side("B", "b", sys.executable, str(ROOT)))
    out, seen, state = tmp_path / f"seq-{seed}", [], {}

    class Timed(FakeServer):
        def close(self):
            clock.t += step / 2  # two servers a repeat

    def decided(repeats, look, weights):
        seen.append(repeats)
        state["weights"] = weights
        state["table"] = ab.analyse(ab.rows_by_cell(out, repeats, 3), 0.02, 0.05, list(seen), weights)
        return ab.all_decided(state["table"], gate)

    seq = ab.sequential(sides, SETTINGS, out, 3, budget_s, decided, start=lambda s, c: Timed(s, rng, slowdown),
                        clock=clock)
    return seq, state["table"]


def test_a_large_change_stops_early_and_an_aa_spends_the_budget(tmp_path):
    seq, table = _sequential(tmp_path, 31, {"naive": 3.0, "sdpa": 3.0, "chunked.online": 3.0}, budget_s=120)
    assert seq["stopped"] == "every cell decided" and seq["repeats"] < 12  # long before the budget
    assert seq["looks"] == ab.looks(3)[:len(seq["looks"])]
    assert {r["verdict"] for r in table} == {"slower"}
    seq, table = _sequential(tmp_path, 32, {}, budget_s=120)
    assert seq["stopped"] == "the budget" and seq["repeats"] == 12  # 10 s a repeat: the 13th would end past 120 s
    assert seq["looks"] == [3, 5, 8, 12]  # the schedule (12 is on it: no extra last look)
    # each look spends (k/12)^2 of the rate less what was spent, and the last one, with no repeat after it, the rest
    assert seq["weights"][:3] == pytest.approx([(3 / 12) ** 2, (5 / 12) ** 2 - (3 / 12) ** 2,
                                                (8 / 12) ** 2 - (5 / 12) ** 2])
    assert sum(seq["weights"]) == pytest.approx(1.0) and seq["weights"][-1] == max(seq["weights"])
    assert sum(r["verdict"] in ("faster", "slower") for r in table) == 0
    assert all(r["repeats"] == 12 and r["sd"] > 0 and 0 < r["power_10pct"] < 1 for r in table)


def test_more_pairs_decide_what_the_first_look_could_not(tmp_path):
    """A 25% slowdown under the turn-to-turn noise of separate processes is rarely decided in 3 pairs;
    the budget's later looks decide it, with the alpha each look spends taken into account."""
    first, _ = _sequential(tmp_path, 41, {"sdpa": 1.25}, budget_s=0)
    later, table = _sequential(tmp_path, 41, {"sdpa": 1.25}, budget_s=600)
    slowed = [r for r in table if r["variant"] == "sdpa"]
    assert first["repeats"] == 3 and later["repeats"] > 3
    assert sum(r["verdict"] == "slower" for r in slowed) >= 5
    assert all(r["verdict"] != "slower" for r in table if r["variant"] != "sdpa")


def test_the_looks_spend_the_rate_once_over_the_sequence():
    assert ab.looks(3) == [3, 5, 8, 12, 18, 27, 41, 50] and ab.looks(4)[:3] == [4, 6, 9]
    assert ab.spend(3, 5, 0.0, False) == pytest.approx(0.36) and ab.spend(5, 5, 0.36, True) == pytest.approx(0.64)
    # a budget that turns out shorter than it looked (the expected last look moving down) never overspends
    spent = 0.0
    for k, last, final in ((3, 12, False), (5, 6, False), (6, 6, True)):
        spent += ab.spend(k, last, spent, final)
    assert spent == pytest.approx(1.0)
    assert ab.spend(5, 5, 1.0, False) == 0.0 and ab.spend(8, 40, 0.5, False) == 0.0
    assert sum(ab.look_weight(j) for j in range(1, 10_000)) == pytest.approx(1.0, abs=1e-3)
    # a cell's p over the sequence is its smallest look's p over that look's weight: 3 looks of p 0.01 give 0.02
    cells = {("x",): {"A": [1.0] * 9, "B": [1.0 + 0.01 * (i % 3) for i in range(9)], "repeat": list(range(9)),
                      "row": BASE | dict(variant="x", mask="none", q_len=1, kv_len=1)}}
    one = ab.analyse(cells, 0.0, 0.05)[0]["p"]
    three = ab.analyse(cells, 0.0, 0.05, [3, 6, 9])[0]["p"]
    assert three >= one


def test_the_ab_gate_says_regression_clear_or_unjudged():
    from bench.cli.ab import _gate

    row = dict(variant="x", mask="none", direction="fwd", q_len=1, q=0.01, repeats=9)
    assert _gate([row | dict(verdict="slower", ratio=1.5, ratio_lo=1.3, ratio_hi=1.7)], 0.10) == 1
    assert _gate([row | dict(verdict="same", ratio=1.0, ratio_lo=0.99, ratio_hi=1.01)], 0.10) == 0
    assert _gate([row | dict(verdict="undecided", ratio=1.05, ratio_lo=0.9, ratio_hi=1.2)], 0.10) == 4
    assert _gate([row | dict(verdict="undecided", ratio=1.05, ratio_lo=0.9, ratio_hi=1.2)], None) == 0


def test_both_sides_of_a_repeat_share_its_seed_cores_and_environment(tmp_path, monkeypatch):
    started = []

    class Recorder(FakeServer):
        def __init__(self, side, cond):
            super().__init__(side, np.random.default_rng(0), {})
            started.append((side.label, cond))

    sides = (ab.Side("A", "a", sys.executable, str(ROOT)), ab.Side("B", "b", sys.executable, str(ROOT)))
    for k in range(2):
        ab.run_repeat(sides, SETTINGS, tmp_path / "x", k, start=Recorder)
    (a0, c0), (b0, d0), (_, c1), (_, d1) = started
    assert (a0, b0) == ("A", "B") and c0 == d0 and c1 == d1 and c0["seed"] != c1["seed"]
    two = [ab.conditions(k, threads=1, allowed=[0, 1, 2, 3]) for k in range(3)]
    assert [c["cpus"] for c in two] == [[0], [1], [2]] and {c["threads"] for c in two} == {1}
    monkeypatch.setenv("SOMETHING_ELSE", "1")
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", "/tmp/x")
    env = ab.pair_env(7)
    assert env["PYTHONHASHSEED"] == "7" and "SOMETHING_ELSE" not in env and env["ATTNBENCH_CACHE_DIR"] == "/tmp/x"


def _tree(at: Path) -> Path:
    """A source tree of this harness whose variants/ holds naive alone (its workers import no other)."""
    import shutil

    shutil.copytree(ROOT / "bench", at / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    (at / "variants").mkdir()
    for name in ("__init__.py", "naive.py"):
        shutil.copy(ROOT / "variants" / name, at / "variants" / name)
    return at


def test_ab_says_which_mode_and_why(tmp_path):
    import shutil

    a = _tree(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    sides = (ab.side("A", str(a)), ab.side("B", str(b)))
    assert ab.mode(sides)[0] == "together" and "0 file(s) under variants/" in ab.mode(sides)[1]
    (b / "variants" / "naive.py").write_text((b / "variants" / "naive.py").read_text() + "\n# changed\n")
    assert ab.mode(sides)[0] == "together" and "1 file(s) under variants/" in ab.mode(sides)[1]
    assert ab.plan(sides, SETTINGS | {"variants": ["naive"]}, tmp_path / "o")[0]["variants"] == ["naive", "naive@B"]
    (b / "bench" / "errors.py").write_text((b / "bench" / "errors.py").read_text() + "\n# changed\n")
    assert ab.mode(sides)[0] == "turns" and "1 file(s) under bench/" in ab.mode(sides)[1]
    assert ab.mode((ab.side("A", str(a)), ab.side("A", str(a))))[0] == "turns"  # ab . .: two runs, calibrating
    p1, p2 = write_plugin(tmp_path, "p1", "x = 1\n"), write_plugin(tmp_path, "p2", "x = 1\n")
    assert ab.mode((ab.side("A", str(p1)), ab.side("B", str(p2))))[0] == "together"


TREE_B = {
    "__init__.py": "",
    "_helper.py": "SCALE = 2.0\n",
    "naive.py": """
        from bench.registry import variant
        from variants._helper import SCALE
        import variants._helper
        import variants._helper as helper

        @variant("naive", masks=("none",), baseline=True, description=f"scaled by {SCALE}")
        def naive(case):
            import torch.nn.functional as F
            scale = variants._helper.SCALE * helper.SCALE / SCALE
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v) * scale
    """,
}


def test_tree_b_s_variants_load_beside_a_s_renamed_with_their_own_helpers(tmp_path):
    """B's variants/ is read under another package: B's naive is naive@B, not a baseline, and the
    helper it imports from its own tree (three import forms) is B's; A's naive is untouched, and B's
    tree gets no bytecode of the rewritten source."""
    import json
    import subprocess
    import textwrap

    b = tmp_path / "b"
    (b / "bench").mkdir(parents=True)
    (b / "bench" / "__init__.py").write_text("")
    for name, text in TREE_B.items():
        (b / "variants").mkdir(exist_ok=True)
        (b / "variants" / name).write_text(textwrap.dedent(text))
    shim = ab.tree_plugin(ab.side("B", str(b)), tmp_path / "out")
    probe = f"""
import json
from bench.engine.discovery import discover
reg = discover([{shim!r}])
out = {{}}
for name in ("naive", "naive@B"):
    v = reg[name]
    out[name] = [v.description, v.baseline, v.module]
print(json.dumps(out | {{"baseline": reg.baseline().name}}))
"""
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["naive@B"][:2] == ["scaled by 2.0", False] and got["naive@B"][2].startswith(ab.B_PACKAGE)
    assert got["naive"][1] is True and got["naive"][2] == "variants.naive" and got["baseline"] == "naive"
    assert not list(b.rglob("*.pyc"))


@pytest.mark.slow
def test_ab_of_two_trees_differing_in_variants_measures_them_together(tmp_path):
    import json
    import shutil

    a = _tree(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    naive = b / "variants" / "naive.py"
    naive.write_text(naive.read_text().replace("        return p @ v  # (B, H, Lq, D)",
                                               "        return (p @ v) * 1.0  # (B, H, Lq, D)"))
    res = run_cli("ab", a, b, "--variants", "naive", "--seq-lens", "64", "--heads", "2", "--head-dims", "16",
                  "--masks", "none", "--budget-ms", "20", "--repeats", "2", "--budget-s", "0", "--device", "cpu",
                  "--out", tmp_path / "o")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("ab: mode together")
    rows = read_jsonl(tmp_path / "o" / "repeat-1" / "AB" / "slice-1" / "results.jsonl")
    assert {r["variant"] for r in rows} == {"naive", "naive@B"}
    assert {r["status"] for r in rows} == {"ok"}
    table = json.loads((tmp_path / "o" / "ab.json").read_text())
    assert [r["variant"] for r in table] == ["naive"] and table[0]["mode"] == "together"
