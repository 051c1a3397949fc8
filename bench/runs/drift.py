"""This machine's between-run drift, as an A/A ``ab`` measured it: how far a cell's median moves
from one run to the next (one sd of its log, per run).  ``compare`` of two separate runs reads it
to judge what the runs' own samples cannot show; until an A/A has calibrated this machine, compare
judges against the largest drift measured on its kind of machine (``LARGEST``), and says so.  Kept
in the machine's cache folder (bench.runs.cachefiles.cache_dir), keyed by what the drift depends
on."""

from __future__ import annotations

import json
import time

from bench.runs.cachefiles import cache_dir

FILE = "drift.json"
KEYS = ("device", "device_name", "cpu_count", "threads")  # the machine and how it is used, not the build


# the largest between-run drift known for each kind of machine, one sd per run: what `ab T T` recorded on a
# 2-core CPU VM at ab's defaults over the 12 cells of `python tests/benchmarks/ab_check.py --out DIR --parts
# aa-runs [--busy N]` (quiet: a run's common shift 0.098, each cell's own 0.130; beside a busy loop: 0.013 and
# 0.046), the largest of each; a GPU has none, so an uncalibrated compare of GPU runs judges no single-process cell
LARGEST = {"cpu": {"cell": 0.13, "run": 0.10, "measured on": "a 2-core CPU VM (ab_check's aa-runs, 12 cells)"}}


def key(env: dict) -> str:
    return "|".join(str(env.get(k)) for k in KEYS)


def record(env: dict, cell: float, run: float, cells: int, repeats: int) -> None:
    """Write the drift an A/A measured: ``cell``, each cell's own per run, ``run``, a run's common shift."""
    path = cache_dir() / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known[key(env)] = {"cell": cell, "run": run, "cells": cells, "repeats": repeats, "measured": time.time()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(known, indent=2))
    tmp.replace(path)


def largest(env: dict) -> dict | None:
    """The largest drift measured on the kind of machine ``env`` describes (``LARGEST``), or None."""
    entry = LARGEST.get(str(env.get("device")))
    return None if entry is None else dict(entry, default=True)


def lookup(env: dict) -> dict | None:
    """The calibration of the machine ``env`` (env.json) describes, or None."""
    try:
        known = json.loads((cache_dir() / FILE).read_text())
    except (OSError, ValueError):
        return None
    entry = known.get(key(env))
    ok = isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) for k in ("cell", "run"))
    return entry if ok else None
