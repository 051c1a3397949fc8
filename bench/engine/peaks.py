"""The machine's matmul peak and copy bandwidth, measured once and kept for a while.

A sweep holds every cell to the peaks of its machine.  They take about a second to measure
(four runs of a square matmul per dtype, a copy, at the start and again at the end), which
is most of what a one-cell sweep costs.  They depend on the machine, not on the sweep, so
they are kept in a cache file per machine fingerprint (the CPU or GPU, the core count, the
threads, torch, the device, the dtype and the length of each run), each with the time it was
measured.  A sweep takes a cached value younger than ``max_age_h`` hours and then skips the
end-of-sweep measurement too; an older one, or ``--peak-age 0``, is measured again, and
the cache keeps the best value measured within the age.  env.json says where each came from
(``peaks_source``).  The file is ``$ATTNBENCH_CACHE_DIR/peaks.json`` (default
``$XDG_CACHE_HOME/attnbench`` or ``~/.cache/attnbench``); one that cannot be read or written
is measured around, never an error.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.measure import cpuload
from bench.runs.cachefiles import cache_dir, read_json, write_json  # noqa: F401  (this module's API too)

DEFAULT_MAX_AGE_H = 24.0
CACHE_FILE = "peaks.json"


def key(fp: dict, kind: str, dtype: str, threads, run_ms: float) -> str:
    """The cache key: what the figure depends on (``fp``: envinfo.fingerprint)."""
    parts = [kind, fp.get("device"), fp.get("device_name"), fp.get("cpu_count"), threads, fp.get("torch"),
             dtype, f"{run_ms:g}ms"]
    if fp.get("device") == "cpu":
        parts.append(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else fp.get("cpu_count"))
    return "|".join(str(p) for p in parts)


class PeakCache:
    def __init__(self, max_age_h: float | None = DEFAULT_MAX_AGE_H, path: Path | None = None,
                 clock=time.time):
        self.max_age_s = (DEFAULT_MAX_AGE_H if max_age_h is None else max_age_h) * 3600.0
        self.path = path or cache_dir() / CACHE_FILE
        self.clock = clock

    def get(self, k: str) -> tuple[float, float] | None:
        """(value, when measured) of a fresh entry, or None."""
        if self.max_age_s <= 0:
            return None
        entry = read_json(self.path).get(k)
        try:
            value, when = float(entry["value"]), float(entry["measured"])
        except (TypeError, KeyError, ValueError):
            return None
        return (value, when) if self.clock() - when <= self.max_age_s and value > 0 else None

    def put(self, k: str, value: float) -> None:
        """Keep ``value`` (measured now), or the better fresh value already kept."""
        if not value or value <= 0:
            return
        data = read_json(self.path)
        old = data.get(k)
        now = self.clock()
        try:
            if old and now - float(old["measured"]) <= max(self.max_age_s, DEFAULT_MAX_AGE_H * 3600.0) \
                    and float(old["value"]) >= value:
                return
        except (TypeError, KeyError, ValueError):
            pass
        data[k] = {"value": value, "measured": now, "when": time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                           time.localtime(now))}
        write_json(self.path, data)


def source(cached: tuple[float, float] | None) -> str:
    """What env.json's ``peaks_source`` says of one figure."""
    if cached is None:
        return "measured"
    return f"cached: measured {time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(cached[1]))}"


def all_cached(spec) -> bool:
    """True when every peak a sweep of ``spec`` needs is in the cache and fresh (its projection
    then leaves the peak measurements out); the threads are the spec's (auto: as when quiet)."""
    import torch

    from bench.measure.envinfo import cpu_name, peak_run_ms

    name = torch.cuda.get_device_name() if spec.device == "cuda" and torch.cuda.is_available() else cpu_name()
    fp = {"device": spec.device, "device_name": name, "cpu_count": os.cpu_count(), "torch": torch.__version__}
    cache, run_ms = PeakCache(spec.peak_age), peak_run_ms(spec.device, spec.budget_ms)
    wanted = [key(fp, "tflops", d, spec.threads, run_ms) for d in spec.dtypes] + [key(fp, "gbps", "", spec.threads,
                                                                                      run_ms)]
    return all(cache.get(k) is not None for k in wanted)


def fill(env: dict, here: dict, spec, threads, run_ms: float) -> None:
    """env.json's ``peaks_tflops`` (each dtype of ``spec`` it lacks), ``peak_gbps`` and
    ``peaks_source``: fresh cached figures of this machine (``here``: its fingerprint), or
    measured now (once the workers started ahead have done their imports) and cached."""
    from bench.engine.runner import wait_prestarted
    from bench.measure.envinfo import measure_peak_gbps, measure_peak_tflops

    cache, sources = PeakCache(spec.peak_age), env.setdefault("peaks_source", {})

    def peak(kind: str, dtype: str, measure) -> float:
        k = key(here, kind, dtype, threads, run_ms)
        cached = cache.get(k)
        if cached is None:
            wait_prestarted()  # no import running beside the peak measurement
            value = measure()
            cache.put(k, value)
        else:
            value = cached[0]
        sources[kind if kind == "gbps" else dtype] = source(cached)
        return value

    for dtype in spec.dtypes:
        if dtype not in env["peaks_tflops"]:
            env["peaks_tflops"][dtype] = peak("tflops", dtype,
                                              lambda d=dtype: measure_peak_tflops(spec.device, d, threads, run_ms))
    if not env.get("peak_gbps"):
        env["peak_gbps"] = peak("gbps", "", lambda: measure_peak_gbps(spec.device, threads, run_ms))


def unloaded_peak(spec, dtype: str, threads) -> tuple[float, str]:
    """The end-of-sweep matmul peak, measured again when other processes took the cores while it
    ran and one look at the load finds them gone; ('' or what the load was, when it stayed)."""
    from bench.measure.envinfo import measure_peak_tflops, peak_run_ms

    def measure():
        window = cpuload.LoadWindow().start()
        value = measure_peak_tflops(spec.device, dtype, threads, peak_run_ms(spec.device, spec.budget_ms))
        other = window.stop() if spec.device == "cpu" else None
        free = max(0, len(cpuload.usable_cpus()) - (threads or len(cpuload.usable_cpus())))
        return value, (f"other processes used {other:.2f} cores while it ran" if other is not None and
                       other > free + cpuload.OTHER_CPU_MARGIN else "")

    value, loaded = measure()
    if loaded:  # a peak measured under load would make every % of peak look better than it is
        quiet, _ = cpuload.wait_for_quiet(threads or len(cpuload.usable_cpus()), limit_s=0.0)
        if quiet:  # measured again once the load has dropped; else kept as under load (no idle wait)
            value, loaded = measure()
    return value, loaded
