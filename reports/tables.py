"""Pivot tables per facet: seq_len x variant for time, speedup, TFLOP/s, % of peak and
memory.  A cell that did not run shows its status (OOM, TIMEOUT, ...), never a blank."""

from __future__ import annotations

import numpy as np
import pandas as pd
from tabulate import tabulate

from bench.model.row import FLAGS, Status
from bench.runs import judge
from reports.frames import CASE_FACETS, facet_groups


def figures(x: float) -> str:
    """Three significant figures without an exponent: 0.0123, 4.56, 789, 2,820, 1,234,567."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


METRICS = {  # name: (title, formatter)
    "time_ms": ("median time (ms)", figures),
    "speedup": ("speedup vs baseline (x)", lambda x: f"{x:.2f}"),
    "tflops": ("achieved TFLOP/s", figures),
    "pct_peak": ("% of measured matmul peak", lambda x: f"{x:.1f}"),
    "gbps": ("achieved GB/s (minimum bytes moved: inputs read once, outputs written once)", figures),
    "pct_bw": ("% of measured copy bandwidth (minimum bytes moved)", lambda x: f"{x:.1f}"),
    "pct_roof": ("% of the roofline: of whichever ceiling binds at the cell's intensity (mem: bandwidth, "
                 "comp: matmul peak)", lambda x: f"{x:.1f}"),
    "mem_mib": ("peak memory above inputs (MiB)", figures),
    "rel_err": ("relative error against the float64 reference (||out - ref|| / ||ref||)", lambda x: f"{x:.2g}"),
}


UNTIMED = ("mem_mib",)  # counted in a pass of its own, not timed: never starred (the charts draw it filled)
SHAKY_MARK = "*"  # shaky (bench.runs.judge): kept and flagged
PEAK_MARK = "†"  # % of a peak that a cell exceeded: that peak is not reliable
NOTES = {SHAKY_MARK: "noisy (the median's 95% CI reaches beyond +-5% of it) or contended (timed while the CPU "
                     "was shared); kept, weighed down in fits and left "
                     "out of crossovers",
         PEAK_MARK: "a cell of this dtype went above the measured matmul peak, so the peak (and every % of it) "
                    "is not reliable"}


def with_metrics(g: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """Display columns: time_ms, mem_mib, and the speedup (paired per round when the rows
    carry rounds; see frames.speedups)."""
    from reports.frames import speedups

    if {"time_ms", "mem_mib", "speedup"} <= set(g):  # computed once for the whole report (reports.build)
        return g
    g = g.copy()
    g["time_ms"] = g["median_ms"]
    g["mem_mib"] = g["peak_mem_bytes"] / 2**20
    if "speedup" not in g:
        g = speedups(g, baseline)
    return g


def _true(x) -> bool:
    return not pd.isna(x) and bool(x)


def cell_texts(g: pd.DataFrame, metric: str) -> list[str]:
    """Each row's table text for ``metric``: the formatted value (starred when shaky, with the
    peak's dagger or the binding roof), or the status word in capitals where not ok."""
    fmt = METRICS[metric][1]
    words = {s.value: s.word for s in Status}
    shaky = g["shaky"] if "shaky" in g else pd.Series(False, index=g.index)
    unreliable = g["peak_unreliable"] if "peak_unreliable" in g else pd.Series(False, index=g.index)
    bound = g["bound"] if "bound" in g else pd.Series("", index=g.index)
    out = []
    for status, x, sh, bad, bd in zip(g["status"], g[metric], shaky, unreliable, bound):
        if status != "ok":
            out.append(words.get(status, str(status).upper()))
            continue
        if pd.isna(x):
            out.append("n/a")
            continue
        text = fmt(x) + (SHAKY_MARK if _true(sh) and metric not in UNTIMED else "")
        if metric == "pct_peak" and _true(bad):
            text += PEAK_MARK
        if metric == "pct_roof" and isinstance(bd, str) and bd:
            text += " " + {"memory": "mem", "compute": "comp"}[bd]
        out.append(text)
    return out


def cell_pivot(df: pd.DataFrame, index: list[str], columns: str, values: str, empty: str = "",
               label: str = "{}") -> pd.DataFrame:
    """The one pivot behind every table of cells: ``index`` x ``columns``, each cell's
    (already formatted) value, ``empty`` where there is none; columns named by ``label``."""
    t = df.pivot_table(index=index, columns=columns, values=values, aggfunc="first", sort=True).fillna(empty)
    t.columns = [label.format(c) for c in t.columns]
    return t


def facet_tables(df: pd.DataFrame, baseline: str | None) -> list[tuple[str, dict[str, pd.DataFrame]]]:
    """Per facet (in facet_groups' order), per metric that has a value there: variant x n."""
    from reports.frames import facet_labels

    if df.empty:
        return []
    df = with_metrics(df, baseline)
    label = facet_labels(df)
    ran = (df["status"] != "unsupported").groupby([label, df["variant"]]).transform("any")
    df, label = df[ran], label[ran]  # ran_here, per facet
    order = [name for name, _ in facet_groups(df)]
    tables: dict = {name: {} for name in order}
    facets, variants, ns = label.tolist(), df["variant"].tolist(), df["n"].astype(int).tolist()
    for metric in METRICS:
        if metric not in df:
            continue
        has = set(label[df[metric].notna()])
        nested: dict = {}  # facet -> variant -> n -> text (a cell's first row)
        for f, v, n, text in zip(facets, variants, ns, cell_texts(df, metric)):
            nested.setdefault(f, {}).setdefault(v, {}).setdefault(n, text)
        for name in order:
            if name not in has:
                continue
            rows = nested[name]
            cols = sorted({n for cells in rows.values() for n in cells})
            names = sorted(rows)
            tables[name][metric] = pd.DataFrame([[rows[v].get(n, "-") for n in cols] for v in names],
                                                index=pd.Index(names, name="variant"),
                                                columns=[f"n={n}" for n in cols])
    return [(name, ts) for name, ts in tables.items() if ts]


def status_counts(df: pd.DataFrame) -> pd.DataFrame:
    t = df.pivot_table(index="variant", columns="status", values="n", aggfunc="count").fillna(0)
    return t.astype(int)


def failed_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell without a measurement but those its variant declared out (a mask, direction,
    cross-attention or GQA it does not claim): ``bench.runs.judge.not_measured``, which reads
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

    # one line per kind of reason (bench.model.row.ReasonKind), not per wording: reasons that differ
    # only in a figure (an error of 2.2 or of 2.4) are one line; rows without a kind group by their reason
    kind = cells["reason_kind"].fillna("") if "reason_kind" in cells else pd.Series("", index=cells.index)
    cells = cells.assign(_kind=kind.where(kind != "", "reason: " + cells["reason"]))

    def reason(g: pd.DataFrame) -> str:
        counts = g["reason"].value_counts()
        others = len(counts) - 1
        return counts.index[0] + (f" (and {others} other wording{'s' * (others > 1)}; failures.csv lists each)"
                                  if others else "")

    out = [{"variant": v, "status": st, "cells": len(g), "where": where(g), "reason": reason(g)}
           for (v, st, _), g in cells.groupby(["variant", "status", "_kind"], sort=True)]
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
    """True where an ok row is shaky (a pandas Series over ``df``): bench.runs.judge.shaky."""
    cols = [c for c in ("status", *FLAGS, "visit_se") if c in df]
    return pd.Series([judge.shaky(r) for r in df[cols].to_dict("records")], index=df.index, dtype=bool)


def summary_table(rows: list[dict]) -> str:
    """variant (x the facets that vary) by seq_len: median ms, or the status as a word.
    Variants with no cell that could run here are listed below the table with the reason."""

    from bench.model.row import current_rows

    rows = current_rows(rows)  # a cell measured again: its newest row
    if not rows:
        return "(no rows)"
    df = pd.DataFrame(rows)
    if "median_ms" not in df:
        df["median_ms"] = None
    facets = [c for c in CASE_FACETS if c != "kv_len" and c in df and df[c].astype(str).nunique() > 1]
    if (df["kv_len"] != df["q_len"]).any():
        facets.append("kv_len")
    shaky = shaky_mask(df)
    df["cell"] = [(figures(m) + ("*" if f else "")) if s == "ok" else s
                  for m, s, f in zip(df["median_ms"], df["status"], shaky)]
    never = df.groupby("variant")["status"].agg(lambda s: (s == "unsupported").all())
    skipped = df[df["variant"].isin(never[never].index)]
    df = df[~df["variant"].isin(never[never].index)]
    # rows of a variant in a facet it does not declare (e.g. window.chunked under mask=causal)
    df = df.groupby(facets + ["variant"], dropna=False).filter(
        lambda g: not (g["status"] == "unsupported").all())
    lines = []
    mixed = "mix" in df and not df.empty and bool((df["mix"].astype(str) != "none").all())
    if mixed:  # a mix is one batch, not a length: one column per mix
        facets = [f for f in facets if f not in ("mix", "kv_len")]
    if not df.empty:
        column, label = ("mix", "{}") if mixed else ("q_len", "n={}")
        table = cell_pivot(df, facets + ["variant"], column, "cell", label=label)
        lines.append("median ms (or status) by batch mix" if mixed else "median ms (or status) by sequence length")
        lines.append(tabulate(table.reset_index(), headers="keys", showindex=False))
        if shaky[df.index].any():
            lines.append("* shaky: too few samples for a 95% interval, contended (timed while the CPU was shared) or "
                         "throttled: kept, but flagged")
    for name, g in skipped.groupby("variant"):
        lines.append(f"unsupported here: {name}: {g['reason'].iloc[0]}")
    return "\n".join(lines)
