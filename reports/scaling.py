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


def crossovers(df: pd.DataFrame) -> pd.DataFrame:
    """Where one variant overtakes another: between consecutive common n where the sign of
    log(t_a / t_b) changes, the n at which the log-log interpolation crosses zero."""
    out = []
    for label, g in facet_groups(df):
        ok = g[g["status"] == "ok"]
        piv = ok.pivot_table(index="n", columns="variant", values="median_ms", aggfunc="median")
        names = sorted(piv.columns)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pair = piv[[a, b]].dropna()
                if len(pair) < 2:
                    continue
                d = np.log(pair[a].to_numpy()) - np.log(pair[b].to_numpy())
                ns = pair.index.to_numpy(dtype=float)
                for j in range(len(d) - 1):
                    if d[j] == 0 or np.sign(d[j]) == np.sign(d[j + 1]):
                        continue
                    f = d[j] / (d[j] - d[j + 1])
                    n_cross = math.exp(math.log(ns[j]) + f * (math.log(ns[j + 1]) - math.log(ns[j])))
                    faster = b if d[j + 1] > 0 else a  # faster above the crossover
                    slower = a if faster == b else b
                    out.append({"facet": label, "faster_above": faster, "slower_above": slower,
                                "n_cross": round(n_cross), "between": f"{int(ns[j])}-{int(ns[j + 1])}"})
    return pd.DataFrame(out, columns=["facet", "faster_above", "slower_above", "n_cross", "between"])
