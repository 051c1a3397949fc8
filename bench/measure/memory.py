"""Peak memory of one call, measured in a pass of its own (no flush buffer, no timing loop).

CUDA: the caching allocator's peak above what was allocated before the call.
CPU: torch.profiler's allocator-level record of every CPU allocation and free made by
torch during the call (profile_memory=True), replayed in order to find the peak.
Either way the figure is bytes above the inputs: q, k, v (and dO) exist before the call.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable

import torch

from bench.measure.cellsteps import Step, Timed, free_device_memory
from bench.measure.timing import release


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2 (the profiler's native start/stop chatter) for a moment."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_cuda(call: Callable) -> int:
    call()  # warm: lazy init, workspaces, autotuning
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def peak_cpu(call: Callable) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    # no warm-up call: the memory pass comes after the reference check and the timing
    gc_was = gc.isenabled()
    gc.disable()  # no collection of older garbage inside the recorded window
    try:
        with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = call()
            del out
    finally:
        if gc_was:
            gc.enable()
    try:
        raw = prof.profiler.kineto_results.events()
    except AttributeError:  # a PyTorch without the kineto result API: memory unknown
        return None
    events = [(e.start_ns(), e.nbytes()) for e in raw
              if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    events.sort()
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return int(peak)


def peak_bytes(device: str, call: Callable) -> int | None:
    return peak_cuda(call) if device == "cuda" else peak_cpu(call)


def _memory(t: Timed) -> None:
    """The peak of the whole step, from the machine's record or a memory pass."""
    item, case, result = t.item, t.case, t.result
    item.call = None  # the retained graph of a bwd call goes before the memory pass
    for timer in (item.timer, *item.parts.values()):  # and what each timer holds: its call, its CUDA graph
        release(timer)
    item.parts = {}
    free_device_memory(case.device)
    record = t.kept.get("memory")  # the machine's record (bench.engine.memcache), in a sweep's worker
    key = record.key(item.variant, case, t.settings.threads) if record is not None else None
    cached = record.get(key, getattr(t.settings, "peak_age_h", 0.0)) if key else None
    if cached is not None:
        result.peak_mem_bytes, result.peak_mem_cached = cached, True
        return
    with item.bound.scope():  # the whole step: forward and, with one, backward
        result.peak_mem_bytes = peak_bytes(case.device, item.bound.timed("fwd+bwd" if case.needs_grad else "fwd"))
    if key:
        record.put(key, result.peak_mem_bytes)
        result.peak_mem_cached = False


STEP = Step("memory pass", 50, lambda t: True, _memory,
            lambda t: f"memory pass (after a timing of median {t.timing.median_ms:.4g} ms, not kept)")
