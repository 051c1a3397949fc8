"""The machine's cache folder and its files: ``$ATTNBENCH_CACHE_DIR`` (default
``$XDG_CACHE_HOME/attnbench`` or ``~/.cache/attnbench``), holding what a sweep learns about the
machine and keeps for the next ones (the peaks, bench.engine.peaks; the compiled cases,
bench.features.cost_model.compiled; the drift, bench.runs.drift; Inductor's ISA probe, bench.engine.vecisa).
Each file is one JSON object, read whole and written whole; one that cannot be read or written
is worked around, never an error."""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("ATTNBENCH_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "attnbench"


def read_json(path: Path) -> dict:
    """A cache file's object, or {} when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json(path: Path, data: dict) -> None:
    """A cache file written whole (a reader never sees half of it); a folder that cannot be written
    leaves the cache as it was."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
