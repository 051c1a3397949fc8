"""The run folder: results.jsonl (append-only, one flushed line per finished cell),
env.json, and report/.  ``runs/latest`` points at the newest run under runs/."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.case import CASE_FIELDS, Case

RESULTS = "results.jsonl"
PROFILE = "profile.jsonl"  # sweep --profile: category shares per cell, from a pass after the timing
ENV = "env.json"
DEFAULT_ROOT = Path("runs")


def cell_key(variant: str, case: Case | dict) -> tuple:
    d = case.to_dict() if isinstance(case, Case) else case
    return (variant,) + tuple(d.get(f) for f in CASE_FIELDS)


def new_run_dir(device: str, root: Path = DEFAULT_ROOT, link_latest: bool = True) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{stamp}-{device}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{device}-{n}"
    path.mkdir(parents=True)
    if not link_latest:
        return path
    latest = root / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(path.name, target_is_directory=True)
    except OSError:
        pass  # a filesystem without symlinks: runs/latest is a convenience only
    return path


def require_run(run_dir) -> Path:
    """``run_dir`` as a Path, or a UsageError when it holds no results.jsonl."""
    from bench.errors import UsageError

    path = Path(run_dir)
    if not (path / RESULTS).exists():
        raise UsageError(f"{run_dir}: not a run folder (no {RESULTS})")
    return path


def read_rows(run_dir: Path, repair: bool = False, name: str = RESULTS) -> list[dict]:
    """Every complete row; a torn last line (a killed writer) is skipped, and with
    ``repair`` cut off so that appends start on a fresh line."""
    path = Path(run_dir) / name
    if not path.exists():
        return []
    rows, good_end = [], 0
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    for line in data.splitlines(keepends=True):
        pos += len(line)
        if not line.endswith(b"\n"):
            break
        try:
            rows.append(json.loads(line))
            good_end = pos
        except json.JSONDecodeError:
            break
    if repair and good_end != len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


class ResultWriter:
    def __init__(self, run_dir: Path, name: str = RESULTS):
        self.path = Path(run_dir) / name
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row, default=str) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def write_env(run_dir: Path, env: dict) -> None:
    (Path(run_dir) / ENV).write_text(json.dumps(env, indent=2, default=str) + "\n")


def read_env(run_dir: Path) -> dict:
    p = Path(run_dir) / ENV
    return json.loads(p.read_text()) if p.exists() else {}
