"""One rank of a context-parallel cell's group (``python -m bench.engine.rank``, started by
bench.engine.group with torchrun's environment): it joins the process group, loads the sweep's
variants and plugins, and runs each job its worker sends (bench.scopes.context.run_rank through the
case's scope) until told to stop.  It dies with its worker (the parent-death signal, and the worker's
pid watched), so it never outlives it."""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time


def _die_with_worker() -> None:
    with_pid = int(os.environ.get("ATTNBENCH_WORKER_PID") or 0)
    try:  # Linux: SIGKILL when the parent (the worker) dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:  # elsewhere, and as a second line: the worker's pid gone or reused
        while True:
            time.sleep(0.5)
            if os.getppid() != with_pid:
                os._exit(1)

    if with_pid:
        if os.getppid() != with_pid:
            os._exit(1)
        threading.Thread(target=watch, daemon=True, name="bench-rank-worker").start()


def _fault(exc: BaseException, clean: bool) -> tuple:
    from bench.errors import first_line
    from bench.measure.origin import classify

    status, kind, where = classify(exc)
    why = f"{type(exc).__name__}: {first_line(exc)}"
    if status == "error":
        why = f"{why} (raised in {where})"
    return status, kind, why[:400], clean


def _send(conn, obj) -> None:
    """By value (plain pickle): multiprocessing's own pickler would share a tensor's storage by a
    file descriptor, which a process of another authkey (the worker) cannot take."""
    conn.send_bytes(pickle.dumps(obj))


def _pin() -> None:
    cores = [int(c) for c in os.environ.get("ATTNBENCH_RANK_CPUS", "").split(",") if c.strip()]
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def main() -> int:
    _die_with_worker()
    _pin()
    from multiprocessing.connection import Client

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, family = os.environ["ATTNBENCH_RANK_ADDRESS"], os.environ.get("ATTNBENCH_RANK_FAMILY") or "AF_UNIX"
    if family == "AF_INET":  # the worker on another node (bench.engine.hosts): host:port
        host, port = address.rsplit(":", 1)
        address = (host, int(port))
    conn = Client(address, family=family, authkey=bytes.fromhex(os.environ["ATTNBENCH_RANK_KEY"]))
    conn.send(rank)
    setup = conn.recv()
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(int(setup["threads"]))
        cuda = setup["device"] == "cuda"
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        timeout = datetime.timedelta(seconds=float(setup["timeout_s"]))
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=timeout, **({"device_id": device} if cuda else {}))
        cpu_group = dist.new_group(backend="gloo", timeout=timeout) if cuda else None
        from bench.engine.discovery import discover

        registry = discover(setup["plugins"])
    except BaseException as exc:
        _send(conn, _fault(exc, False)[:3] if not isinstance(exc, SystemExit) else ("error", "error", "exited"))
        return 1
    _send(conn, ("ready", "", ""))
    from bench.model import scope
    from bench.model.case import Case
    from bench.scopes.context import RankContext

    try:
        while True:
            job = conn.recv()
            if job is None:
                break
            ctx = None
            try:
                var, case = registry[job.variant], Case.from_dict(job.case)
                ctx = RankContext(case, dist.group.WORLD, rank, world, device, var.shard)
                ctx.cpu_group, ctx.registry = cpu_group, registry
                measured = scope.of(case).run_rank(var, case, ctx, job.settings)
                _send(conn, ("ok", measured))
            except Exception as exc:
                clean = ctx is not None and ctx.comms.calls == 0
                _send(conn, _fault(exc, clean))
            finally:
                if cuda:
                    torch.cuda.empty_cache()
    except (EOFError, OSError):  # the worker went away
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
