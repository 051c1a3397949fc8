"""Where each worker of a sweep runs: one GPU per worker, or a disjoint set of cores.

``place(...)`` is plain logic (no processes, no CUDA calls), so that it is tested on any
machine: a worker on a GPU sees only its own device (``CUDA_VISIBLE_DEVICES`` with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so the numbers match ``nvidia-smi``); a worker on the CPU
gets its own cores (its affinity) and as many torch threads as it has cores, unless
``--threads`` says fewer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.errors import UsageError


@dataclass(frozen=True)
class Slot:
    """One worker's place: a label for its rows, the environment it starts with, its cores
    (empty: any) and its torch threads (None: torch's default)."""
    label: str
    env: dict = field(default_factory=dict)
    cpus: tuple[int, ...] = ()
    threads: int | None = None


def parse_gpus(text: str | None, visible: int) -> list[int] | None:
    """``--gpus all`` or ``0,1,3``: the GPU indices (None when not given)."""
    if text is None:
        return None
    if str(text).strip() == "all":
        if visible < 1:
            raise UsageError("--gpus all: no GPU is visible on this machine")
        return list(range(visible))
    try:
        ids = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise UsageError(f"--gpus takes all or distinct GPU indices such as 0,1,3, got {text!r}")
    bad = [i for i in ids if i >= visible]
    if bad:
        raise UsageError(f"--gpus {text}: GPU {bad[0]} does not exist here ({visible} visible: "
                         f"{', '.join(map(str, range(visible))) or 'none'})")
    return ids


def visible_ids(environ=None) -> list[str] | None:
    """This process's ``CUDA_VISIBLE_DEVICES`` entries (indices, GPU UUIDs or MIG ids, as a
    scheduler sets them), or None when it is not set (every GPU is visible)."""
    import os

    raw = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [x.strip() for x in raw.split(",") if x.strip()]


def device_id(index: int, visible: list[str] | None) -> str:
    """What a child's ``CUDA_VISIBLE_DEVICES`` must name so that it sees this process's GPU
    ``index``: this process's own entry for it (a job limited to "4,5" gives its workers "4"
    and "5", never "0" and "1")."""
    if visible is not None and 0 <= index < len(visible):
        return visible[index]
    return str(index)


def place(device: str, workers: int | None, gpus: list[int] | None, cpus: list[int],
          threads: int | None, visible: list[str] | None = None, world: int = 1,
          count: int | None = None) -> list[Slot]:
    """The slots of a sweep's workers.

    - cuda: one worker per GPU of ``gpus`` (or the first ``workers`` GPUs); each sees only its
      own, named as this process sees it (``visible``: its CUDA_VISIBLE_DEVICES entries).  A sweep
      whose cells run over ``world`` ranks (--ranks) gives each worker ``world`` GPUs, one per rank
      (of the ``count`` this node has, where known).
    - cpu: ``workers`` workers, the available cores ``cpus`` dealt out in disjoint contiguous
      blocks; each worker's threads are ``threads`` or its block's size (a cell's ranks share
      their worker's block, each rank on a core of it: bench.engine.group).
    One worker with no GPU list is the plain sweep: no pinning at all."""
    if device == "cuda" and world > 1:
        return _ranked_gpus(workers, gpus, threads, visible, world, count)
    if device == "cuda":
        if gpus is None:
            if not workers or workers == 1:
                return [Slot("cuda", threads=threads)]
            gpus = list(range(workers))
        if workers and workers != len(gpus):
            raise UsageError(f"--workers {workers} with --gpus {','.join(map(str, gpus))}: one worker per GPU "
                             f"(give one of them)")
        return [Slot(f"cuda:{g}", {"CUDA_VISIBLE_DEVICES": device_id(g, visible), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                     threads=threads) for g in gpus]
    if gpus is not None:
        raise UsageError("--gpus places workers on GPUs; on the CPU give --workers N")
    n = workers or 1
    if n == 1:
        return [Slot("cpu", threads=threads)]
    if n > len(cpus):
        raise UsageError(f"--workers {n}: this machine gives the sweep {len(cpus)} cores; each worker needs one "
                         f"of its own (valid: 1 to {len(cpus)})")
    size, extra = divmod(len(cpus), n)
    slots, start = [], 0
    for i in range(n):
        mine = tuple(cpus[start:start + size + (1 if i < extra else 0)])
        start += len(mine)
        if threads is not None and threads > len(mine):
            raise UsageError(f"--threads {threads} with --workers {n}: each worker has {len(mine)} core(s) of its own "
                             f"(give --threads {len(mine)} or fewer)")
        slots.append(Slot(f"cpu:{mine[0]}-{mine[-1]}" if len(mine) > 1 else f"cpu:{mine[0]}",
                          cpus=mine, threads=threads or len(mine)))
    return slots


def _ranked_gpus(workers, gpus, threads, visible, world: int, count: int | None) -> list[Slot]:
    """Slots of ``world`` GPUs each, one per rank of a cell: ``gpus`` (or the node's) in blocks."""
    ids = gpus if gpus is not None else list(range(count if count is not None else world))
    from bench.engine import hosts

    if len(ids) < world and hosts.nodes() > 1 and ids:  # a world past this node: it takes the node's GPUs
        hosts.split(world, "cuda", len(ids))  # (refused when the job's nodes cannot hold it)
        world = len(ids)
    if len(ids) < world:
        raise UsageError(f"--ranks {world} runs a cell on {world} GPUs, one per rank; this sweep has {len(ids)} "
                         f"({', '.join(map(str, ids)) or 'none'}): give --ranks {len(ids) or 1} or fewer")
    n = workers or (len(ids) // world if gpus is not None else 1)
    if n * world > len(ids):
        raise UsageError(f"--workers {n} with --ranks {world}: each worker's cells need {world} GPUs of its own, "
                         f"{n * world} in all, and the sweep has {len(ids)}")
    blocks = [ids[i * world:(i + 1) * world] for i in range(n)]
    return [Slot(f"cuda:{','.join(map(str, b))}", {"CUDA_VISIBLE_DEVICES": ",".join(device_id(g, visible) for g in b),
                                                    "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, threads=threads)
            for b in blocks]


def largest_world(spec) -> int:
    """The most ranks any cell of ``spec`` runs over (--ranks; ``all``: this node's GPUs, or its cores)."""
    given = list(spec.ranks or [1])
    if given == ["all"]:
        import os

        return visible_gpus() if spec.device == "cuda" else (os.cpu_count() or 1)
    per_node = getattr(spec, "slurm_gpus_per_node", None)
    if spec.device == "cuda" and (getattr(spec, "slurm_nodes", None) or 1) > 1 and per_node:
        return min(max(given), per_node)  # a job of several nodes: a world past a node takes its GPUs
    return max(given)


def available_cpus() -> list[int]:
    from bench.measure.cpuload import usable_cpus

    return usable_cpus()


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def worker_slots(spec) -> list:
    """Where ``spec``'s workers run: ``place`` for this machine."""
    if spec.gpus and spec.device != "cuda":
        gpus = []  # refused by place(), with what to give instead
    else:
        gpus = parse_gpus(spec.gpus, visible_gpus()) if spec.gpus else None
    cpus = available_cpus() if spec.device == "cpu" else []
    world = largest_world(spec)
    count = visible_gpus() if spec.device == "cuda" and world > 1 else None
    count = count or None  # no GPU here (a GPU sweep planned on a laptop): the node it runs on counts its own
    return place(spec.device, spec.workers, gpus, cpus, spec.threads, visible_ids(), world, count)
