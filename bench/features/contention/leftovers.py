"""What a variant leaves running in the worker after its turn: threads and child processes
that go on using the CPU.  A plugin that starts a busy thread in its factory would otherwise
be timed beside every later cell of that worker, built-ins included, and no contention check
sees it (the load is inside the worker's own process).

``Leftovers.check()`` is cheap while nothing new exists: it counts the process's threads
(``/proc/self/task``) and its children.  When either grew since the last quiet check, it
watches the process's CPU time over a short window while the main thread sleeps: threads
that are idle (a thread pool, inductor's compile workers) leave it unchanged and become the
new baseline; busy ones are reported, by count (the threads whose own CPU time grew over the
window: a pool thread created alongside a busy one is not counted) and by CPU time.
"""

from __future__ import annotations

import os
import time

from bench.measure.cellsteps import Keep

SETTLE_S = 0.02  # OpenMP threads spin for a moment after a parallel region: let them settle first
WINDOWS_S = (0.05, 0.25)  # a busy thread on a loaded machine can get under a quarter of a core in 50 ms:
# a longer look before new threads are taken as the new normal (only ever paid when threads were added)
BUSY_CORES = 0.25  # CPU time over the window, in cores, beyond which what is left is busy


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


LIBRARY_CHILDREN = ("torch._inductor", "compile_worker")  # PyTorch's own compile workers: not a variant's


def _children() -> set[int]:
    out: set[int] = set()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out |= {int(x) for x in f.read().split()}
        except (OSError, ValueError):
            continue
    return {pid for pid in out if not _library(pid)}


def _library(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().decode(errors="replace")
    except OSError:
        return False
    return any(k in cmd for k in LIBRARY_CHILDREN)


def _task_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by thread id (empty where /proc is not)."""
    out = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tasks:
        out[tid] = _cpu_s(f"self/task/{tid}")
    return out


def _cpu_s(pid) -> float:
    """User and system CPU seconds of process ``pid`` (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def warm() -> None:
    """Start the threads the libraries start on their first use, before a worker takes its baseline:
    OpenMP's pool (the first parallel region) and, where the memory pass uses it (no GPU: the CPU's
    allocator-level peak), the profiler's. A pool that appears later costs the next check a look of a
    few tenths of a second before it is taken as the new normal; started here, it is part of the
    baseline and costs nothing. A GPU worker's profiler is left alone: it stays untouched until a
    profiled call needs it (CUPTI)."""
    import torch

    a = torch.ones(128, 128)
    (a @ a).sum().item()  # a parallel region at the worker's thread count
    if torch.cuda.is_available():
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        (a @ a).sum().item()


class Leftovers:
    """What a worker ran before its first cell, against which each variant's setup is checked
    (``check``; kept in the worker as ``KEEP``, whose ``on_setup`` it is)."""

    def __init__(self, sleep=time.sleep, cpu=time.process_time, clock=time.monotonic):
        self.sleep, self.cpu, self.clock = sleep, cpu, clock
        self.threads, self.children = _threads(), _children()

    def check(self) -> str:
        """'' when nothing new runs; else what was left running, in words."""
        threads, children = _threads(), _children()
        if threads <= self.threads and children <= self.children:
            return ""
        self.sleep(SETTLE_S)
        for window in WINDOWS_S:
            own, busy, kids, kids0 = self._look(window, children - self.children)
            if own >= BUSY_CORES or kids >= BUSY_CORES:
                break
        else:  # idle in every window: a pool that stays, and the new normal
            self.threads, self.children = threads, children
            return ""
        parts = []
        if own >= BUSY_CORES:
            parts.append(f"{busy or threads - self.threads} busy thread(s) in the worker using {own:.2f} cores")
        if kids >= BUSY_CORES:
            parts.append(f"{len(kids0)} child process(es) using {kids:.2f} cores")
        return " and ".join(parts)

    on_setup = check  # bench.measure.cellsteps's Keep protocol

    def _look(self, window: float, new_children) -> tuple[float, int, float, dict]:
        """Over ``window`` seconds: this process's CPU in cores, its threads busy on their own, the
        new children's CPU in cores, and those children."""
        t0, own0, tasks0 = self.clock(), self.cpu(), _task_cpu()
        kids0 = {pid: _cpu_s(pid) for pid in new_children}
        self.sleep(window)
        span = max(1e-6, self.clock() - t0)
        own = (self.cpu() - own0) / span
        busy = sum(1 for tid, s in _task_cpu().items() if (s - tasks0.get(tid, s)) / span >= BUSY_CORES / 2)
        kids = sum(_cpu_s(pid) - c for pid, c in kids0.items()) / span
        return own, busy, kids, kids0


def _kept(device_name: str) -> Leftovers:
    warm()  # the libraries' own thread pools, started before the baseline
    return Leftovers()


KEEP = Keep("leftovers", _kept)
