"""sweep --trace-spans: each span counts its own time, a worker's spans come back with its job, and
a real sweep's spans add up to its wall time."""

import json

import pytest

from bench.cli import main
from bench.engine import spans


@pytest.fixture
def clock(monkeypatch):
    """A fake perf_counter that moves only when told."""
    now = [100.0]
    monkeypatch.setattr(spans.time, "perf_counter", lambda: now[0])
    yield now
    spans.enable(False)


def test_a_span_counts_its_own_time_less_the_spans_inside_it(clock):
    spans.enable()
    with spans.span("outer"):
        clock[0] += 1.0
        with spans.span("inner"):
            clock[0] += 2.0
        with spans.span("inner"):
            clock[0] += 0.5
        spans.absorb({"worker: work": (3.0, 4)})  # another process's, inside the outer span
        clock[0] += 4.0  # the outer span waited 4 s for the worker, which says it worked 3 of them
    totals = spans.take()
    assert totals == {"outer": pytest.approx((1.0 + 4.0 - 3.0, 1)), "inner": (2.5, 2), "worker: work": (3.0, 4)}
    assert sum(s for s, _ in totals.values()) == pytest.approx(7.5)  # the outer span's whole duration
    assert spans.take() == {}  # taken: empty again


def test_spans_cost_nothing_and_record_nothing_when_off(clock):
    spans.enable(False)
    with spans.span("outer"):
        clock[0] += 1.0
    spans.absorb({"x": (1.0, 1)})
    assert spans.take() == {}


def test_the_table_says_what_the_spans_leave_of_the_wall(clock):
    rows = spans.table({"a": (3.0, 1), "b": (5.0, 2)}, 10.0)
    assert [r["span"] for r in rows] == ["b", "a", "untraced"]
    assert rows[-1]["s"] == pytest.approx(2.0) and rows[0]["share"] == pytest.approx(0.5)
    text = spans.lines({"a": (3.0, 1), "b": (5.0, 2)}, 10.0, limit=2)
    assert len(text) == 3 and "untraced" in text[-1] and "b " in text[1]  # the largest, then untraced, kept


def test_a_sweep_traced_says_where_its_wall_went(tmp_path, capsys):
    """A real sweep, one worker, two later visits (no re-measurement, whatever the load): the worker's
    own parts come back with each job, and the spans written to spans.json add up to the command's
    wall (untraced: what is left, never less than nothing); the timed samples match the sweep's own."""
    out = tmp_path / "run"
    assert main(["sweep", "--variants", "naive,sdpa", "--seq-lens", "16,32", "--heads", "2", "--head-dims", "8",
                 "--masks", "none", "--directions", "fwd", "--device", "cpu", "--budget-ms", "5", "--visits", "3",
                 "--remeasure", "0", "--no-report", "--quiet", "--out", str(out), "--trace-spans"]) == 0
    text = capsys.readouterr().out
    assert "where the" in text and "spans: " in text
    data = json.loads((out / spans.SPANS).read_text())
    by = {r["span"]: r for r in data["spans"]}
    for part in ("worker: float64 reference", "worker: checked call against the reference", "worker: memory pass",
                 "worker: timed samples", "worker: visit: timed samples", "worker: setup (naive)",
                 "start-up: the projection", "sweep: rows written"):
        assert by[part]["s"] >= 0 and by[part]["count"] >= 1, part
    assert by["worker: setup (sdpa)"]["count"] == 2  # two cases, one setup each
    assert by["worker: visit: setup (sdpa)"]["count"] == 4  # and one at each later visit
    total = sum(r["s"] for r in data["spans"])
    assert total == pytest.approx(data["wall_s"])
    assert by["untraced"]["s"] >= -1e-6 * data["wall_s"]  # no span counted twice
    timed = by["worker: timed samples"]["s"] + by["worker: visit: timed samples"]["s"]
    assert timed == pytest.approx(data["timed_s"], rel=1e-6)
    assert not spans.enabled() or spans.take() == {}  # the totals were taken at the end
