"""A context-parallel cell's ranks as a process group (bench.engine.group): a rank that is killed,
hangs or raises ends the cell with a status and reason, within the cell's timeout, the group torn
down, no rank process left behind, and the sweep goes on to the next variant on a fresh group."""

import uuid
from pathlib import Path

import pytest

from tests.conftest import read_jsonl, run_cli
from tests.support.procs import processes_with

FAULTS = '''
import os
import signal
import time

from bench.registry import variant


def _faulty(fault):
    def factory(case, ctx):
        def attention(q, k, v):
            if ctx.rank == 1:
                if fault == "killed":
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault == "hangs":
                    time.sleep(600)
                raise ValueError("rank 1 gives up")
            (k2, v2) = ctx.ring_pass(k, v)  # rank 0 waits for rank 1 in a collective
            return q + 0 * k2.sum() + 0 * v2.sum()
        return attention
    return factory


for fault in ("killed", "hangs", "raises"):
    variant(f"cp.{fault}", description=f"rank 1 of its group {fault}", masks=("none",), cross=False,
            backward=False, shard="contiguous")(_faulty(fault))
'''


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc to find what is left running")
@pytest.mark.slow
def test_a_rank_killed_hung_or_raising_ends_its_cell_and_leaves_no_process(tmp_path):
    plugin = tmp_path / "faults.py"
    plugin.write_text(FAULTS)
    token = uuid.uuid4().hex
    out = tmp_path / "run"
    proc = run_cli("sweep", "--plugin", plugin, "--variants", "cp.killed,cp.hangs,cp.raises,cp.ring", "--ranks", "2",
                   "--seq-lens", "64", "--heads", "2", "--head-dims", "16", "--masks", "none", "--directions", "fwd",
                   "--budget-ms", "10", "--timeout", "12", "--device", "cpu", "--out", out, "--no-report", "--quiet",
                   env={"ATTNBENCH_TEST_TOKEN": token})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["variant"]: r for r in read_jsonl(out / "results.jsonl")}
    assert rows["cp.killed"]["status"] == "crash" and "rank 1 of 2 was killed by SIGKILL" in rows["cp.killed"]["reason"]
    assert rows["cp.hangs"]["status"] == "timeout" and "of 2 gave no result within" in rows["cp.hangs"]["reason"]
    raised = rows["cp.raises"]
    assert raised["status"] == "error" and "rank 1 of 2: ValueError: rank 1 gives up" in raised["reason"]
    assert rows["cp.ring"]["status"] == "ok"  # the next variant, on a fresh group
    assert processes_with(token) == []  # no rank (nor worker) outlives the sweep


def test_a_slot_of_a_ranked_sweep_holds_one_gpu_per_rank_and_says_when_the_node_has_too_few():
    from bench.engine.placement import place
    from bench.errors import UsageError

    (one,) = place("cuda", None, None, [], None, None, world=2, count=4)
    assert one.label == "cuda:0,1" and one.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    two = place("cuda", None, [0, 1, 2, 3], [], None, ["GPU-a", "GPU-b", "GPU-c", "GPU-d"], world=2, count=4)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in two] == ["GPU-a,GPU-b", "GPU-c,GPU-d"]
    with pytest.raises(UsageError, match="--ranks 4 runs a cell on 4 GPUs"):
        place("cuda", None, None, [], None, None, world=4, count=2)
    with pytest.raises(UsageError, match="--workers 3 with --ranks 2"):
        place("cuda", 3, None, [], None, None, world=2, count=4)


def test_each_rank_gets_cores_of_its_own_where_they_go_round():
    from bench.engine.group import _rank_cores

    assert [_rank_cores([4, 5, 6, 7], r, 2, 2) for r in range(2)] == [[4, 5], [6, 7]]
    assert _rank_cores([0, 1], 3, 4, 1) == [0, 1]  # 4 ranks on 2 cores: all of them (contended)


def test_a_ranks_death_on_another_node_and_the_loss_of_its_host_are_told_apart():
    from multiprocessing import Pipe

    from bench.engine.group import _death
    from bench.engine.hosts import RemoteHost, RemoteRank

    worker_end, host_end = Pipe()
    host = RemoteHost(1, worker_end, 2)
    first, second = RemoteRank(host, 0), RemoteRank(host, 1)
    assert first.poll() is None and second.poll() is None  # both running: nothing told
    host_end.send(("died", 1, -9))
    assert second.poll() == -9 and first.poll() is None
    assert _death(second.returncode, 1) == "(on node 1) was killed by SIGKILL"
    host_end.close()  # the node's host gone: every rank it held can no longer be heard
    assert first.poll() == RemoteHost.LOST and second.returncode == -9
    assert "host went away" in _death(first.returncode, 1)
