"""A cell's memory peak, kept per machine: the memory pass (one call under torch.profiler, or
CUDA's allocator counters, bench.measure.memory) gives the same figure for the same variant code
on the same case, threads, device and torch, run after run; so a worker keeps each figure in
``memory.json`` (the machine's cache folder, bench.runs.cachefiles) and takes it from there
while it is younger than ``--peak-age`` hours (the age rule of the matmul peaks), instead of
calling the variant again.  The key holds the variant's name and a hash of its source file and of
the harness's memory pass, the case, the threads, the device's name and torch's version: a change
to any of them measures again.  ``--peak-age 0`` always measures (and records).  A row whose
figure came from the record says ``peak_mem_cached``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from bench.measure.cellsteps import Keep

FILE = "memory.json"
MAX_ENTRIES = 20_000  # the newest kept (a key is a 20-character digest: the file stays about a megabyte)
FLUSH_EVERY_S = 5.0  # a worker writes what it measured at most this often, and when it exits
_HASHES: dict = {}  # file path: ((mtime, size), its hash), per process


def _file_hash(path: str | None) -> str:
    """A short hash of a file's bytes ('' when it cannot be read), recomputed when it changes."""
    if not path:
        return ""
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size)
        known = _HASHES.get(path)
        if known and known[0] == stamp:
            return known[1]
        digest = hashlib.sha1(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return ""
    _HASHES[path] = (stamp, digest)
    return digest


def code_hash(variant) -> str:
    """The variant's source file and the memory pass's own, hashed together."""
    from bench.measure import memory

    mod = sys.modules.get(getattr(variant, "module", "") or "")
    return f"{_file_hash(getattr(mod, '__file__', None))}.{_file_hash(memory.__file__)}"


class MemoryCache:
    """One worker's view of ``memory.json``: read once, figures added as they are measured, and
    written back (merged with what other workers wrote meanwhile) by ``flush`` after each job."""

    def __init__(self, device_name: str = "", path: Path | None = None):
        self._path, self.device_name = path, device_name
        self._data: dict | None = None
        self._new: dict = {}
        self._flushed = time.monotonic()

    @property
    def path(self) -> Path:
        from bench.runs.cachefiles import cache_dir

        return self._path or cache_dir() / FILE

    def key(self, variant, case, threads) -> str:
        import torch

        case_key = json.dumps(case.to_dict(), sort_keys=True, default=str)
        whole = "|".join([variant.name, code_hash(variant), case_key, str(threads), self.device_name,
                          torch.__version__])
        return hashlib.sha1(whole.encode()).hexdigest()[:20]

    def get(self, key: str, max_age_h: float) -> int | None:
        """The recorded peak, if younger than ``max_age_h`` hours (0: never)."""
        if max_age_h <= 0:
            return None
        if self._data is None:
            from bench.runs.cachefiles import read_json

            self._data = read_json(self.path)
        entry = self._new.get(key) or self._data.get(key)
        if not isinstance(entry, dict) or not isinstance(entry.get("bytes"), int):
            return None
        if time.time() - float(entry.get("t", 0)) > max_age_h * 3600:
            return None
        return entry["bytes"]

    def put(self, key: str, value: int | None) -> None:
        if isinstance(value, int):
            self._new[key] = {"bytes": value, "t": time.time()}

    def flush(self, force: bool = False) -> None:
        """Write the figures measured since the last write (merged with the file as it is now), if
        FLUSH_EVERY_S has passed since then or ``force`` (the worker exits)."""
        if not self._new or (not force and time.monotonic() - self._flushed < FLUSH_EVERY_S):
            return
        self._flushed = time.monotonic()
        from bench.runs.cachefiles import read_json, write_json

        data = read_json(self.path)
        data.update(self._new)
        if len(data) > MAX_ENTRIES:
            data = dict(sorted(data.items(), key=lambda kv: float(kv[1].get("t", 0)))[-MAX_ENTRIES:])
        write_json(self.path, data)
        if self._data is not None:
            self._data.update(self._new)
        self._new = {}

    def on_job_end(self) -> None:  # bench.measure.cellsteps's Keep protocol: the peaks so far, every few seconds
        self.flush()

    def on_exit(self) -> None:  # what it measured, for the next workers
        self.flush(force=True)


KEEP = Keep("memory", MemoryCache)  # the memory pass's record, in each worker (bench.measure.memory reads it)
