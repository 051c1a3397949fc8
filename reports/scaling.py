"""Empirical scaling: log-log least-squares exponents, crossovers, largest n before failure."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.frames import facet_groups


def fit_exponent(n, y) -> dict:
    """Least-squares fit of log y = a * log n + b: the exponent a, R^2 and the n range."""
    n = np.asarray(n, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(n) & np.isfinite(y) & (n > 0) & (y > 0)
    n, y = n[ok], y[ok]
    if len(np.unique(n)) < 2:
        return {"exponent": math.nan, "r2": math.nan, "points": int(len(n)),
                "n_min": n.min() if len(n) else math.nan, "n_max": n.max() if len(n) else math.nan}
    x, z = np.log(n), np.log(y)
    a, b = np.polyfit(x, z, 1)
    resid = z - (a * x + b)
    ss_tot = float(((z - z.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 and len(n) > 2 else math.nan
    return {"exponent": float(a), "r2": r2, "points": int(len(n)), "n_min": float(n.min()),
            "n_max": float(n.max())}


def scaling_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per facet and variant: time and memory exponents, R^2, n range, largest n that ran,
    and the first failure above it."""
    out = []
    for label, g in facet_groups(df):
        for variant, v in g.groupby("variant", sort=True):
            okv = v[v["status"] == "ok"]
            if okv.empty:
                continue
            t = fit_exponent(okv["n"], okv["median_ms"])
            m = fit_exponent(okv["n"], okv["peak_mem_bytes"])
            largest = int(okv["n"].max())
            above = v[(v["n"] > largest) & (v["status"] != "ok")].sort_values("n")
            fail = f"{above['status'].iloc[0]} at n={int(above['n'].iloc[0])}" if len(above) else ""
            out.append({"facet": label, "variant": variant, "time_exp": t["exponent"], "time_r2": t["r2"],
                        "mem_exp": m["exponent"], "mem_r2": m["r2"],
                        "n_range": f"{int(t['n_min'])}-{int(t['n_max'])}" if t["points"] else "",
                        "points": t["points"], "largest_ok_n": largest, "first_failure": fail})
    return pd.DataFrame(out)


def _side(a, b) -> int:
    """+1 when a is slower than b beyond noise (a's q1 above b's q3), -1 when faster beyond
    noise, 0 when their interquartile ranges overlap."""
    if a["q1"] > b["q3"]:
        return 1
    if a["q3"] < b["q1"]:
        return -1
    return 0


def crossovers(df: pd.DataFrame) -> pd.DataFrame:
    """Where one variant overtakes another: it is slower beyond noise at one n and faster
    beyond noise at a later n (IQRs not overlapping at either).  The crossing length is
    where the log-log interpolation of the medians between those two n crosses."""
    out = []
    for label, g in facet_groups(df):
        ok = g[g["status"] == "ok"].copy()
        ok["q1"] = ok["q1_ms"].fillna(ok["median_ms"]) if "q1_ms" in ok else ok["median_ms"]
        ok["q3"] = ok["q3_ms"].fillna(ok["median_ms"]) if "q3_ms" in ok else ok["median_ms"]
        stats = {name: v.groupby("n")[["median_ms", "q1", "q3"]].median() for name, v in ok.groupby("variant")}
        names = sorted(stats)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                common = sorted(set(stats[a].index) & set(stats[b].index))
                last = None  # (n, side) of the last point outside noise
                for n in common:
                    side = _side(stats[a].loc[n], stats[b].loc[n])
                    if side == 0:
                        continue
                    if last is not None and side != last[1]:
                        n0, n1 = last[0], n
                        d0 = math.log(stats[a].loc[n0, "median_ms"] / stats[b].loc[n0, "median_ms"])
                        d1 = math.log(stats[a].loc[n1, "median_ms"] / stats[b].loc[n1, "median_ms"])
                        f = d0 / (d0 - d1) if d0 != d1 else 0.5
                        n_cross = math.exp(math.log(n0) + f * (math.log(n1) - math.log(n0)))
                        faster, slower = (b, a) if side > 0 else (a, b)
                        out.append({"facet": label, "faster_above": faster, "slower_above": slower,
                                    "n_cross": round(n_cross), "between": f"{int(n0)}-{int(n1)}"})
                    last = (n, side)
    return pd.DataFrame(out, columns=["facet", "faster_above", "slower_above", "n_cross", "between"])
