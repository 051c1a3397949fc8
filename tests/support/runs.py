"""Run folders made from rows, for the report and compare tests."""

import json

from bench.runs.store import RESULTS, ResultWriter, write_env


def format_1_record(row: dict) -> dict:
    """A row as an earlier build stored it (row format 1): every column flat, the figures given
    stored as they are, a None one only where every row had it; typed as the writer types it."""
    from bench.model.row import ALWAYS, COLUMNS, make_row

    typed = make_row(row)
    out = {}
    for name in COLUMNS:
        value = getattr(typed[name], "value", typed[name])
        if value is not None or name in ALWAYS:
            out[name] = value
    return out | ({"extra": typed["extra"]} if typed["extra"] else {})


def samples_giving(median: float, q1: float | None = None, q3: float | None = None) -> list[float]:
    """Nine samples whose median, first and third quartiles are ``median``, ``q1`` and ``q3``
    (default: the median), evenly spread (their 95% interval is the 2nd to the 8th)."""
    q1 = median if q1 is None else q1
    q3 = median if q3 is None else q3
    lo, hi = median - q1, q3 - median
    return [q1 - lo, q1 - lo / 2, q1, q1 + lo / 2, median, median + hi / 2, q3, q3 + hi / 2, q3 + hi]


def run_folder(path, rows, env=None):
    """A run folder of ``rows``.  Rows given by their figures (a median, no samples) are written
    as an earlier build stored them (row format 1, its figures stored); rows of samples as this
    build writes them, their figures computed when they are read."""
    path.mkdir(parents=True)
    given = any(r.get("median_ms") is not None and not r.get("samples_ms") for r in rows)
    if given:
        with open(path / RESULTS, "w") as f:
            f.writelines(json.dumps(format_1_record(r)) + "\n" for r in rows)
    else:
        w = ResultWriter(path)
        for r in rows:
            w.write(r)
        w.close()
    write_env(path, {"device": "cpu", "torch": "2.13.0", "peaks_tflops": {"float32": 0.2}}
              | ({"row_formats": [[1, 1]]} if given else {}) | (env or {}))
    return path


def timed_rows(variant, scale, spread, ns=(256, 512, 1024)):
    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
                window=None, direction="fwd", reason="", status="ok")
    out = []
    for n in ns:
        med = scale * 1e-5 * n**2
        out.append(base | dict(variant=variant, q_len=n, kv_len=n, median_ms=med, q1_ms=med * (1 - spread),
                               q3_ms=med * (1 + spread), iqr_ms=2 * spread * med))
    return out
