"""The cases a compiled variant (flex) set up on this machine, wherever their run folders were
written: ``compiled.json`` in the machine's cache folder (bench.runs.cachefiles),
one list per (device, torch version, Inductor cache folder).  A sweep adds its ok rows' cases at
its end; the plan (bench.features.cost_model.plan.load_history) reads them before it prices a compile as cold,
so a sweep into a new folder is priced from the compiler cache this machine has.  A list counts
only while its Inductor cache folder holds files: a wiped cache compiles from nothing again."""

from __future__ import annotations

from pathlib import Path

FILE = "compiled.json"
MAX_KEYS = 50_000  # per scope: the newest kept


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def scope(device: str, inductor_dir: Path | None = None, torch_version: str | None = None) -> str:
    from bench.measure.origin import inductor_cache_dir

    return f"{device}|{torch_version or _torch_version()}|{inductor_dir or inductor_cache_dir()}"


def _path(path: Path | None) -> Path:
    from bench.runs.cachefiles import cache_dir

    return path or cache_dir() / FILE


def record(pairs, device: str, path: Path | None = None, inductor_dir: Path | None = None) -> None:
    """Add ``pairs`` ((variant, case key) a compiled variant set up on ``device``:
    bench.features.cost_model.plan.compiled_pairs) to the record."""
    keys = [f"{name}|{case}" for name, case in pairs]
    if not keys:
        return
    from bench.runs.cachefiles import read_json, write_json

    path = _path(path)
    data = read_json(path)
    where = scope(device, inductor_dir)
    data[where] = list(dict.fromkeys([*data.get(where, []), *keys]))[-MAX_KEYS:]
    write_json(path, data)  # a read-only cache folder: the plan prices compiles as before


def record_refused(pairs, device: str, path: Path | None = None) -> None:
    """Add ``pairs`` ((variant, case key) a variant's own probe refused on ``device``: a library's
    refusal, found in the worker) to the record, per device and torch version, so that a plan in
    any folder knows them before it prices a setup (bench.features.cost_model.plan.load_history)."""
    keys = [f"{name}|{case}" for name, case in pairs]
    if not keys:
        return
    from bench.runs.cachefiles import read_json, write_json

    path = _path(path)
    data = read_json(path)
    where = f"refused|{device}|{_torch_version()}"
    data[where] = list(dict.fromkeys([*data.get(where, []), *keys]))[-MAX_KEYS:]
    write_json(path, data)


def refused(device: str, path: Path | None = None) -> frozenset:
    """(variant, case_key) of every case a variant's probe refused on this device and torch."""
    from bench.runs.cachefiles import read_json

    out = set()
    for key in read_json(_path(path)).get(f"refused|{device}|{_torch_version()}", []):
        name, _, case = key.partition("|")
        out.add((name, case))
    return frozenset(out)


def seen(device: str, path: Path | None = None, inductor_dir: Path | None = None) -> frozenset:
    """(variant, case_key) of every case recorded for this device, torch and Inductor cache folder,
    while that folder holds files; else none."""
    from bench.measure.origin import inductor_cache_dir

    folder = Path(inductor_dir or inductor_cache_dir())
    try:
        if not any(folder.iterdir()):
            return frozenset()
    except OSError:
        return frozenset()
    from bench.runs.cachefiles import read_json

    out = set()
    for key in read_json(_path(path)).get(scope(device, folder), []):
        name, _, case = key.partition("|")
        out.add((name, case))
    return frozenset(out)
