"""`python -m bench selfcheck`: the harness's median next to torch.utils.benchmark's, round by round."""


import pytest

from bench.case import Case
from tests.conftest import run_cli
from tests.support.text import numbers


@pytest.mark.slow
def test_selfcheck_pairs_the_tools_round_by_round(monkeypatch):
    """The two tools take turns (harness, tub, harness, tub, ...), and the ratio is the median
    of the per-round ratios, with its spread."""
    import bench.features.selfcheck as sc
    from bench.api import discover

    order = []
    real_interleave = sc.interleave

    def spy(timers, rounds, budget_ms, **kw):
        for name, t in timers.items():
            inner = t.run_round
            t.run_round = lambda ms, min_samples=1, _n=name, _f=inner, **kw: (order.append(_n),
                                                                               _f(ms, min_samples, **kw))
        return real_interleave(timers, rounds, budget_ms, **kw)

    monkeypatch.setattr(sc, "interleave", spy)
    case = Case("cpu", "float32", 1, 2, 2, 128, 128, 16, "none", None, "fwd")
    row = sc.check_cell(discover()["sdpa.math"], case, budget_ms=60, rounds=3)
    assert order == ["harness", "tub"] * 3
    # the method, not the machine: the ratio is the median of the per-round ratios, inside their spread
    # (how close to 1 it lands depends on the load beside the test, which a shared machine does not promise)
    assert 0 < row["ratio_tub_lo"] <= row["ratio_tub"] <= row["ratio_tub_hi"] < float("inf")
    assert row["harness_samples"] >= 3 and {"cpu_util", "other_cpu", "contended"} <= set(row)
    assert sc._ratio([2.0, 4.0, 3.0], [1.0, 2.0, 2.0]) == (2.0, 1.5, 2.0)


@pytest.mark.slow
def test_selfcheck_command_prints_a_paired_ratio_per_cell():
    proc = run_cli("selfcheck", "--variants", "naive,sdpa.math", "--seq-lens", "128", "--heads", "2",
                   "--budget-ms", "50")
    assert proc.returncode == 0, proc.stderr
    assert "median of the per-round ratios" in proc.stdout
    lines = [ln.split() for ln in proc.stdout.splitlines() if ln.startswith(("naive", "sdpa.math"))]
    # each cell twice, under the heap the workers keep and under the system's, each in a process of its own
    want = [(v, h) for v in ("naive", "sdpa.math") for h in ("fixed", "system")]
    assert sorted((ln[0], next(t for t in ln if t in ("fixed", "system"))) for ln in lines) == want
    assert all("-" in ln[-3] for ln in lines)  # the per-round spread
    crossed = next(ln for ln in proc.stdout.splitlines() if ln.startswith("heap:"))
    tail = crossed.split("system):")[1]
    assert tail.count("naive") == 1 and tail.count("sdpa.math") == 1 and numbers(tail)
