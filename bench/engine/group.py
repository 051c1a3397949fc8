"""A worker as a group of processes: the ranks of a context-parallel cell (``--ranks``).

A cell of P ranks runs in P rank processes that the worker starts (``python -m bench.engine.rank``)
with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and that meet
at its rendezvous (``torch.distributed.init_process_group("env://")``: gloo on the CPU, NCCL on
CUDA, one GPU per rank).  The group is kept for the worker's next cells of the same world size and
device, and torn down and started afresh after a fault.  The ranks live in the worker's process group
and die with it (the sweep's kill of a worker takes its ranks along; each rank also asks the kernel
for a signal when the worker dies), so no rank outlives its cell's worker.

A fault ends the cell on every rank, each rank's variant with a row: a rank that raises gives its
status and reason (``bench.measure.origin.classify``, on the rank); a rank that dies, a crash; a
rank that does not answer within the cell's timeout, a timeout.  The group is then killed, so no
rank is left waiting in a collective.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Listener

from bench.engine import hosts as _hosts
from bench.engine.hosts import rank_cores as _rank_cores  # (a rank's cores: the same rule on every node)

START_TIMEOUT_S = 180.0  # P processes importing torch and meeting at the rendezvous (a busy machine: slow)
AFTER_FAULT_S = 2.0  # after one rank's fault, how long the others have to answer before the group is killed


class GroupFault(Exception):
    """The cell's group could not give a result: ``status`` (error, crash, timeout, oom,
    unsupported) and ``reason`` for every rank's row; ``kind``: the reason's kind."""

    def __init__(self, status: str, reason: str, kind: str = ""):
        super().__init__(reason)
        self.status, self.reason, self.kind = status, reason, kind


@dataclass(frozen=True)
class RankJob:
    variant: str
    case: dict
    settings: object  # the worker's MeasureSettings


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _death(code: int | str | None, node: int = 0) -> str:
    if code == "lost":  # (bench.engine.hosts.RemoteHost.LOST)
        return f"(on node {node}) could not be heard: its node's rank host went away"
    if node:
        return f"(on node {node}) {_death(code)}"
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class RankGroup:
    """``world`` rank processes on ``device`` (each with ``threads`` CPU threads), the ``plugins``
    files loaded in each, met at one rendezvous; ``run`` gives each the same job."""

    def __init__(self, world: int, device: str, plugins=(), threads: int = 1, timeout_s: float = 600.0):
        self.world, self.device, self.plugins, self.threads = world, device, tuple(plugins), threads
        self.timeout_s = timeout_s
        self.procs: list = []  # a Popen each, or a RemoteRank (bench.engine.hosts) for another node's
        self.nodes: list[int] = []  # the node each rank runs on (0: this one)
        self.conns: list = []
        self._listener = None
        self._dir = None

    @property
    def key(self) -> tuple:
        return self.world, self.device, self.plugins, self.threads

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        here = len([g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]) \
            if self.device == "cuda" else self.world
        from bench.errors import UsageError

        try:
            blocks = _hosts.split(self.world, self.device, here or self.world)
        except UsageError as exc:
            raise GroupFault("unsupported", str(exc), "unsupported") from None
        self.nodes = [node for node, count in enumerate(blocks) for _ in range(count)]
        self._dir = tempfile.TemporaryDirectory(prefix="attnbench-ranks-")
        authkey = secrets.token_bytes(16)
        if len(blocks) > 1:  # ranks on other nodes: the rendezvous where they reach it
            me = os.environ.get(_hosts.HOST_ENV) or socket.gethostname()
            self._listener = Listener(("0.0.0.0", 0), family="AF_INET", authkey=authkey)
            address, family, master = f"{me}:{self._listener.address[1]}", "AF_INET", me
        else:
            self._listener = Listener(os.path.join(self._dir.name, "rendezvous"), family="AF_UNIX", authkey=authkey)
            address, family, master = self._listener.address, "AF_UNIX", "127.0.0.1"
        port = _free_port()
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        first = 0
        for node, count in enumerate(blocks):
            envs = [dict(RANK=str(rank), WORLD_SIZE=str(self.world), LOCAL_RANK=str(rank - first),
                         LOCAL_WORLD_SIZE=str(count), MASTER_ADDR=master, MASTER_PORT=str(port),
                         ATTNBENCH_RANK_ADDRESS=address, ATTNBENCH_RANK_FAMILY=family, ATTNBENCH_RANK_KEY=authkey.hex())
                    for rank in range(first, first + count)]
            first += count
            if node:
                try:
                    host = _hosts.RemoteHost.start(node, envs, self.threads, self.device, timeout_s)
                except (OSError, EOFError, TimeoutError, RuntimeError) as exc:
                    self.kill()
                    raise GroupFault("crash", f"ranks {envs[0]['RANK']}-{envs[-1]['RANK']} of {self.world} could not "
                                              f"start on node {node}: {exc}", "crash") from None
                self.procs.extend(_hosts.RemoteRank(host, i) for i in range(count))
                continue
            for local, given in enumerate(envs):
                env = dict(os.environ, **given, ATTNBENCH_WORKER_PID=str(os.getpid()),
                           OMP_NUM_THREADS=str(self.threads),
                           # on the CPU each rank on cores of its own where the worker has enough, else on all of them
                           ATTNBENCH_RANK_CPUS=",".join(map(str, _rank_cores(cores, local, count, self.threads)))
                           if self.device == "cpu" else "")
                self.procs.append(subprocess.Popen([sys.executable, "-m", "bench.engine.rank"], env=env,
                                                   stdin=subprocess.DEVNULL))
        conns: dict = {}
        accepted = threading.Thread(target=self._accept, args=(conns,), daemon=True)
        accepted.start()
        deadline = time.monotonic() + timeout_s
        while accepted.is_alive() and time.monotonic() < deadline:
            dead = [r for r, p in enumerate(self.procs) if p.poll() is not None]
            if dead:
                why = _death(self.procs[dead[0]].returncode, self.nodes[dead[0]])
                self.kill()
                raise GroupFault("crash", f"rank {dead[0]} of {self.world} {why} "
                                          f"before the group met", "crash")
            accepted.join(0.2)
        if accepted.is_alive():
            self.kill()
            raise GroupFault("timeout", f"the {self.world} ranks did not meet within {timeout_s:g} s", "timeout")
        self.conns = [conns[r] for r in range(self.world)]
        for conn in self.conns:
            conn.send({"device": self.device, "plugins": self.plugins, "threads": self.threads,
                       "timeout_s": self.timeout_s})
        replies = self._collect(max(1.0, deadline - time.monotonic()), "meeting at the rendezvous")
        bad = [(r, x) for r, x in enumerate(replies) if x[0] != "ready"]
        if bad:
            self.kill()
            rank, (status, kind, why) = bad[0][0], bad[0][1][:3]
            raise GroupFault(status, f"rank {rank} of {self.world} could not join the group: {why}", kind)

    def _accept(self, conns: dict) -> None:
        while len(conns) < self.world:
            try:
                conn = self._listener.accept()
            except OSError:
                return
            rank = conn.recv()
            conns[int(rank)] = conn

    def _collect(self, timeout_s: float, doing: str) -> list:
        """Each rank's reply, in rank order; a GroupFault (the group killed) when one dies, or does not
        answer within ``timeout_s`` (or within AFTER_FAULT_S of another rank's fault)."""
        replies: dict = {}
        deadline = time.monotonic() + timeout_s
        while len(replies) < self.world:
            for rank, conn in enumerate(self.conns):
                if rank in replies:
                    continue
                try:
                    if conn.poll(0):
                        replies[rank] = pickle.loads(conn.recv_bytes())
                        if replies[rank][0] not in ("ok", "ready"):
                            deadline = min(deadline, time.monotonic() + AFTER_FAULT_S)
                        continue
                except (EOFError, OSError):
                    pass
                if self.procs[rank].poll() is not None:
                    why = _death(self.procs[rank].returncode, self.nodes[rank])
                    self.kill()
                    raise GroupFault("crash", f"rank {rank} of {self.world} {why} while {doing}", "crash")
            if len(replies) == self.world:
                break
            if time.monotonic() > deadline:
                missing = [r for r in range(self.world) if r not in replies]
                faults = [(r, x) for r, x in replies.items() if x[0] not in ("ok", "ready")]
                self.kill()
                if faults:  # one rank raised and the others wait for it in a collective
                    rank, (status, kind, why) = faults[0][0], faults[0][1][:3]
                    raise GroupFault(status, f"rank {rank} of {self.world}: {why}", kind)
                raise GroupFault("timeout", f"rank{'s' if len(missing) > 1 else ''} "
                                            f"{', '.join(map(str, missing))} of {self.world} gave no result within "
                                            f"{timeout_s:g} s while {doing}", "timeout")
            time.sleep(0.005)
        return [replies[r] for r in range(self.world)]

    def run(self, job: RankJob, timeout_s: float) -> list:
        """Each rank's measurement (bench.scopes.context.RankMeasured), in rank order, or a
        GroupFault.  A fault the ranks all raised before any collective leaves the group as it was."""
        for conn in self.conns:
            conn.send(job)
        replies = self._collect(timeout_s, f"measuring {job.variant}")
        faults = [(r, x) for r, x in enumerate(replies) if x[0] != "ok"]
        if faults:
            rank, (status, kind, why) = faults[0][0], faults[0][1][:3]
            if not (len(faults) == self.world and all(x[3] for _, x in faults)):
                self.kill()  # the ranks are out of step in their collectives: a fresh group for the next cell
            raise GroupFault(status, f"rank {rank} of {self.world}: {why}", kind)
        return [x[1] for x in replies]

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        end = time.monotonic() + 10.0
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, end - time.monotonic()))
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(10)
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        if self._dir is not None:
            with contextlib.suppress(OSError):
                self._dir.cleanup()
        self.procs, self.conns, self._listener, self._dir, self.nodes = [], [], None, None, []


_GROUPS: dict = {}  # the worker's live groups by (world, device, plugins, threads): idle ranks wait, using no CPU
KEEP = 4  # groups a worker keeps (the last used): a sweep over --ranks 1,2,4 switches between them case by case
WORKER = {"plugins": (), "timeout_s": 0.0}  # the worker's plugin files and its job's cell timeout


def configure(**given) -> None:
    """The worker's plugin files (its ranks load them) and its job's cell timeout (bench.engine.runner)."""
    WORKER.update({k: (tuple(v) if k == "plugins" else v) for k, v in given.items()})


def answer_within(started: float) -> float:
    """The seconds a group has to answer from now: what is left of the cell's timeout since
    ``started`` (a monotonic time), less a margin, so that the group's own verdict comes before the
    sweep's kill of the worker (the cell's timeout: 300 s without one given)."""
    timeout = WORKER["timeout_s"] or 300.0
    return max(1.0, 0.9 * timeout - (time.monotonic() - started))


def group_for(world: int, device: str, plugins, threads: int, timeout_s: float) -> RankGroup:
    """The worker's group of ``world`` ranks, started (or started again after a fault) as needed.
    ``timeout_s``: the ranks' collectives', and their meeting's (START_TIMEOUT_S at most)."""
    key = (world, device, tuple(plugins), threads)
    held = _GROUPS.pop(key, None)
    if held is not None and not held.alive():
        held.kill()
        held = None
    if held is None:
        held = RankGroup(world, device, plugins, threads, timeout_s)
        try:
            held.start(min(START_TIMEOUT_S, timeout_s))
        except GroupFault:
            held.kill()
            raise
    _GROUPS[key] = held  # the last used at the end
    while len(_GROUPS) > KEEP:
        _GROUPS.pop(next(iter(_GROUPS))).close()
    return held


def close_groups() -> None:
    """Every group of the worker closed (its ranks told to leave, then killed if they do not)."""
    while _GROUPS:
        _GROUPS.popitem()[1].close()
