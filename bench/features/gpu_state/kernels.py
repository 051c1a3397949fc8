"""The kernels that ran: which SDPA backend a cell's CUDA kernels belong to.

``sdpa`` chooses its backend itself, and a pinned backend that PyTorch could not use fails
rather than falls back, but a user reading a row should not have to trust either: every ok
GPU cell records the CUDA kernels of one short profiled call, made after its timing
(``names_of_one_call``), and the backend they belong to (``backend_of``, a plain function of
the names, tested on the CPU with names recorded from PyTorch's kernels).  A variant that
declares its backend (``Prepared.info["backend"]``) and ran another's kernels is flagged.

Kernel names, by backend (the first that matches wins; cuDNN's fused attention kernels
carry "flash" in their names too, so it is tested first):

- cudnn: ``cudnn`` (e.g. ``cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_...``)
- flash: ``flash_fwd``, ``flash_bwd``, ``pytorch_flash::`` (FlashAttention-2 in PyTorch)
- efficient: ``fmha_cutlass``, ``attention_kernel``, ``mem_efficient`` (xformers' cutlass FMHA)
- flex: ``triton_tem_fused`` / ``flex_attention`` (the Triton template FlexAttention compiles)
- math: no fused attention kernel: GEMMs and a softmax kernel
"""

from __future__ import annotations

from bench.errors import first_line
from bench.measure.cellsteps import Step, Timed
from bench.measure.timing import GRAPH_CHECK_MS, GraphTimer, timer_disagreement

PATTERNS = (  # backend: substrings of a kernel name, lower-cased
    ("cudnn", ("cudnn",)),
    ("flash", ("flash_fwd", "flash_bwd", "pytorch_flash::", "flash_attn")),
    ("efficient", ("fmha_cutlass", "attention_kernel", "mem_efficient", "efficient_attention")),
    ("flex", ("triton_tem_fused", "flex_attention")),
)
TOP = 8  # kernel names kept per row


def backend_of(names) -> str:
    """The SDPA backend the kernel ``names`` belong to: cudnn, flash, efficient, flex, or math
    (no fused attention kernel among them); '' for no names at all."""
    low = [n.lower() for n in names]
    if not low:
        return ""
    for backend, keys in PATTERNS:
        if any(k in n for n in low for k in keys):
            return backend
    return "math"


def mismatch(declared: str | None, ran: str) -> str:
    """'' when the kernels that ran belong to the declared backend (or nothing is declared)."""
    if not declared or not ran or declared == ran:
        return ""
    return f"declared backend {declared}, but its kernels are {ran}'s"


def names_of_one_call(call, device: str) -> tuple[list[str], float | None]:
    """The CUDA kernels one ``call`` launches, by total device time (all of them: a layer's GEMMs
    can outnumber the row's TOP, and its attention kernels are looked for among every one), and
    the sum of their device time in ms (the profiler's figure for the call, beside the timers')."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.measure.memory import quiet_stderr

    if device != "cuda":
        return [], None
    call()  # warm: the profiled call launches what a timed one launches
    torch.cuda.synchronize()
    with quiet_stderr(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    totals: dict = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0) or 0
        if us > 0:
            totals[e.key] = totals.get(e.key, 0) + us
    names = [k for k, _ in sorted(totals.items(), key=lambda kv: -kv[1])]
    return names, sum(totals.values()) / 1e3 if totals else None


def gpu_check_columns(bound, median_ms: float, settings, names_of=names_of_one_call, graph_timer=GraphTimer) -> dict:
    """A GPU cell's kernel names and backend (a profiled call), and, under GRAPH_CHECK_MS with
    the event timer, its time as a CUDA graph: its columns keep every figure and flag a
    disagreement beyond AGREE between them (``timer_mismatch``).  Each check has its own
    ``try``: one that fails is recorded (``kernels_error``, ``graph_error``) and never takes
    the cell's timing with it."""
    names, kernel_ms, graph_ms, errors = [], None, None, {}
    with bound.scope():
        try:
            names, kernel_ms = names_of(bound.timed(), "cuda")
        except Exception as exc:
            errors["kernels_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]
        if settings.timer == "events" and median_ms < GRAPH_CHECK_MS:
            try:
                graph = graph_timer(bound.timed)  # a bwd call's forward runs on the capturing stream
                graph.run_round(min(settings.budget_ms, 50.0))
                graph_ms = graph.result().stats.median
            except Exception as exc:
                errors["graph_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]
    ran = backend_of(names) if names else None
    return errors | dict(
        kernels=names[:TOP] or None, backend_ran=ran, kernel_sum_ms=kernel_ms, graph_median_ms=graph_ms,
        kernel_mismatch=(mismatch(bound.prepared.info.get("backend"), ran) or None) if names else None,
        timer_mismatch=timer_disagreement(median_ms, graph_ms, kernel_ms) or None)


def _gpu_checks(t: Timed) -> None:
    """The kernels that ran, the backend they belong to, and a second timer (a CUDA graph)."""
    t.result.gpu_checks = gpu_check_columns(t.item.bound, t.timing.median_ms, t.settings)


STEP = Step("gpu checks", 60, lambda t: t.case.device == "cuda", _gpu_checks,
            lambda t: "kernel names (a profiled call after the timing)")
