"""torch.profiler breakdowns: where the time of one cell goes, by operator and by category.

``python -m bench profile --variant NAME [case flags]`` prints the top operators (CUDA
kernels on a GPU) by self time with their share, groups them into categories, and writes
a Chrome/Perfetto trace and a breakdown CSV; ``sweep --profile`` writes the category
shares of a profiled pass, run after all the cells are timed (so that no profiler runs
just before a timed loop), to the run folder's profile.jsonl; the report puts them beside
their cells.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from bench.errors import first_line
from bench.measure.bound import bind_variant, case_inputs
from bench.measure.cellsteps import free_device_memory
from bench.measure.memory import quiet_stderr
from bench.model.case import Case
from bench.model.registry import Variant

CATEGORIES = ("matmul", "softmax", "mask/elementwise", "copy", "fused attention", "other")
SCHEDULE = dict(wait=1, warmup=2, active=3)
_ATEN = {  # ATen operator base names (no leading/trailing underscores)
    "matmul": {"mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "linear", "dot", "mv", "einsum"},
    "softmax": {"softmax", "log_softmax", "safe_softmax", "softmax_backward_data"},
    "copy": {"copy", "to_copy", "contiguous", "clone", "cat", "pad", "constant_pad_nd", "repeat",
             "repeat_interleave", "index", "index_select", "gather", "scatter", "stack", "to",
             "unfold_backward", "flip"},
    "mask/elementwise": {"masked_fill", "where", "mul", "div", "add", "sub", "exp", "fill", "zero",
                         "zeros", "zeros_like", "ones", "full", "logical_not", "logical_and", "logical_or",
                         "eq", "ne", "lt", "gt", "ge", "le", "neg", "any", "all", "sum", "triu", "tril",
                         "arange", "rsub", "sqrt", "scalar_tensor", "nan_to_num", "bitwise_not",
                         "bitwise_and", "clamp", "clamp_min", "clamp_max", "mul_", "div_", "add_"},
}
_KERNELS = [  # substrings of CUDA kernel or compiled-graph names; first match wins
    ("matmul", ("gemm", "cublas", "xmma", "tensorop", "sm90_", "sm80_", "nvjet", "cutlass", "gemv")),
    ("fused attention", ("flash", "fmha", "attention", "attn", "efficient", "flex", "cpp_fused",
                         "triton_", "compiled")),
    ("softmax", ("softmax",)),
    ("copy", ("copy", "memcpy", "memset", "cat", "pad", "gather", "scatter", "index")),
    ("mask/elementwise", ("elementwise", "reduce", "fill", "where", "mask")),
]


def categorize(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("attention", "flash", "flex", "fmha", "cudnn")):
        return "fused attention"
    if low.startswith("aten::"):
        base = low[6:].strip("_")
        for category, names in _ATEN.items():
            if base in names:
                return category
        return "other"
    for category, keys in _KERNELS:
        if any(k in low for k in keys):
            return category
    return "other"


def _profile(bound, trace_path: Path | None):
    case, call = bound.case, bound.timed()
    activities = [ProfilerActivity.CPU]
    if case.device == "cuda":
        activities.append(ProfilerActivity.CUDA)
    steps = sum(SCHEDULE.values())

    def on_ready(prof):
        if trace_path is not None:
            prof.export_chrome_trace(str(trace_path))

    with quiet_stderr(), profile(activities=activities, schedule=schedule(**SCHEDULE), record_shapes=True,
                                 profile_memory=True, on_trace_ready=on_ready) as prof:
        for _ in range(steps):
            call()
            if case.device == "cuda":
                torch.cuda.synchronize()
            prof.step()
    return prof


ANNOTATIONS = ("## ", "Torch-Compiled Region", "CompiledFxGraph", "CompiledFunction")


def is_annotation(e) -> bool:
    """A user or compiled-region annotation: it spans kernels that are counted on their own,
    so counting it too would count their time twice (flex's compiled regions do this)."""
    return bool(getattr(e, "is_user_annotation", False)) or any(a in e.key for a in ANNOTATIONS)


def breakdown(prof, device: str) -> list[dict]:
    """Operators (or kernels) by self time, with their category and share of the total."""
    rows = []
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep") or e.key.startswith("[memory]") or is_annotation(e):
            continue
        if device == "cuda":
            # self_device_time_total where it exists: self_cuda_time_total warns on every read
            self_us = e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
            if self_us <= 0 or getattr(e, "device_type", None) == torch.autograd.DeviceType.CPU:
                continue
        else:
            self_us = e.self_cpu_time_total
        if self_us <= 0:
            continue
        rows.append({"name": e.key, "category": categorize(e.key), "self_us": float(self_us),
                     "calls": int(e.count)})
    total = sum(r["self_us"] for r in rows) or 1.0
    for r in rows:
        r["share_pct"] = 100.0 * r["self_us"] / total
    rows.sort(key=lambda r: -r["self_us"])
    return rows


def shares_by_category(rows: list[dict]) -> dict[str, float]:
    out = dict.fromkeys(CATEGORIES, 0.0)
    for r in rows:
        out[r["category"]] += r["share_pct"]
    return out


def category_shares(bound) -> dict:
    """Columns for a sweep row: share_<category> in percent of profiled self time
    (``bound``: ``bench.measure.bound.bind_variant``'s, called inside its scope)."""
    prof = _profile(bound, None)
    shares = shares_by_category(breakdown(prof, bound.case.device))
    return {f"share_{c.replace('/', '_').replace(' ', '_')}": round(s, 2) for c, s in shares.items()}


def profile_case(variant, case: Case, out_dir: Path, top: int = 15) -> dict:
    """Profile one (variant, case); write trace and breakdown CSV; return figures and paths."""
    from bench.measure.bound import bind_variant

    bound = bind_variant(variant, case)
    stem = f"{variant.name}_{case.mask}_n{case.q_len}_{case.dtype}_{case.direction}".replace("+", "")
    trace = out_dir / f"trace_{stem}.json"
    with bound.scope():
        prof = _profile(bound, trace)
    rows = breakdown(prof, case.device)
    csv_path = out_dir / f"breakdown_{stem}.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["name", "category", "self_us", "calls", "share_pct"])
        w.writeheader()
        w.writerows(rows)
    return {"rows": rows, "top": rows[:top], "categories": shares_by_category(rows), "trace": trace,
            "csv": csv_path, "active_steps": SCHEDULE["active"]}


def profile_group(variants: list[Variant], case: Case, emit: Callable[[dict], None],
                  at: Callable[[str], None] = lambda name: None, settings=None) -> None:
    """The profiled pass: category shares of profiled self time per variant, as a row keyed
    like the cell's (``variant`` and the case fields); a failure is ``profile_error``."""
    try:
        inputs = case_inputs(case)
        for var in variants:
            at(var.name)
            row = {"variant": var.name, **case.to_dict()}
            try:
                bound = bind_variant(var, case, inputs)
                with bound.scope():
                    row.update(category_shares(bound))
            except Exception as exc:
                row["profile_error"] = f"{type(exc).__name__}: {first_line(exc)}"[:300]
            emit(row)
    finally:
        free_device_memory(case.device)
