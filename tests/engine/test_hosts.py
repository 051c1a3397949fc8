"""Ranks past one node (bench.engine.hosts): a job of several nodes, its task 0's sweep and a rank
host on each other node; how a world is split over the nodes, what is refused before a job is
submitted, and a real two-task job of submitit's local executor (each task standing in for a
node) whose cells' second rank runs on the other task: checked, a killed rank there a crash, and
no rank left once the job has ended."""

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import read_jsonl, run_cli
from tests.support.procs import processes_with

KILLED = '''
import os
import signal

from bench.registry import variant
from variants.cp import heads_reason, ulysses_around


@variant("cp.killed", description="rank 1 kills itself", masks=("none",), cross=False, backward=False,
         shard="contiguous")
def killed(case, ctx):
    def attention(q, k, v):
        if ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        (k2, v2) = ctx.ring_pass(k, v)
        return q + 0 * k2.sum() + 0 * v2.sum()
    return attention


for local in ("naive", "nosuch"):  # Ulysses around a one-process variant of the sweep's, and around none
    variant(f"cp.alltoall.{local}", description=f"Ulysses around {local}", masks=("none",), cross=False,
            shard="contiguous", check=heads_reason)(ulysses_around(local))
'''


@pytest.fixture
def job_of(monkeypatch, tmp_path):
    from bench.engine import hosts

    def nodes(n: int) -> None:
        monkeypatch.setenv(hosts.HOSTS_ENV, str(tmp_path))
        monkeypatch.setenv(hosts.NODES_ENV, str(n))
    return nodes


def test_a_world_fills_a_nodes_gpus_before_the_next_and_spreads_evenly_over_cpu_nodes(job_of):
    from bench.engine.hosts import split
    from bench.errors import UsageError

    assert split(8, "cuda", 4) == [8]  # a job of one node: all here
    job_of(2)
    assert split(4, "cuda", 4) == [4] and split(2, "cuda", 4) == [2]  # within a node: stays on it
    assert split(8, "cuda", 4) == [4, 4]
    assert split(2, "cpu", 2) == [1, 1] and split(4, "cpu", 4) == [2, 2] and split(3, "cpu", 3) == [2, 1]
    assert split(1, "cpu", 1) == [1]
    with pytest.raises(UsageError, match="needs 3 nodes of 4 rank"):
        split(12, "cuda", 4)


def test_a_world_the_nodes_cannot_hold_is_refused_before_the_job_is_submitted():
    from bench.engine.hosts import check_world
    from bench.errors import UsageError

    check_world([1, 4, 8], 2, 4, "cuda")
    for ranks in ([6], [12]):
        with pytest.raises(UsageError, match="takes whole nodes"):
            check_world(ranks, 2, 4, "cuda")


def test_a_slot_of_a_job_of_several_nodes_holds_its_nodes_gpus_for_a_world_past_them(job_of):
    from bench.engine.placement import place

    job_of(2)
    (one,) = place("cuda", None, None, [], None, None, world=8, count=4)
    assert one.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_the_local_executor_refuses_nodes_that_would_share_its_gpus(tmp_path):
    pytest.importorskip("submitit")
    from bench.errors import UsageError
    from bench.features.shards import jobs
    from bench.model.spec import Spec

    spec = Spec(variants=["cp.ring"], seq_lens=[64], heads=[2], head_dims=[16], batch=[1], dtypes=["bfloat16"],
                masks=["none"], window=[64], directions=["fwd"], device="cuda", executor="local", ranks=[2],
                slurm_nodes=2)
    with pytest.raises(UsageError, match="would share this machine's GPUs"):
        jobs.submit(spec, tmp_path / "sweep", 1, 60.0)
    assert not (tmp_path / "sweep").exists()  # refused before anything is written


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc to find what is left running")
@pytest.mark.slow
def test_a_job_of_two_nodes_runs_each_cells_second_rank_on_the_other_node(tmp_path):
    pytest.importorskip("submitit")
    plugin = tmp_path / "killed.py"
    plugin.write_text(KILLED)
    sweep = tmp_path / "sweep"
    variants = "cp.ring,cp.killed,cp.alltoall.naive,cp.alltoall.nosuch"
    proc = run_cli("sweep", "--executor", "local", "--shards", "1", "--slurm-nodes", "2", "--plugin", plugin,
                   "--variants", variants, "--ranks", "2", "--seq-lens", "64", "--heads", "4", "--head-dims", "16",
                   "--masks", "none", "--directions", "fwd", "--budget-ms", "20", "--timeout", "30", "--device", "cpu",
                   "--out", sweep, "--no-report")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {(r["variant"], r["ranks"]): r for r in read_jsonl(sweep / "merged" / "results.jsonl")}
    for name in ("cp.ring", "cp.alltoall.naive"):  # (Ulysses around the naive variant: any local one)
        r = rows[(name, 2)]
        assert r["status"] == "ok" and r["rel_err"] < 1e-5, r
        assert min(r["rank_bytes_sent"]) > 0  # the ranks exchanged their shards, node to node
    nothing_inside = rows[("cp.alltoall.nosuch", 2)]
    assert nothing_inside["status"] == "unsupported" and "no variant 'nosuch'" in nothing_inside["reason"]
    killed = rows[("cp.killed", 2)]
    assert killed["status"] == "crash" and "(on node 1)" in killed["reason"] and "SIGKILL" in killed["reason"]
    host_log = next((sweep / "submitit").glob("*_1_log.err")).read_text()
    assert host_log.count("node 1: started ranks 1 of 2") >= 2  # a fresh group after the crash
    assert processes_with("ATTNBENCH_RANK_FAMILY=AF_INET") == []  # the hosts left with the job, and their ranks


@pytest.mark.slow  # a rank process
def test_a_rank_reaches_a_worker_on_another_node_by_host_and_port(tmp_path, monkeypatch):
    """The rank's side of the TCP rendezvous: it connects to host:port with the group's key and
    says its rank (the worker's listener here, in this process)."""
    import secrets
    import subprocess
    from multiprocessing.connection import Listener

    key = secrets.token_bytes(16)
    with Listener(("127.0.0.1", 0), family="AF_INET", authkey=key) as listener:
        env = dict(os.environ, RANK="3", WORLD_SIZE="4", ATTNBENCH_RANK_ADDRESS=f"127.0.0.1:{listener.address[1]}",
                   ATTNBENCH_RANK_FAMILY="AF_INET", ATTNBENCH_RANK_KEY=key.hex(), ATTNBENCH_WORKER_PID=str(os.getpid()),
                   PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        rank = subprocess.Popen([sys.executable, "-m", "bench.engine.rank"], env=env, stdin=subprocess.DEVNULL)
        try:
            with listener.accept() as conn:
                assert conn.recv() == 3
        finally:
            rank.kill()
            rank.wait(10)

