"""The environment fingerprint written to env.json, and the measured matmul peak."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

PEAK_MATMUL_N = {"cpu": 2048, "cuda": 8192}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() + ("-dirty" if dirty else "")) if out.returncode == 0 else None


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def fingerprint(device: str) -> dict:
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "xformers": _version("xformers"),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
        "device_name": cpu_name(),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "driver": None,
        "git_commit": _git_commit(),
        "command": " ".join(["python", "-m", "bench"] + sys.argv[1:]),
        "memory_bytes": _memory_bytes(),  # this machine's memory (the report's predicted frontier)
    }
    if device == "cuda" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name()
        env["cudnn"] = torch.backends.cudnn.version()
        props = torch.cuda.get_device_properties(0)
        env["gpu_memory_bytes"] = props.total_memory
        env["capability"] = f"{props.major}.{props.minor}"
        try:
            env["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return env


PEAK_RUNS = 4  # the peak is the best of these
PEAK_RUN_MS = {"cpu": 100.0, "cuda": 100.0}  # each run: back-to-back products for at least this long
PEAK_RUN_MIN_MS = 25.0  # ... or as long as a sweep's timing budget, when that is shorter, but never less


def peak_run_ms(device: str, budget_ms: float) -> float:
    """How long each run of a peak measurement lasts for a sweep of this timing budget: the
    budget, between PEAK_RUN_MIN_MS and PEAK_RUN_MS (a smoke sweep of 5 ms cells does not
    spend seconds on its peaks; a sweep of 100 ms cells and up gets the full runs)."""
    return min(PEAK_RUN_MS[device], max(PEAK_RUN_MIN_MS, budget_ms))


def measure_peak_tflops(device: str, dtype: str, threads: int | None = None, run_ms: float | None = None) -> float:
    """Best achieved TFLOP/s of a square matmul over PEAK_RUNS runs, each long enough to be
    stable, at ``threads`` torch threads (the sweep's): the ceiling that '% of peak' is
    measured against.  On CUDA the size is 8192 and the first products (cuBLAS handle,
    heuristics) run before anything is timed.  On the CPU the size doubles up to
    PEAK_MATMUL_N while one product takes under 30 ms, so a dtype with no fast CPU GEMM
    (float16) costs about a second, not minutes."""
    import time

    if dtype == "float8_e4m3fn":
        return _fp8_peak(device, run_ms)
    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        torch_dtype = getattr(torch, dtype)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        n = PEAK_MATMUL_N[device] if device == "cuda" else 256
        while n < PEAK_MATMUL_N[device]:
            a = torch.randn(n, n, device=device).to(torch_dtype)
            a @ a  # warm
            t0 = time.perf_counter()
            a @ a
            if (time.perf_counter() - t0) * 8 > 0.03:  # the next size would take over 30 ms
                break
            n *= 2
        a = torch.randn(n, n, device=device).to(torch_dtype)
        b = torch.randn(n, n, device=device).to(torch_dtype)
        for _ in range(3):  # warm: library handles, caches, clocks
            a @ b
        sync()
        return _best_rate(lambda: a @ b, 2 * n**3 / 1e12, device, sync, 4 if device == "cuda" else 1, run_ms)
    finally:
        torch.set_num_threads(saved)
        _release(device)


def _fp8_peak(device: str, run_ms: float | None) -> float:
    """fp8 has no ``@``: its peak is torch._scaled_mm's (per-tensor scales, bf16 out) on a GPU
    that has it; 0.0 (no peak, so no % of it) where there is no fp8 matmul, as on the CPU."""
    if device != "cuda":
        return 0.0
    try:
        n = PEAK_MATMUL_N[device]
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm takes
        one = torch.ones((), device=device)

        def op():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        for _ in range(3):
            op()
        torch.cuda.synchronize()
        return _best_rate(op, 2 * n**3 / 1e12, device, torch.cuda.synchronize, 4, run_ms)
    except (RuntimeError, NotImplementedError, AttributeError):
        return 0.0
    finally:
        _release(device)


def _best_rate(op, work: float, device: str, sync, every: int = 1, run_ms: float | None = None) -> float:
    """The best of PEAK_RUNS runs of ``op`` back to back, each at least ``run_ms`` long
    (default PEAK_RUN_MS), as ``work`` per call per second (the device synchronised every
    ``every`` calls)."""
    run_ms = run_ms or PEAK_RUN_MS[device]
    import time

    best = 0.0
    for _ in range(PEAK_RUNS):
        count = 0
        t0 = time.perf_counter()
        while True:
            op()
            count += 1
            if count % every == 0:
                sync()
                elapsed = time.perf_counter() - t0
                if elapsed * 1e3 >= run_ms:
                    break
        best = max(best, work * count / elapsed)
    return best


BANDWIDTH_BYTES = {"cpu": 256 << 20, "cuda": 1 << 30}  # each buffer: far beyond the last-level cache


def measure_peak_gbps(device: str, threads: int | None = None, run_ms: float | None = None) -> float:
    """Best achieved memory bandwidth in GB/s (10^9 bytes) of a copy between two buffers of
    BANDWIDTH_BYTES (a read and a write per element, as STREAM's copy counts them), over
    PEAK_RUNS runs of PEAK_RUN_MS each, at ``threads`` torch threads: the roofline's
    memory ceiling, beside the matmul peak."""

    saved = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        n = BANDWIDTH_BYTES[device] // 4
        src = torch.ones(n, device=device)
        dst = torch.empty_like(src)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        dst.copy_(src)  # touch every page before timing
        sync()
        return _best_rate(lambda: dst.copy_(src), 2 * 4 * n / 1e9, device, sync, 1, run_ms)
    finally:
        torch.set_num_threads(saved)
        _release(device)


def _release(device: str) -> None:
    """Give a peak measurement's buffers back to the driver: the sweep's parent process holds no
    GPU memory while its workers measure (it kept about 3 GiB of cached blocks before)."""
    if device == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
