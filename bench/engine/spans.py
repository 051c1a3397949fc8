"""``sweep --trace-spans``: where a sweep's wall time went.

Each span counts its own time: its duration less the spans inside it, so that the spans of one
thread add up to the time the outermost one lasted.  A worker traces its own job the same way and
sends its totals with the job's end (``take``); the sweep adds them inside the span that waited
for the job (``absorb``), whose own time is then what the worker did not trace: the messages,
the pipe, the gaps.  The command's spans therefore add up to its wall time from the process's
start (one worker; with several, each worker's spans add up to its own share).

Off unless enabled: ``span`` then costs a global's read.  The totals are written to the run
folder's ``spans.json`` and printed, largest first (``lines``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

SPANS = "spans.json"  # in the run folder, with --trace-spans

_on = False
_lock = threading.Lock()
_local = threading.local()
_totals: dict[str, list] = {}  # name: [own seconds, count]


def enable(on: bool = True) -> None:
    """Trace from now on (or stop); the totals start empty."""
    global _on
    _on = bool(on)
    take()


def enabled() -> bool:
    return _on


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _add(name: str, seconds: float, count: int) -> None:
    with _lock:
        entry = _totals.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += count


@contextlib.contextmanager
def span(name: str):
    """Count the time inside as ``name``'s, less what the spans inside it count."""
    if not _on:
        yield
        return
    stack = _stack()
    frame = [0.0]  # the time of the spans inside it
    stack.append(frame)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        took = time.perf_counter() - t0
        stack.pop()
        _add(name, took - frame[0], 1)
        if stack:
            stack[-1][0] += took


def absorb(parts: dict | None, prefix: str = "") -> None:
    """Add ``parts`` ({name: (seconds, count)}: another process's totals, or a part measured
    otherwise) as spans inside the current one."""
    if not _on or not parts:
        return
    spent = 0.0
    for name, (seconds, count) in parts.items():
        _add(prefix + name, float(seconds), int(count))
        spent += float(seconds)
    stack = _stack()
    if stack:
        stack[-1][0] += spent


def take() -> dict:
    """The totals so far, {name: (seconds, count)}; they start again empty."""
    with _lock:
        out = {k: (v[0], v[1]) for k, v in _totals.items()}
        _totals.clear()
    return out


def table(totals: dict, wall_s: float) -> list[dict]:
    """The totals as rows, largest first, each with its share of ``wall_s``; what they leave of
    it is the last row (untraced)."""
    rows = [{"span": k, "s": s, "count": n, "share": s / wall_s if wall_s > 0 else 0.0}
            for k, (s, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])]
    rest = wall_s - sum(s for s, _ in totals.values())
    rows.append({"span": "untraced", "s": rest, "count": 0, "share": rest / wall_s if wall_s > 0 else 0.0})
    return rows


def write(run_dir: Path, totals: dict, wall_s: float, timed_s: float) -> Path:
    """spans.json: the command's wall, its timed samples and every span."""
    path = Path(run_dir) / SPANS
    path.write_text(json.dumps({"wall_s": wall_s, "timed_s": timed_s, "spans": table(totals, wall_s)}, indent=1)
                    + "\n")
    return path


def lines(totals: dict, wall_s: float, limit: int = 40) -> list[str]:
    """Where the wall went, one span a line, largest first."""
    rows = table(totals, wall_s)
    rows = rows[:-1][:limit - 1] + rows[-1:]  # untraced: always shown, last
    width = max(len(r["span"]) for r in rows)
    out = [f"where the {wall_s:.3g} s went (--trace-spans; each span's own time, less the spans inside it):"]
    for r in rows[:limit]:
        out.append(f"  {r['span']:<{width}}  {r['s']:8.3f} s  {100 * r['share']:5.1f}%  x{r['count']}")
    return out
