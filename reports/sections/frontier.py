"""The report's memory model and predicted frontier: for each series of self-attention cells
with three lengths or more, peak memory above the inputs as a·n² + b·n + c
(bench.runs.memmodel), its error on the largest length when fitted without it, the next
doubling's predicted peak, and the largest n the machine's memory holds (written to
``frontier.csv`` for every run; ``python -m bench frontier`` measures it with real cells)."""

from __future__ import annotations

import math

import pandas as pd

from bench.runs import memmodel
from reports.sections import Section, SectionInput

NOTE = ("Peak memory above the inputs fitted as a·n² + b·n + c per variant and case (dtype, mask, direction, heads, "
        "head dims, batch), minimising relative error. 'held out' refits without the largest n and predicts it: the "
        "model is trusted within {limit:.0f}% (a prediction past it says untrusted; one from three lengths, "
        "unchecked). 'next doubling' predicts 2 x the largest n with that error. The "
        "predicted frontier is the largest n whose inputs and peak fit {budget}; its time extrapolates the largest ok "
        "cell's with the series' time exponent. `python -m bench frontier --memory-budget SIZE` finds it with real "
        "cells.")


def memory_table(df: pd.DataFrame, envs: list[dict]) -> tuple[pd.DataFrame, float | None]:
    """One row per memory model, and the budget the predicted frontier is taken at."""
    budget = next((b for e in envs if (b := memmodel.budget_of(e))), None)
    from bench.model.case import CASE_FIELDS

    cols = [c for c in ("variant", *CASE_FIELDS, "status", "peak_mem_bytes") if c in df]
    usable = df[(df["status"] == "ok") & (df["q_len"] == df["kv_len"])] if len(df) else df
    rows = [r | {"window": _whole(r.get("window")), "head_dim_v": _whole(r.get("head_dim_v"))}  # the frame's "-"
            for r in usable[cols].to_dict("records")]  # and NaN back to the rows' None
    if "median_ms" not in df:
        df = df.assign(median_ms=math.nan)
    out = []
    keys = ["variant", "dtype", "mask", "direction", "heads", "kv_heads", "head_dim", "batch"]
    ok = df[(df["status"] == "ok") & (df["q_len"] == df["kv_len"])]
    by_key = {k: g for k, g in ok.groupby(keys, sort=False)} if len(ok) else {}
    empty = ok.iloc[0:0]
    for m in memmodel.models(rows):
        key = m.key
        series = by_key.get(tuple(key[k] for k in keys), empty)
        largest = int(series["q_len"].max()) if len(series) else None
        ms = float(series.loc[series["q_len"].idxmax(), "median_ms"]) if len(series) else math.nan
        exponent = _exponent(series)
        n_star = m.largest_n(budget) if budget else None
        next_n, next_peak = m.next_doubling()
        out.append({
            "variant": key["variant"], "dtype": key["dtype"], "mask": key["mask"], "direction": key["direction"],
            "heads": key["heads"], "kv_heads": key["kv_heads"], "head_dim": key["head_dim"], "batch": key["batch"],
            "a_bytes_per_n2": m.a, "b_bytes_per_n": m.b, "c_mib": m.c / 2**20, "lengths": len(m.ns),
            "held_out_n": m.held_out_n, "held_out_err_pct": None if m.held_out_err is None else 100 * m.held_out_err,
            "trusted": m.trusted, "next_n": next_n, "next_peak_mib": next_peak / 2**20,
            "largest": n_star, "budget_gib": budget / 2**30 if budget else None,
            "median_ms_at_largest": (ms * (n_star / largest) ** exponent
                                     if n_star and largest and not math.isnan(exponent) else None)})
    return pd.DataFrame(out), budget


def _whole(x):
    return None if x is None or x == "-" or (isinstance(x, float) and math.isnan(x)) else int(x)


def _exponent(series: pd.DataFrame) -> float:
    from reports.scaling import fit_exponent

    return fit_exponent(series["q_len"], series["median_ms"])["exponent"] if len(series) else math.nan


def sections(ctx: SectionInput) -> list[Section]:
    """frontier.csv (every run, empty when no series has three lengths), and the page's section:
    the memory models and the predicted frontier chart."""
    from reports.charts import declared_colours, frontier_chart

    df, envs, folder, charts_dir = ctx.df, ctx.envs, ctx.folder, ctx.charts_dir
    table, budget = memory_table(df, envs)
    table.to_csv(folder / "frontier.csv", index=False)
    chart = None
    if not table.empty and budget and table["largest"].notna().any():
        # one case for every bar: the one most variants were fitted on (a variant's bars are not compared across masks)
        case_cols = ["dtype", "mask", "direction", "heads", "kv_heads", "head_dim", "batch"]
        drawn = table[table["largest"].notna()]
        key = drawn.groupby(case_cols, sort=False).size().idxmax()
        one = drawn[(drawn[case_cols] == pd.Series(key, index=case_cols)).all(axis=1)]
        charts_dir.mkdir(parents=True, exist_ok=True)
        case = "{} {} {} h={}/{} d={} b={}".format(*key)
        chart = frontier_chart(one, charts_dir / "frontier", f"Predicted largest n within {budget / 2**30:.3g} GiB "
                                                             f"(the machine's memory less 10%)\n{case}", predicted=True,
                               declared=declared_colours(envs))
    budget_text = f"{budget / 2**30:.3g} GiB (this machine's memory less 10%)" if budget else "the machine's memory"
    note = NOTE.format(limit=100 * memmodel.HELD_OUT_LIMIT, budget=budget_text)
    return [Section("memory", "Memory model and frontier", note, _shown(table), [chart] if chart else [],
                    "predicted frontier")]


def _num(x: float) -> str:
    """A coefficient at 4 figures; a least-squares residue (|x| < 1e-6) as 0."""
    return "0" if abs(x) < 1e-6 else f"{x:.4g}"


def _shown(t: pd.DataFrame) -> pd.DataFrame:
    if t.empty:
        return t
    return pd.DataFrame({
        "variant": t["variant"], "case": [f"{d} {m} {r} h={h}/{k} d={hd} b={b}" for d, m, r, h, k, hd, b in
                                          zip(t["dtype"], t["mask"], t["direction"], t["heads"], t["kv_heads"],
                                              t["head_dim"], t["batch"])],
        "a (B/n²)": t["a_bytes_per_n2"].map(_num), "b (B/n)": t["b_bytes_per_n"].map(_num),
        "c (MiB)": t["c_mib"].map(_num),
        "held out": [f"n={int(n)}: {e:.1f}%" if e is not None and not pd.isna(e) else "-"
                     for n, e in zip(t["held_out_n"], t["held_out_err_pct"])],
        "next doubling": [f"n={int(n)}: {p:.4g} MiB" + (f" ±{e:.0f}%" if e is not None and not pd.isna(e) else "")
                          for n, p, e in zip(t["next_n"], t["next_peak_mib"], t["held_out_err_pct"])],
        "predicted largest n": ["-" if x is None or pd.isna(x) else f"{int(x):,}" + _caveat(ok, e)
                                for x, ok, e in zip(t["largest"], t["trusted"], t["held_out_err_pct"])]})


def _caveat(trusted: bool, err) -> str:
    """What a prediction rests on: nothing to add for a model held within the limit."""
    if err is None or pd.isna(err):
        return " (unchecked: 3 lengths)"
    return "" if trusted else " (untrusted)"
