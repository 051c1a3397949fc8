"""Inductor's CPU vector-ISA probe, once per machine instead of once per worker process.

Before its first CPU compile in a process, Inductor checks each vector ISA the CPU's flags name
(AVX-512, AVX2) by building a small library with its flags and loading it in a child Python: one
child per ISA, about 1.3 s a process on the 2-core machine, paid again by every fresh worker (each
later visit starts one: bench.engine.visits).  The outcome depends on the CPU, the compiler and
torch, not on the process.  So a worker that ran the probe records what it found in
``vec_isa.json`` (the machine's cache folder, bench.runs.cachefiles), keyed by torch's version, the
ISAs the CPU's flags name and the compiler; a later worker with the same key, where every ISA
passed, sets Inductor's own override (``torch._inductor.config.cpp.vec_isa_ok = True``, what
``TORCHINDUCTOR_VEC_ISA_OK=1`` sets), which skips the probe and picks the same ISA.  Where any
ISA failed, nothing is set and the probe runs as before.  A value the user set
(``TORCHINDUCTOR_VEC_ISA_OK``) is left alone.  On any surprise from torch's internals, nothing is
done."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

FILE = "vec_isa.json"
_STATE = {"learnt": False}  # this process has recorded its probe (once is enough)


def _path(path: Path | None) -> Path:
    from bench.runs.cachefiles import cache_dir

    return path or cache_dir() / FILE


def _candidates() -> tuple[list, str] | None:
    """The ISAs the CPU's flags name (those the probe would check) and the key of this machine's
    outcome; None where there is nothing to learn (not x86 Linux, or torch's internals differ)."""
    import platform

    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        import torch
        from torch._inductor import config
        from torch._inductor import cpu_vec_isa as isa

        flags = isa.x86_isa_checker()
        names = [str(i) for i in isa.supported_vec_isa_list if all(f in flags for f in str(i).split())]
        cxx = config.cpp.cxx
        cxx = cxx[-1] if isinstance(cxx, tuple) else cxx
        where = shutil.which(str(cxx or "g++")) or str(cxx)
        stamp = os.stat(where).st_mtime_ns if os.path.exists(where) else 0
    except Exception:  # noqa: BLE001  (torch's internals moved: the probe runs as torch does it)
        return None
    return names, f"{torch.__version__}|{','.join(names)}|{where}@{stamp}"


def trust(path: Path | None = None) -> bool:
    """Skip the probe in this process when this machine's record says every ISA passed; True when
    set."""
    try:
        from torch._inductor import config

        if config.cpp.vec_isa_ok is not None:  # the user's (TORCHINDUCTOR_VEC_ISA_OK) or already set
            return False
        found = _candidates()
        if found is None:
            return False
        from bench.runs.cachefiles import read_json

        entry = read_json(_path(path)).get(found[1])
        if not (isinstance(entry, dict) and entry.get("all_passed") and entry.get("isas") == found[0]):
            return False
        config.cpp.vec_isa_ok = True
        _STATE["learnt"] = True  # nothing to learn: the probe will not run
        return True
    except Exception:  # noqa: BLE001
        return False


def learn(path: Path | None = None) -> None:
    """Once this process's probe has run (a CPU compile), record what it found."""
    if _STATE["learnt"] or "torch._inductor.cpu_vec_isa" not in sys.modules:
        return
    try:
        from torch._inductor import config
        from torch._inductor import cpu_vec_isa as isa

        if config.cpp.vec_isa_ok is not None or not isa.valid_vec_isa_list.cache_info().currsize:
            return  # overridden, or no compile has probed yet
        found = _candidates()
        if found is None:
            _STATE["learnt"] = True
            return
        passed = [str(i) for i in isa.valid_vec_isa_list()]
        from bench.runs.cachefiles import read_json, write_json

        p = _path(path)
        data = read_json(p)
        data[found[1]] = {"isas": found[0], "passed": passed, "all_passed": passed == found[0]}
        write_json(p, data)
        _STATE["learnt"] = True
    except Exception:  # noqa: BLE001
        _STATE["learnt"] = True
