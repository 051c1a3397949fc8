"""Isolated execution: cells run in long-lived worker processes (torch is imported once per
worker, not once per cell).  A worker that crashes or overruns the cell timeout is killed, the
cell gets its row (crash / timeout), and a fresh worker takes the next cell."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from bench.engine import group, spans, vecisa
from bench.measure.settings import MeasureSettings
from bench.model.case import Case
from bench.model.row import DERIVED
from bench.runs import store

WORKER_START_TIMEOUT_S = 300.0


@dataclass
class WorkerSettings:
    """Where and with what a worker runs; how it measures is ``measure``, passed on untouched."""
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    plugins: list[str] = field(default_factory=list)
    log_path: str | None = None  # the worker's stdout and stderr go here
    env: dict = field(default_factory=dict)  # set before torch is imported (CUDA_VISIBLE_DEVICES)
    cpus: tuple = ()  # the cores this worker may use (its affinity); empty: any
    device: str = ""  # what its cells run on (the spec's device): a CPU worker never touches CUDA


# How a worker process starts.  Where no GPU driver is present: forked from a fork server that
# imported torch, dynamo and the worker's own modules once, so that a worker is ready in a tenth of
# a second instead of the ~5 s of CPU those imports take (a second worker, and every restart after a
# crash or a timeout, no longer pays them).  Where a GPU may be used: spawned, a fresh interpreter
# with no CUDA state inherited from anyone.
FORKSERVER_PRELOAD = ("torch", "torch._dynamo", "bench.engine.cell", "bench.engine.revisit", "bench.engine.discovery",
                      "bench.engine.forkserver")  # the last: its exit skips the interpreter's teardown
GPU_DRIVER_FILES = ("/dev/nvidiactl", "/dev/kfd", "/proc/driver/nvidia")


@functools.cache
def start_method() -> str:
    """'forkserver' on Linux with no GPU driver, else 'spawn'."""
    if sys.platform != "linux" or "forkserver" not in mp.get_all_start_methods():
        return "spawn"
    if any(os.path.exists(p) for p in GPU_DRIVER_FILES):
        return "spawn"
    return "forkserver"


def _preload() -> list[str]:
    """FORKSERVER_PRELOAD with the modules of the declared cell steps and kept objects
    (bench.model.features) before the fork server's own: the workers share them rather than import
    them at their start."""
    from bench.model.features import CORE, FEATURES

    steps = [ref.partition(":")[0] for f in (CORE, *FEATURES) for ref in (*f.steps, *f.kept)]
    return list(dict.fromkeys([*FORKSERVER_PRELOAD[:-1], *steps, FORKSERVER_PRELOAD[-1]]))


def _context():
    ctx = mp.get_context(start_method())
    if start_method() == "forkserver":
        ctx.set_forkserver_preload(_preload())  # read when the server starts (the first worker)
    return ctx


def _parent_env() -> dict | None:
    """The environment a forked worker takes over (a spawned one inherits it): the sweep's as it is
    now, not the fork server's from when it started."""
    return dict(os.environ) if start_method() == "forkserver" else None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


MMAP_THRESHOLD = 64 << 20  # glibc: blocks below this come from the heap, and the heap is not trimmed (mallopt)


def steady_heap() -> None:
    """Make glibc's allocator behave the same in every worker: by default a block of 128 KiB or
    more is mapped and unmapped at each call until a free raises the threshold, and the heap's
    top is given back to the system, so the same cell in two processes can pay page faults in
    one and not the other, by what ran before it (without this, naive at n = 512 took three
    times as long in one fresh worker as in another).  A fixed
    threshold and no trimming give each process the state a long-lived one settles into.
    Nothing where the C library is not glibc.  It cannot be undone: a worker of ``--heap system``
    never calls it, and never takes over a worker started ahead (which does)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (fixed: no dynamic adjustment)
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep the heap's top
    except (OSError, AttributeError):
        pass


def _pin(settings: WorkerSettings) -> None:
    """The worker's place (bench.engine.placement): its environment and its cores."""
    os.environ.update(settings.env)
    if settings.cpus:
        try:
            os.sched_setaffinity(0, settings.cpus)
        except (AttributeError, OSError):  # not Linux: the threads setting alone
            pass


def _device_name(device: str = "") -> str:
    """What a worker measures on: the GPU's name for a CUDA worker, else the CPU's (a CPU worker on
    a GPU host asks CUDA nothing, so it starts no CUDA context and its rows name the CPU)."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    from bench.measure.envinfo import cpu_name

    return cpu_name()


# -- the messages between the sweep and a worker -------------------------------------------------


@dataclass(frozen=True)
class Job:
    """sweep -> worker: measure the variants ``names`` on ``case`` (a Case as a dict); ``task``: a
    feature's job instead, ``"module:function"`` called as ``function(variants, case, settings=,
    emit=, at=)`` (a later visit, bench.engine.revisit.visit_group; the profiled pass,
    bench.features.profile.profiler.profile_group); ``skip_reference``: why the float64 reference cannot
    be had (the variants are then timed unchecked); ``measure`` and ``log_path``: the sweep's, for
    a worker kept from an earlier sweep of this process (``park``)."""
    names: tuple
    case: dict
    task: str = ""
    skip_reference: str = ""
    measure: MeasureSettings | None = None
    log_path: str | None = None
    trace: bool = False  # --trace-spans: the job's spans come back with Done
    flush: bool = False  # no case: what the features hold, finished (the contended cases held, timed again)
    timeout_s: float = 0.0  # the cell's timeout: a context-parallel cell's ranks answer within it (engine.group)


@dataclass(frozen=True)
class Imported:
    """worker -> sweep: a worker started ahead has done its imports and waits for its settings."""


@dataclass(frozen=True)
class Ready:
    """worker -> sweep: set up and waiting for jobs."""
    threads: int
    device: str


@dataclass(frozen=True)
class At:
    """worker -> sweep: the variant (or the reference) whose step runs now: its deadline starts."""
    name: str


@dataclass(frozen=True)
class Emitted:
    """worker -> sweep: one finished row."""
    row: dict


@dataclass(frozen=True)
class Done:
    """worker -> sweep: the job's every row is sent; with a traced job, its spans (bench.engine.spans)."""
    spans: dict | None = None


@dataclass(frozen=True)
class Restart:
    """worker -> sweep: a variant left work running (its row is sent); this worker takes no more."""
    why: str


# set in every worker before torch is imported.  TEARDOWN_CUPTI: the profiled call that names a
# GPU cell's kernels must not leave CUPTI attached, which slows every later kernel of the worker by
# 10-20% (PyTorch issue 144455, PR 146604); with it, Kineto tears CUPTI down when the profiler stops
WORKER_ENV = {"TEARDOWN_CUPTI": "1"}


def _launch(ctx, settings: WorkerSettings | None):
    """Start a worker process: (process, its connection, its lifeline).  The sweep holds the
    lifeline's sending end and never sends on it: when the sweep dies, however it dies, the
    worker sees the end of the lifeline and takes its process group down with it."""
    parent, child = ctx.Pipe()
    lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker_main, args=(child, settings, _parent_env(), lifeline_r), daemon=True)
    try:
        proc.start()
    finally:
        child.close()
        lifeline_r.close()
    return proc, parent, lifeline_w


def _hold_lifeline(lifeline) -> None:
    """Die with the sweep.  A forked worker's parent is the fork server, which lives as long as
    its children do, so the parent-death signal alone would leave it running: a thread blocked
    on the lifeline (no CPU, no wake-ups) kills the worker's process group when the sweep's end
    of it closes."""
    def wait() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        try:
            if os.getpgid(0) == os.getpid():  # its own group (setpgid): what the variant spawned goes too
                os.killpg(os.getpid(), signal.SIGKILL)
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, daemon=True, name="bench-lifeline").start()


def _worker_main(conn, settings: WorkerSettings | None, environ: dict | None = None, lifeline=None) -> None:
    settings = _enter(conn, settings, environ, lifeline)
    if settings is None:  # started ahead, and never given a sweep
        return
    import gc

    import torch

    from bench.engine.cell import ReferenceCache, WorkerTainted, after_timing, cuda_broken, worker_keeps
    from bench.engine.discovery import discover
    from bench.measure.cellsteps import kept_calls

    if settings.measure.threads:
        torch.set_num_threads(settings.measure.threads)
    registry = discover(settings.plugins)
    group.configure(plugins=settings.plugins)  # a context-parallel cell's ranks load them too
    after_timing()  # the declared steps' modules, imported now rather than in the first cell
    cell_settings = settings.measure.replace(threads=torch.get_num_threads())  # as the rows record it
    cache = ReferenceCache()
    vecisa.trust()  # Inductor's CPU probe, skipped where this machine's record says what it finds
    # what the features keep across cells (the memory record, contended cases held, the leftover
    # check's baseline, taken against the worker as it is now, its libraries' pools started first)
    kept = {keep.name: keep.make(_device_name(settings.device)) for keep in worker_keeps()}
    gc.collect()
    gc.freeze()  # torch's, the registry's and the kept objects: never scanned again by a collection
    conn.send(Ready(torch.get_num_threads(), _device_name(settings.device)))
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the sweep is gone
            job = None
        if job is None:
            for at_exit in kept_calls(kept, "on_exit"):
                at_exit()
            group.close_groups()
            return
        if job.log_path and job.log_path != settings.log_path:  # a parked worker at a new sweep's folder
            _log_to(job.log_path)
            settings = dataclasses.replace(settings, log_path=job.log_path)
        if job.measure is not None:
            cell_settings = job.measure.replace(threads=torch.get_num_threads())
        if job.trace != spans.enabled():
            spans.enable(job.trace)
        group.configure(timeout_s=job.timeout_s)
        try:
            with spans.span("the rest of a job"):
                _run_job(conn, job, registry, cell_settings, cache, kept)
        except WorkerTainted as exc:  # its row is sent; the rest of the case goes to a fresh worker
            conn.send(Restart(str(exc)))
            conn.close()
            os._exit(4)
        vecisa.learn()  # what this process's probe found, once, for the next workers
        for job_end in kept_calls(kept, "on_job_end"):
            job_end()
        conn.send(Done(spans.take() if job.trace else None))
        if cuda_broken():  # its rows are sent; a fresh worker takes the next case
            conn.close()
            os._exit(3)


def _enter(conn, settings: WorkerSettings | None, environ: dict | None, lifeline) -> WorkerSettings | None:
    """The worker process set up before its first job: the sweep's environment, dying with its
    parent, the heap it keeps, its cores, a process group of its own, torch imported; a worker
    started ahead (``settings`` None) then waits for its settings (None: it is not needed)."""
    if environ is not None:  # forked from the fork server: the sweep's environment, not the server's
        os.environ.clear()
        os.environ.update(environ)
    for key, value in WORKER_ENV.items():  # before torch is imported, here or by a prestarted worker
        os.environ.setdefault(key, value)
    _die_with_parent()
    if settings is None or settings.measure.heap != "system":  # one started ahead is only taken for a fixed heap
        steady_heap()
    if settings is not None:
        _pin(settings)
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills whatever the variant spawned too
    except OSError:
        pass
    if lifeline is not None:
        _hold_lifeline(lifeline)
    import torch  # noqa: F401

    if settings is None:  # started ahead (prestart), beside the sweep's own start-up
        import torch._dynamo  # noqa: F401  (torch.profiler's and flex's first use import it: ~1.5 s, paid here)

        conn.send(Imported())
        try:
            settings = conn.recv()
        except EOFError:
            return None
        if settings is None:
            return None
        _pin(settings)  # cores only: a worker with an environment to set is never started ahead
    if settings.log_path:  # native libraries write straight to fd 1 and 2
        _log_to(settings.log_path)
    return settings


def _run_job(conn, job, registry, cell_settings, cache, kept: dict) -> None:
    """One job: its case's cells (their rows sent as each finishes), a feature's task (``Job.task``),
    or a flush: what the features hold, finished (``on_flush``: the contended cases timed again)."""
    from bench.engine.cell import run_group
    from bench.measure.cellsteps import kept_calls

    measurements = not job.task  # a cell's row: its measurements; the figures come on read (bench.runs.store.measured)

    def emit(row):
        conn.send(Emitted({k: v for k, v in row.items() if k not in DERIVED} if measurements else row))

    def at(name):
        conn.send(At(name))

    if job.flush:
        for flush in kept_calls(kept, "on_flush"):
            flush(emit, at)
        return
    if job.task:
        module, _, name = job.task.partition(":")
        run = functools.partial(getattr(importlib.import_module(module), name), settings=cell_settings)
    else:
        run = functools.partial(run_group, settings=cell_settings, cache=cache, kept=kept,
                                skip_reference=job.skip_reference)
    run([registry[n] for n in job.names], Case.from_dict(job.case), emit=emit, at=at)


def _log_to(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


OOM_EVENTS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills() -> int | None:
    """The kernel's count of OOM kills in this cgroup (v2 memory.events, or v1), or None."""
    for path in OOM_EVENTS:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _death(exitcode, kills_before: int | None = None) -> tuple[str, str]:
    """(status, reason) for a worker that died: 'oom' when the kernel's OOM killer took it
    (its SIGKILL and a rise in the cgroup's oom_kill count), else 'crash'."""
    if exitcode is None:
        return "crash", "worker vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if name == "SIGKILL":
            after = oom_kills()
            if kills_before is not None and after is not None and after > kills_before:
                return "oom", f"the kernel's OOM killer ended the worker (SIGKILL; oom_kill {kills_before} -> {after})"
            return "crash", "worker died with SIGKILL (probably out of memory: the kernel's OOM killer sends SIGKILL)"
        return "crash", f"worker died with {name}"
    return "crash", f"worker exited with code {exitcode}"


def _kill_group(pid: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # the worker leads its own group
            os.killpg(pid, signal.SIGKILL)
    except (OSError, ProcessLookupError):
        pass


_PRESTARTED: list = []  # [process, connection, imported, lifeline] of workers started ahead of their settings
# the workers of a sweep start from their own threads: one at a time reads a prestarted worker's
# pipe and takes it (two readers of one pipe would leave one waiting for ever)
_PRESTART_LOCK = threading.RLock()


_STARTERS: list = []  # threads starting prestarted workers through the fork server (its start blocks)


def prestart(n: int = 1) -> None:
    """Start ``n`` workers now, before the sweep knows its settings, so that their imports
    (torch, dynamo) run beside the sweep's own start-up instead of after it.  Each Worker
    that starts without an environment to set takes one over; call ``wait_prestarted``
    before measuring anything.  Through the fork server, the starts wait for its imports:
    they run in a thread of their own, and this returns at once."""
    ctx = _context()

    def start(count: int) -> None:
        for _ in range(count):
            try:
                proc, parent, lifeline = _launch(ctx, None)
            except OSError:  # no fork server here: workers are started the ordinary way when needed
                return
            _PRESTARTED.append([proc, parent, False, lifeline])  # no lock: its holder may be joining this thread

    with _PRESTART_LOCK:
        _join_starters()
        count = n - len(_PRESTARTED)
    if count <= 0:
        return
    if start_method() == "spawn":
        start(count)
        return
    thread = threading.Thread(target=start, args=(count,), daemon=True, name="bench-prestart")
    thread.start()
    _STARTERS.append(thread)


def _join_starters() -> None:
    while _STARTERS:
        _STARTERS.pop().join()


def wait_prestarted(timeout_s: float = WORKER_START_TIMEOUT_S) -> None:
    """Block until the prestarted workers have finished their imports (they are idle from
    then on, so a measurement taken next has the cores to itself)."""
    with _PRESTART_LOCK:
        _wait_prestarted(timeout_s)


def _wait_prestarted(timeout_s: float) -> None:
    _join_starters()
    deadline = time.monotonic() + timeout_s
    for item in list(_PRESTARTED):
        proc, conn, imported, _ = item
        if imported:
            continue
        try:
            if conn.poll(max(0.0, deadline - time.monotonic())) and isinstance(conn.recv(), Imported):
                item[2] = True
                continue
        except (EOFError, OSError):
            pass
        _PRESTARTED.remove(item)  # it failed: a worker is started the ordinary way when needed
        if proc.is_alive():
            proc.kill()


def _take_prestarted():
    with _PRESTART_LOCK:
        _wait_prestarted(WORKER_START_TIMEOUT_S)
        while _PRESTARTED:
            proc, conn, _, lifeline = _PRESTARTED.pop()
            if proc.is_alive():
                return proc, conn, lifeline
        return None


def release_prestarted() -> None:
    """Stop the prestarted workers nobody took (a sweep that needed fewer)."""
    with _PRESTART_LOCK:
        _release_prestarted()


def _release_prestarted() -> None:
    _join_starters()
    while _PRESTARTED:
        proc, conn, imported, _ = _PRESTARTED.pop()
        if imported:  # idle, waiting for its settings: told to stop
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            proc.join(2)
        if proc.is_alive():  # still importing: nothing to finish
            proc.kill()
            proc.join()


_PARKED: list = []  # idle workers kept by park() for the next sweep of this process with the same place


def _place(settings: WorkerSettings) -> tuple:
    """What a worker is bound to for its life: its plugins, environment, cores, threads, heap and
    device, and whether it runs deterministic algorithms (cuBLAS reads CUBLAS_WORKSPACE_CONFIG at a
    process's first GEMM, so a worker that ran without them cannot take them up later)."""
    return (tuple(settings.plugins), tuple(sorted(settings.env.items())), tuple(settings.cpus),
            settings.measure.threads, settings.measure.heap, settings.device, settings.measure.deterministic)


def reuse(settings: WorkerSettings) -> Worker:
    """A parked worker started with the same place as ``settings`` (its imports, its registry
    and its compiled kernels kept: a script running several sweeps, such as gpu-check, pays a
    worker's start once), else a new one; each job carries the sweep's own measure settings."""
    for i, worker in enumerate(_PARKED):
        if _place(worker.settings) == _place(settings) and worker.alive:
            _PARKED.pop(i)
            worker.settings = dataclasses.replace(settings)
            return worker
    return Worker(settings)


def park(worker: Worker) -> None:
    """Keep ``worker`` idle for a later sweep of this process (``reuse``); stopped at exit."""
    if worker.alive:
        _PARKED.append(worker)
    if len(_PARKED) == 1:
        import atexit

        atexit.register(stop_parked)


def stop_parked() -> None:
    while _PARKED:
        _PARKED.pop().stop()


class Worker:
    """One worker process, restarted on demand after a crash or a timeout."""

    def __init__(self, settings: WorkerSettings):
        self.settings = settings
        self._ctx = _context()  # no inherited CUDA or thread state (start_method)
        self._proc = None
        self._conn = None
        self._lifeline = None  # held while the process lives (_launch)
        self.restarts = 0
        self.last_started: str | None = None  # the variant that ran when the worker died or hung
        self.device_name: str | None = None  # what it measures on, once started

    def _start(self) -> None:
        ahead = _take_prestarted() if not self.settings.env and self.settings.measure.heap != "system" else None
        if ahead is not None:  # its imports are done: it only needs the settings
            self._proc, parent, self._lifeline = ahead
            parent.send(self.settings)
        else:
            self._proc, parent, self._lifeline = _launch(self._ctx, self.settings)
        self._conn = parent
        if not parent.poll(WORKER_START_TIMEOUT_S):
            self.stop()
            raise RuntimeError("the worker did not start")
        try:
            ready = parent.recv()
        except EOFError:
            code = self._proc.exitcode
            self.stop()
            raise RuntimeError(f"the worker failed to start: {_death(code)[1]}") from None
        if not isinstance(ready, Ready):
            self.stop()
            raise RuntimeError(f"the worker said {ready!r} where it reports ready")
        self.device_name = ready.device

    def run_group(self, names: list[str], case: Case, timeout_s: float, on_row, task: str = "",
                  skip_reference: str = "") -> tuple[str, str]:
        """Run the variants ``names`` on ``case``; ``on_row(row)`` for each row as it arrives.
        Returns ('done', '') or ('timeout' | 'crash' | 'oom', reason) when a variant's step
        (its check, a timing turn, its memory pass) overran ``timeout_s`` beyond the timing
        budget, or the worker died; ``last_started`` names the variant that was running.
        ('restart', what) when a variant left work running (its row is sent): the worker is
        stopped, and the variants without a row run on a fresh one.
        The rows already passed on stay."""
        with spans.span("sweep: waiting on a worker (messages, gaps)"):
            return self._run_group(names, case, timeout_s, on_row, task, skip_reference)

    def flush(self, timeout_s: float, on_row) -> tuple[str, str]:
        """Time again the contended cases this worker holds (bench.features.contention.retime.Held), if it is alive;
        ``on_row`` for each new row."""
        if not self.alive:
            return "done", ""
        with spans.span("sweep: waiting on a worker (messages, gaps)"):
            return self._run_group((), None, timeout_s, on_row, "", "", flush=True)

    def _run_group(self, names, case, timeout_s, on_row, task, skip_reference, flush: bool = False) -> tuple[str, str]:
        if self._proc is None or not self._proc.is_alive():
            if self._proc is not None:
                self.restarts += 1
            try:
                with spans.span("sweep: worker start (a process, its imports)"):
                    self._start()
            except RuntimeError as exc:
                return "crash", str(exc)
        self._conn.send(Job(tuple(names), case.to_dict() if case is not None else {}, task, skip_reference,
                            self.settings.measure, self.settings.log_path, spans.enabled(), flush, timeout_s))
        self.last_started = None
        kills_before = oom_kills()
        # the timeout is the cell's own work (setup, check, memory pass) beyond its timing budget
        timeout_s = timeout_s + self.settings.measure.budget_ms / 1e3
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                own = timeout_s - self.settings.measure.budget_ms / 1e3
                return "timeout", (f"no result within the cell timeout ({own:g} s beyond the "
                                   f"{self.settings.measure.budget_ms:g} ms timing budget)")
            try:
                if self._conn.poll(min(left, 0.5)):
                    msg = self._conn.recv()
                    if isinstance(msg, At):  # the variant whose code runs now: its step has the timeout
                        self.last_started = msg.name
                        deadline = time.monotonic() + timeout_s
                        continue
                    if isinstance(msg, Done):
                        spans.absorb(msg.spans, "worker: ")
                        return "done", ""
                    if isinstance(msg, Restart):  # a variant left work running: this worker times nothing more
                        self.kill()
                        return "restart", msg.why
                    with spans.span("sweep: rows written"):
                        on_row(msg.row if task else store.measured(msg.row))
                    deadline = time.monotonic() + timeout_s
                    continue
            except (EOFError, ConnectionResetError, OSError):
                pass
            if not self._proc.is_alive():
                self._proc.join()
                status, reason = _death(self._proc.exitcode, kills_before)
                if self.settings.log_path:
                    reason += f"; its output is in {self.settings.log_path}"
                self._proc = None
                self.restarts += 1
                return status, reason

    def run(self, variant: str, case: Case, timeout_s: float) -> tuple[str, str, dict | None]:
        """One variant on one case: ('row', '', row) or ('timeout' | 'crash', reason, None)."""
        rows = []
        tag, why = self.run_group([variant], case, timeout_s, rows.append)
        return ("row", "", rows[0]) if rows else (tag, why, None)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def kill(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc.pid)
            self._proc.kill()
            self._proc.join()
            self._proc = None
            self.restarts += 1

    def ask_to_stop(self) -> None:
        """Tell the worker to exit, without waiting (``stop`` then waits): several exit at once."""
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
            except (OSError, BrokenPipeError):
                pass

    def stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(5)
            except (OSError, BrokenPipeError):
                pass
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join()
        self._proc = None
