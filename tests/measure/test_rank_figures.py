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


def test_the_communication_the_compute_hid_is_the_collectives_time_the_step_did_not_wait_for():
    steps = [2.0, 2.1, 2.0, 2.2, 2.0, 2.1]
    comm = [0.25] * 6
    row = {"status": "ok", "samples_ms": steps, "rank_samples_ms": [steps, steps], "rank_comm_ms": [comm, comm],
           "rank_collective_ms": [0.8, 1.2],  # the profiled step's collectives ran for up to 1.2 ms
           "rank_collective_wait_ms": [0.2, 0.3]}  # and it waited for them 0.5 ms in all
    out = row_figures(row)
    assert out["collective_ms"] == pytest.approx(1.2)
    assert out["comm_hidden"] == pytest.approx(1 - 0.5 / 2.0)
    blocking = row_figures(dict(row, rank_collective_wait_ms=[0.8, 1.2]))  # waited for all of it: nothing hidden
    assert blocking["comm_hidden"] == 0.0


def test_a_profiled_step_counts_the_time_inside_gloos_collectives_within_the_step():
    """A real gloo group of one process, profiled: the all-reduces inside the step's span are
    counted, those before it and the compute are not."""
    import datetime

    import torch
    import torch.distributed as dist

    from bench.scopes.context import STEP_MARK, collectives_ms

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        x = torch.randn(1 << 16)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(6):  # outside the step
                dist.all_reduce(x)
            with torch.profiler.record_function(STEP_MARK):
                dist.all_reduce(x)
                (x @ x).item()
        events = prof.events()
        step = next(e for e in events if e.name == STEP_MARK)
        inside = collectives_ms(events, cuda=False, window=(step.time_range.start, step.time_range.end))
        assert 0 < inside < collectives_ms(events, cuda=False)
        assert inside <= (step.time_range.end - step.time_range.start) / 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as alone:
            (x @ x).item()
        assert collectives_ms(alone.events(), cuda=False) == 0.0  # compute alone: none
    finally:
        dist.destroy_process_group()
