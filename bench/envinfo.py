"""The environment fingerprint written to env.json, and the measured matmul peak."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

PEAK_MATMUL_N = {"cpu": 2048, "cuda": 8192}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
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


def fingerprint(device: str) -> dict:
    env = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "xformers": _version("xformers"),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": device,
        "device_name": _cpu_name(),
        "cuda": torch.version.cuda,
        "cudnn": None,
        "driver": None,
        "git_commit": _git_commit(),
        "command": " ".join(["python", "-m", "bench"] + sys.argv[1:]),
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


def measure_peak_tflops(device: str, dtype: str) -> float:
    """Best achieved TFLOP/s of a square matmul (fastest sample): the ceiling that '% of
    peak' is measured against.  The size doubles up to PEAK_MATMUL_N while one product
    would take under 250 ms, so a dtype the CPU has no fast GEMM for (float16) costs a second,
    not minutes."""
    import time

    from bench.timing import time_call

    torch_dtype = getattr(torch, dtype)
    n = 256
    while n < PEAK_MATMUL_N[device]:
        a = torch.randn(n, n, device=device).to(torch_dtype)
        t0 = time.perf_counter()
        a @ a
        if device == "cuda":
            torch.cuda.synchronize()
        if (time.perf_counter() - t0) * 8 > 0.25:  # the next size would take over 250 ms
            break
        n *= 2
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    timing = time_call(device, lambda: a @ b, budget_ms=500.0)
    return 2 * n**3 / (timing.stats.min * 1e-3) / 1e12
