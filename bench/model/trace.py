"""Serving traces as input (``--batch-mix @FILE``): a JSONL file of real batches, one line per
batch, reduced to the ``--trace-mixes N`` batches that represent it.

A line is a JSON object ``{"new": [512, 1, 1], "cached": [0, 2047, 4095]}`` (each sequence's
new tokens and the tokens already in its cache) or a JSON array of ``[new, cached]`` pairs.
Each batch becomes a mix (``bench.model.workload``): a sequence of Q new tokens against its
cache is Q query tokens against cached + Q keys, bottom-right.

The representatives are chosen by the two figures that set a batch's cost shape: its total new
tokens (in log) and its decode share (the share of its sequences with one new token).  Both are
scaled to [0, 1] over the trace, k-means with k = N starts from the batches at the quantiles of
total tokens, and each cluster is represented by its medoid: the real batch nearest its centre.
A mix is named by its place in the trace: ``FILE:LINE``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.model.workload import WorkloadError

LINE_VALID = ('one JSON object per line, {"new": [Q, ...], "cached": [C, ...]} (each sequence\'s new tokens and its '
              'cached tokens, Q >= 1, C >= 0), or a JSON array of [Q, C] pairs')
MAX_BATCHES = 1_000_000
ITERATIONS = 50


def read_trace(path: str) -> list[tuple[int, list[tuple[int, int]]]]:
    """(line number, [(new, cached), ...]) of every batch of the file, or a WorkloadError that names
    the line and says what is valid."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"--batch-mix @{path}: no such file", "mix")
    out = []
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"--batch-mix @{path}: cannot be read ({exc}); valid: {LINE_VALID}", "mix") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            batch = _batch(json.loads(line))
        except (ValueError, TypeError) as exc:
            raise WorkloadError(f"--batch-mix @{path}: line {number}: {exc}; valid: {LINE_VALID}", "mix") from None
        out.append((number, batch))
        if len(out) > MAX_BATCHES:
            raise WorkloadError(f"--batch-mix @{path}: more than {MAX_BATCHES:,} batches", "mix")
    if not out:
        raise WorkloadError(f"--batch-mix @{path}: no batch in the file; valid: {LINE_VALID}", "mix")
    return out


def _batch(value) -> list[tuple[int, int]]:
    if isinstance(value, dict):
        if set(value) - {"new", "cached"} or "new" not in value:
            raise ValueError(f"keys {sorted(value)}")
        new, cached = value["new"], value.get("cached", [0] * len(value["new"]))
        if not isinstance(new, list) or not isinstance(cached, list) or len(new) != len(cached):
            raise ValueError("'new' and 'cached' must be lists of the same length")
        pairs = list(zip(new, cached))
    elif isinstance(value, list):
        pairs = [tuple(p) if isinstance(p, list) and len(p) == 2 else (None, None) for p in value]
    else:
        raise ValueError(f"a {type(value).__name__}")
    if not pairs:
        raise ValueError("an empty batch")
    for q, c in pairs:
        if not (type(q) is int and type(c) is int and q >= 1 and c >= 0):
            raise ValueError(f"sequence [{q}, {c}]")
    return [(q, c) for q, c in pairs]


def spelling(batch: list[tuple[int, int]]) -> str:
    """A batch as a --batch-mix spelling (canonical: equal neighbours merged)."""
    from bench.model.workload import canonical_mix

    return canonical_mix("+".join(f"1x({q}/{q + c})" for q, c in batch))


def features(batch: list[tuple[int, int]]) -> tuple[float, float]:
    """(log2 of the total new tokens, the decode share)."""
    return math.log2(sum(q for q, _ in batch)), sum(1 for q, _ in batch if q == 1) / len(batch)


def sample(batches: list[tuple[int, list]], n: int) -> list[tuple[int, list]]:
    """The ``n`` batches that represent ``batches`` (line, batch), in the trace's order."""
    if n >= len(batches):
        return list(batches)
    pts = [features(b) for _, b in batches]
    lo = [min(p[i] for p in pts) for i in (0, 1)]
    span = [max(p[i] for p in pts) - lo[i] or 1.0 for i in (0, 1)]
    pts = [tuple((p[i] - lo[i]) / span[i] for i in (0, 1)) for p in pts]
    by_tokens = sorted(range(len(pts)), key=lambda i: pts[i])
    centres = [pts[by_tokens[min(len(pts) - 1, (2 * j + 1) * len(pts) // (2 * n))]] for j in range(n)]
    for _ in range(ITERATIONS):
        members: list[list[int]] = [[] for _ in centres]
        for i, p in enumerate(pts):
            members[min(range(len(centres)), key=lambda j: _d2(p, centres[j]))].append(i)
        moved = [tuple(sum(pts[i][d] for i in m) / len(m) for d in (0, 1)) if m else c
                 for m, c in zip(members, centres)]
        if moved == centres:
            break
        centres = moved
    chosen = set()
    for c, m in zip(centres, members):
        pool = [i for i in (m or range(len(pts))) if i not in chosen]
        if pool:
            chosen.add(min(pool, key=lambda i: (_d2(pts[i], c), i)))
    return [batches[i] for i in sorted(chosen)]


def _d2(a, b) -> float:
    return (a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2


def trace_mixes(path: str, n: int) -> list[tuple[str, str]]:
    """(name, spelling) of the ``n`` representative batches of the trace at ``path``."""
    out = []
    for line, batch in sample(read_trace(path), n):
        try:
            out.append((f"{path}:{line}", spelling(batch)))
        except WorkloadError as exc:
            raise WorkloadError(f"--batch-mix @{path}: line {line}: {exc}", "mix") from None
    return out
