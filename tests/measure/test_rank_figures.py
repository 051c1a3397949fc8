"""A cell of several ranks stores each rank's samples; its figures come on read
(bench.measure.stats.rank_figures through row_figures), computed here from given samples."""

import pytest

from bench.measure.stats import row_figures


def test_the_step_is_the_slowest_rank_and_each_ranks_figures_come_from_its_own_samples():
    r0 = [2.0, 2.2, 2.1, 2.0, 2.3, 2.1, 2.2]
    r1 = [3.0, 2.0, 3.1, 3.2, 2.0, 3.0, 3.1]
    comm0 = [0.5, 1.1, 0.6, 0.5, 1.2, 0.6, 0.5]
    comm1 = [0.4, 0.3, 0.4, 0.5, 0.3, 0.4, 0.6]
    steps = [max(a, b) for a, b in zip(r0, r1)]
    row = {"status": "ok", "samples_ms": steps, "rank_samples_ms": [r0, r1], "rank_comm_ms": [comm0, comm1],
           "rank_bytes_sent": [4096, 8192], "flops": 1e9}
    out = row_figures(row)
    assert out["median_ms"] == pytest.approx(3.0)  # of the step, the slowest rank's at each sample
    assert out["rank_median_ms"] == pytest.approx([2.1, 3.0])
    at_slowest = sorted([0.4, 1.1, 0.4, 0.5, 1.2, 0.4, 0.6])  # rank 1 slowest but at samples 2 and 5
    assert out["comm_ms"] == pytest.approx(at_slowest[3])
    assert out["comm_share"] == pytest.approx(at_slowest[3] / 3.0)
    assert out["wait_ms"] == pytest.approx(3.0 - 2.1) and out["bytes_sent"] == 8192


def test_a_cell_of_one_process_has_no_rank_figures():
    out = row_figures({"status": "ok", "samples_ms": [1.0, 1.1, 0.9, 1.0, 1.0, 1.2]})
    assert "rank_median_ms" not in out and "comm_ms" not in out
