"""Pivot tables per facet: seq_len x variant for time, speedup, TFLOP/s, % of peak and
memory.  A cell that did not run shows its status (OOM, TIMEOUT, ...), never a blank."""

from __future__ import annotations

import numpy as np
import pandas as pd
from tabulate import tabulate

from bench.engine import judge
from bench.model.row import FLAGS, Status
from reports.frames import facet_groups, ran_here

METRICS = {  # name: (title, formatter)
    "time_ms": ("median time (ms)", lambda x: f"{x:.3g}"),
    "speedup": ("speedup vs baseline (x)", lambda x: f"{x:.2f}"),
    "tflops": ("achieved TFLOP/s", lambda x: f"{x:.3g}"),
    "pct_peak": ("% of measured matmul peak", lambda x: f"{x:.1f}"),
    "gbps": ("achieved GB/s (minimum bytes moved: inputs read once, outputs written once)", lambda x: f"{x:.3g}"),
    "pct_bw": ("% of measured copy bandwidth (minimum bytes moved)", lambda x: f"{x:.1f}"),
    "pct_roof": ("% of the roofline: of whichever ceiling binds at the cell's intensity (mem: bandwidth, "
                 "comp: matmul peak)", lambda x: f"{x:.1f}"),
    "mem_mib": ("peak memory above inputs (MiB)", lambda x: f"{x:.3g}"),
    "rel_err": ("relative error against the float64 reference (||out - ref|| / ||ref||)", lambda x: f"{x:.2g}"),
}


SHAKY_MARK = "*"  # shaky (bench.engine.judge): kept and flagged
PEAK_MARK = "†"  # % of a peak that a cell exceeded: that peak is not reliable
NOTES = {SHAKY_MARK: "noisy (the median's 95% CI reaches beyond +-5% of it) or contended (timed while the CPU "
                     "was shared); kept, but left "
                     "out of fits and crossovers",
         PEAK_MARK: "a cell of this dtype went above the measured matmul peak, so the peak (and every % of it) "
                    "is not reliable"}


def with_metrics(g: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Display columns: time_ms, mem_mib, and the speedup (paired per round when the rows
    carry rounds; see frames.speedups)."""
    from reports.frames import speedups

    g = g.copy()
    g["time_ms"] = g["median_ms"]
    g["mem_mib"] = g["peak_mem_bytes"] / 2**20
    if "speedup" not in g:
        g = speedups(g, baseline)
    return g


def pivot(g: pd.DataFrame, metric: str) -> pd.DataFrame:
    """variant x n with formatted values, or the status word in capitals where not ok."""
    fmt = METRICS[metric][1]
    cells = []
    for _, r in g.iterrows():
        if r["status"] != "ok":
            text = Status(r["status"]).word
        elif pd.isna(r[metric]):
            text = "n/a"
        else:
            text = fmt(r[metric]) + (SHAKY_MARK if r.get("shaky") else "")
            if metric == "pct_peak" and r.get("peak_unreliable"):
                text += PEAK_MARK
            if metric == "pct_roof" and r.get("bound"):
                text += " " + {"memory": "mem", "compute": "comp"}[r["bound"]]
        cells.append((r["variant"], int(r["n"]), text))
    return cell_pivot(pd.DataFrame(cells, columns=["variant", "n", "v"]), ["variant"], "n", "v", empty="-",
                      label="n={}")


def cell_pivot(df: pd.DataFrame, index: list[str], columns: str, values: str, empty: str = "",
               label: str = "{}") -> pd.DataFrame:
    """The one pivot behind every table of cells: ``index`` x ``columns``, each cell's
    (already formatted) value, ``empty`` where there is none; columns named by ``label``."""
    t = df.pivot_table(index=index, columns=columns, values=values, aggfunc="first", sort=True).fillna(empty)
    t.columns = [label.format(c) for c in t.columns]
    return t


def facet_tables(df: pd.DataFrame, baseline: str | None) -> list[tuple[str, dict[str, pd.DataFrame]]]:
    out = []
    for label, g in facet_groups(df):
        g = with_metrics(ran_here(g), baseline)
        if g.empty:
            continue
        out.append((label, {m: pivot(g, m) for m in METRICS if m in g and g[m].notna().any()}))
    return out


def status_counts(df: pd.DataFrame) -> pd.DataFrame:
    t = df.pivot_table(index="variant", columns="status", values="n", aggfunc="count").fillna(0)
    return t.astype(int)


def failed_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell without a measurement but those its variant declared out (a mask, direction,
    cross-attention or GQA it does not claim): ``bench.engine.judge.not_measured``, which reads
    the row's ``reason_kind``, never its words."""
    cols = ["status", "reason_kind"] if "reason_kind" in df else ["status"]
    keep = [judge.not_measured(r) for r in df[cols].to_dict("records")]
    return df[pd.Series(keep, index=df.index, dtype=bool)] if len(df) else df


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """The failed cells, grouped: one line per (variant, status, reason) with the number of
    cells and where they are (the lengths, masks, directions and dtypes), most cells first."""
    cells = failed_cells(df)
    if cells.empty:
        return pd.DataFrame(columns=["variant", "status", "cells", "where", "reason"])
    cells = cells.assign(reason=cells["reason"].fillna("no reason given"))

    def where(g: pd.DataFrame) -> str:
        ns = sorted(g["n"].unique())
        parts = [f"n={ns[0]}" if len(ns) == 1 else f"n={ns[0]}-{ns[-1]} ({len(ns)})"]
        for col in ("mask", "direction", "dtype"):
            parts.append(", ".join(sorted(map(str, g[col].unique()))))
        return "; ".join(parts)

    out = [{"variant": v, "status": st, "cells": len(g), "where": where(g), "reason": reason}
           for (v, st, reason), g in cells.groupby(["variant", "status", "reason"], sort=True)]
    return pd.DataFrame(out).sort_values(["cells", "variant"], ascending=[False, True], kind="stable")


def failed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The failed cells, one line each (variant, status, where, reason)."""
    cols = ["variant", "status", "n", "dtype", "mask", "direction", "reason"]
    return failed_cells(df)[cols].sort_values(["variant", "n", "dtype", "mask", "direction"])  # every cell its row


def ragged_table(df: pd.DataFrame) -> pd.DataFrame:
    """The ragged batches' ok cells: how each variant held the batch, its time per real token,
    and the padding waste an equal-length kernel would pay on the same batch."""
    ok = df[(df["status"] == "ok") & (df["lengths"] != "fixed")]
    if ok.empty:
        return pd.DataFrame()
    cols = {"variant": "variant", "lengths": "lengths", "mask": "mask", "direction": "direction", "batch": "batch",
            "n": "mean n", "layout": "layout", "median_ms": "median ms", "us_per_token": "µs per real token",
            "padding_waste": "padding waste (padded / real FLOPs)"}
    t = ok[[c for c in cols if c in ok]].rename(columns=cols)
    return t.sort_values(["lengths", "mask", "direction", "mean n", "variant"]).round(4)


def mix_table(df: pd.DataFrame) -> pd.DataFrame:
    """The mixed batches' ok cells (--batch-mix): per mix, each variant's time per query token
    and per KiB of keys and values read (every key and value once), how it held the batch, and
    the share of the FLOPs each phase holds (prefill / chunked prefill / decode)."""
    if "mix" not in df:
        return pd.DataFrame()
    ok = df[(df["status"] == "ok") & (df["mix"] != "none")]
    if ok.empty:
        return pd.DataFrame()
    from bench.model.workload import PHASES

    def phase_sum(phases, key):
        return sum(p.get(key, 0) for p in phases.values()) if isinstance(phases, dict) else np.nan

    def shares(phases):
        if not isinstance(phases, dict):
            return "-"
        total = phase_sum(phases, "flops") or 1
        return " / ".join(f"{100 * phases.get(p, {}).get('flops', 0) / total:.0f}" for p in PHASES)

    phases = ok["phases"] if "phases" in ok else pd.Series([None] * len(ok), index=ok.index)
    t = pd.DataFrame({
        "mix": ok["mix"], "mask": ok["mask"], "direction": ok["direction"], "variant": ok["variant"],
        "layout": ok["layout"] if "layout" in ok else "-", "median ms": ok["median_ms"],
        "query tokens": ok["q_len"], "KV tokens": ok["kv_len"],
        "µs per query token": ok["median_ms"] * 1e3 / ok["q_len"],
        "ns per KV KiB read": [m * 1e6 / (b / 1024) if b else np.nan
                               for m, b in zip(ok["median_ms"], (phase_sum(p, "kv_bytes") for p in phases))],
        "FLOPs % prefill / chunked / decode": [shares(p) for p in phases]})
    return t.sort_values(["mix", "mask", "direction", "median ms"]).round(4)


def error_by_inputs(df: pd.DataFrame) -> pd.DataFrame:
    """Each approximate variant's relative output error by input kind (the median over its
    cells at each n and mask): how the approximation fares where its assumption holds."""
    approx = df[df["approximate"].fillna(False).astype(bool)] if "approximate" in df else df.iloc[0:0]
    approx = approx[approx["rel_err"].notna()]
    if approx.empty:
        return pd.DataFrame()
    t = approx.pivot_table(index=["variant", "mask", "n"], columns="inputs", values="rel_err", aggfunc="median")
    t.columns.name = None
    return t.round(3).reset_index()


def write_csvs(df: pd.DataFrame, tables, folder) -> None:
    df.drop(columns=["samples_ms"], errors="ignore").to_csv(folder / "results.csv", index=False)
    long = []
    for label, ts in tables:
        for metric, t in ts.items():
            x = t.reset_index()
            x.insert(0, "metric", metric)
            x.insert(0, "facet", label)
            long.append(x)
    if long:
        pd.concat(long, ignore_index=True).to_csv(folder / "tables.csv", index=False)


def shaky_mask(df):
    """True where an ok row is shaky (a pandas Series over ``df``): bench.engine.judge.shaky."""
    cols = [c for c in ("status", *FLAGS) if c in df]
    return pd.Series([judge.shaky(r) for r in df[cols].to_dict("records")], index=df.index, dtype=bool)


def summary_table(rows: list[dict]) -> str:
    """variant (x the facets that vary) by seq_len: median ms, or the status as a word.
    Variants with no cell that could run here are listed below the table with the reason."""

    from bench.engine.store import current_rows

    rows = current_rows(rows)  # a cell measured again: its newest row
    if not rows:
        return "(no rows)"
    df = pd.DataFrame(rows)
    if "median_ms" not in df:
        df["median_ms"] = None
    facets = [c for c in ("device", "dtype", "direction", "mask", "window", "align", "lengths", "mix", "inputs",
                          "kv_layout", "batch", "heads", "kv_heads", "head_dim", "head_dim_v")
              if c in df and df[c].astype(str).nunique() > 1]
    if (df["kv_len"] != df["q_len"]).any():
        facets.append("kv_len")
    shaky = shaky_mask(df)
    df["cell"] = [(f"{m:.3g}" + ("*" if f else "")) if s == "ok" else s
                  for m, s, f in zip(df["median_ms"], df["status"], shaky)]
    never = df.groupby("variant")["status"].agg(lambda s: (s == "unsupported").all())
    skipped = df[df["variant"].isin(never[never].index)]
    df = df[~df["variant"].isin(never[never].index)]
    # rows of a variant in a facet it does not declare (e.g. window.chunked under mask=causal)
    df = df.groupby(facets + ["variant"], dropna=False).filter(
        lambda g: not (g["status"] == "unsupported").all())
    lines = []
    if not df.empty:
        table = cell_pivot(df, facets + ["variant"], "q_len", "cell", label="n={}")
        lines.append("median ms (or status) by sequence length")
        lines.append(tabulate(table.reset_index(), headers="keys", showindex=False))
        if shaky[df.index].any():
            lines.append("* shaky: too few samples for a 95% interval of the median, noisy (the interval reaches "
                         "beyond +-5%), contended (timed while the CPU was shared) or throttled: kept, but flagged")
    for name, g in skipped.groupby("variant"):
        lines.append(f"unsupported here: {name}: {g['reason'].iloc[0]}")
    return "\n".join(lines)
