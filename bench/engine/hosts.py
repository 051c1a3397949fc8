"""Ranks past one node: a job of several nodes (``--slurm-nodes N``), its first node's sweep and,
on each other node, a rank host that starts the ranks a cell's group asks of it.

A job of N nodes runs one task per node (submitit: Slurm's tasks, or the local executor's, each
standing in for a node).  Task 0 runs the shard's sweep; tasks 1..N-1 run ``serve``: each listens
on a port of its node and says where in ``<dir>/node-<i>.json`` (``dir``: a folder of the job's in
submitit's, on the file system the nodes share), with the job's key (made by the submitter, given
to every task).  A worker of task 0 whose cell spans nodes (``split``) starts its own block of
ranks as ever and asks each further node's host for the next block: the host starts them
(``python -m bench.engine.rank``, with the group's rendezvous on task 0's node), pins them to its
cores, tells the worker when one dies, and kills them when the worker asks, or goes away.  The
hosts leave when task 0's sweep ends (``done``) or stops beating (``alive``, touched every few
seconds), so no rank outlives its job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)  # printed by the handler the command line installs (bench.engine.events)

HOSTS_ENV = "ATTNBENCH_RANK_HOSTS"  # task 0's workers: the folder of the job's hosts
KEY_ENV = "ATTNBENCH_RANK_HOSTS_KEY"  # the job's key (hex)
NODES_ENV = "ATTNBENCH_RANK_NODES"  # the job's nodes
HOST_ENV = "ATTNBENCH_RANK_HOST"  # the name the other nodes reach task 0's node by
BEAT_S = 5.0  # task 0 touches ``alive`` this often
SILENT_S = 60.0  # a host leaves once ``alive`` is this old (task 0 gone without saying ``done``)
WAIT_S = 600.0  # a host leaves when task 0 has not beaten within this long of its start


def nodes() -> int:
    """The nodes of this job (1 outside a job of several)."""
    return max(1, int(os.environ.get(NODES_ENV) or 1)) if os.environ.get(HOSTS_ENV) else 1


def split(world: int, device: str, here: int) -> list[int]:
    """How many of a ``world``'s ranks each node runs, node 0 first: all on this node in a job of
    one node; on GPUs, ``here`` (this node's GPUs) a node, whole nodes; on the CPU, spread evenly
    over the job's nodes (each rank gets more of a node's cores)."""
    n = nodes()
    if n == 1 or world == 1:
        return [world]
    per = here if device == "cuda" else math.ceil(world / n)
    if device == "cuda" and world <= here:
        return [world]
    blocks = [per] * (world // per) + ([world % per] if world % per else [])
    if len(blocks) > n:
        from bench.errors import UsageError

        raise UsageError(f"--ranks {world} needs {len(blocks)} nodes of {per} rank(s) and the job has {n}: "
                         f"give --slurm-nodes {len(blocks)} or --ranks {n * per} or fewer")
    return blocks


def check_world(ranks, nodes_: int, gpus_per_node: int | None, device: str) -> None:
    """A sweep of several nodes refused before it is submitted when a world cannot be placed:
    on GPUs a world larger than a node takes whole nodes (a multiple of the GPUs per node)."""
    from bench.errors import UsageError

    for world in (r for r in ranks or [1] if r != "all"):
        if device == "cuda" and gpus_per_node:
            if world > gpus_per_node and (world % gpus_per_node or world > nodes_ * gpus_per_node):
                raise UsageError(f"--ranks {world} over --slurm-nodes {nodes_} of {gpus_per_node} GPU(s): a world "
                                 f"larger than a node takes whole nodes (valid: up to {gpus_per_node}, or a multiple "
                                 f"of it up to {nodes_ * gpus_per_node})")
        elif world > 1 and math.ceil(world / math.ceil(world / nodes_)) > nodes_:
            raise UsageError(f"--ranks {world} cannot be spread over --slurm-nodes {nodes_}")


# -- task 0: the job's side --------------------------------------------------------------------------------


@contextlib.contextmanager
def leading(folder: Path, key: str, count: int, host: str):
    """Task 0's sweep, with its workers told where the job's hosts are; the hosts told to leave at
    its end."""
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.update({HOSTS_ENV: str(folder), KEY_ENV: key, NODES_ENV: str(count), HOST_ENV: host})
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                (folder / "alive").touch()
            stop.wait(BEAT_S)

    threading.Thread(target=beat, daemon=True, name="bench-hosts-beat").start()
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            (folder / "done").touch()


def reach(node: int, timeout_s: float):
    """A connection to node ``node``'s host (waiting for it to say where it is), and what it said."""
    from multiprocessing.connection import Client

    folder, key = Path(os.environ[HOSTS_ENV]), bytes.fromhex(os.environ[KEY_ENV])
    where = folder / f"node-{node}.json"
    deadline = time.monotonic() + timeout_s
    while not where.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node}'s rank host did not start within {timeout_s:g} s")
        time.sleep(0.2)
    said = json.loads(where.read_text())
    return Client((said["host"], int(said["port"])), family="AF_INET", authkey=key), said


# -- tasks 1..N-1: a node's rank host ----------------------------------------------------------------------


def rank_cores(cores: list[int], rank: int, world: int, threads: int) -> list[int]:
    """The cores rank ``rank`` of a node's ``world`` runs on: ``threads`` of ``cores`` of its own
    where they go round, all of them where they do not (the cell is then contended)."""
    if len(cores) < world * threads:
        return cores
    return cores[rank * threads:(rank + 1) * threads]


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def serve(folder: Path, node: int, key: str, host: str) -> int:
    """Node ``node``'s rank host until task 0's sweep ends; returns the groups it served."""
    from multiprocessing.connection import Listener

    folder.mkdir(parents=True, exist_ok=True)
    listener = Listener(("0.0.0.0", 0), family="AF_INET", authkey=bytes.fromhex(key))
    said = {"host": host, "port": listener.address[1], "pid": os.getpid(), "cores": len(_cores())}
    tmp = folder / f".node-{node}.json"
    tmp.write_text(json.dumps(said))
    tmp.replace(folder / f"node-{node}.json")
    log.info(f"node {node}: rank host on {host}:{said['port']}")
    busy, served, started = threading.Lock(), [0], time.monotonic()

    def accept() -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError:
                return
            threading.Thread(target=_group, args=(conn, node, busy, served), daemon=True).start()

    threading.Thread(target=accept, daemon=True, name="bench-host-accept").start()
    try:
        while not (folder / "done").exists():
            alive = folder / "alive"
            if alive.exists() and time.time() - alive.stat().st_mtime > SILENT_S:
                log.warning(f"node {node}: task 0 has not touched {alive} for {SILENT_S:g} s; the host leaves")
                break
            if not alive.exists() and time.monotonic() - started > WAIT_S:
                break
            time.sleep(0.5)
    finally:
        with contextlib.suppress(OSError):
            listener.close()
        for procs in list(_LIVE.values()):
            _kill(procs)
    return served[0]


_LIVE: dict = {}  # a host's groups' rank processes, by connection


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(10)


def _group(conn, node: int, busy: threading.Lock, served: list) -> None:
    """One group's ranks on this node: started as asked, their deaths told, killed when asked or
    when the worker goes away."""
    if not busy.acquire(blocking=False):
        with contextlib.suppress(OSError):
            conn.send(("busy", f"node {node} is running another cell's ranks"))
            conn.close()
        return
    procs: list = []
    try:
        ask = conn.recv()
        envs, threads, device = ask["envs"], int(ask["threads"]), ask["device"]
        cores = _cores()
        for i, given in enumerate(envs):
            env = dict(os.environ, **given, ATTNBENCH_WORKER_PID=str(os.getpid()), OMP_NUM_THREADS=str(threads),
                       ATTNBENCH_RANK_CPUS=",".join(map(str, rank_cores(cores, i, len(envs), threads)))
                       if device == "cpu" else "")
            procs.append(subprocess.Popen([sys.executable, "-m", "bench.engine.rank"], env=env,
                                          stdin=subprocess.DEVNULL))
        _LIVE[id(conn)] = procs
        served[0] += 1
        log.info(f"node {node}: started ranks {', '.join(e['RANK'] for e in envs)} of {envs[0]['WORLD_SIZE']}")
        conn.send(("started", [p.pid for p in procs]))
        told: set = set()
        while True:
            if conn.poll(0.05):
                if conn.recv() == "kill":
                    break
            for i, p in enumerate(procs):
                if i not in told and p.poll() is not None:
                    told.add(i)
                    conn.send(("died", i, p.returncode))
    except (EOFError, OSError):
        pass  # the worker went away: its ranks go with it
    finally:
        _kill(procs)
        _LIVE.pop(id(conn), None)
        with contextlib.suppress(OSError):
            conn.close()
        busy.release()


class RemoteRank:
    """A rank another node's host started, as the worker's group sees it (a Popen's poll, kill,
    wait and returncode)."""

    def __init__(self, host: RemoteHost, index: int):
        self.host, self.index = host, index

    @property
    def returncode(self):
        return self.host.codes.get(self.index)

    def poll(self):
        self.host.pump()
        return self.returncode

    def kill(self) -> None:
        self.host.stop()

    def wait(self, timeout: float | None = None):
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("rank", timeout)
            time.sleep(0.05)
        return self.returncode


class RemoteHost:
    """The worker's connection to one node's host, for one group: its ranks' deaths as they come."""

    LOST = "lost"  # what a rank's code reads as when its host can no longer be heard (its node gone)

    def __init__(self, node: int, conn, count: int):
        self.node, self.conn, self.count, self.codes = node, conn, count, {}

    @classmethod
    def start(cls, node: int, envs: list[dict], threads: int, device: str, timeout_s: float) -> RemoteHost:
        conn, _ = reach(node, timeout_s)
        conn.send({"envs": envs, "threads": threads, "device": device})
        if not conn.poll(timeout_s):
            conn.close()
            raise TimeoutError(f"node {node}'s rank host did not answer within {timeout_s:g} s")
        reply = conn.recv()
        if reply[0] != "started":
            conn.close()
            raise RuntimeError(reply[1])
        return cls(node, conn, len(envs))

    def pump(self) -> None:
        try:
            while self.conn is not None and self.conn.poll(0):
                _, index, code = self.conn.recv()
                self.codes[index] = code
        except (EOFError, OSError):
            self._lost()

    def _lost(self) -> None:
        for i in range(self.count):
            self.codes.setdefault(i, self.LOST)
        with contextlib.suppress(OSError):
            if self.conn is not None:
                self.conn.close()
        self.conn = None

    def stop(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.send("kill")
            self._lost()
