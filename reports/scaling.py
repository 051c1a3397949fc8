"""Empirical scaling: log-log least-squares exponents, crossovers, largest n before failure."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.runs import judge
from reports.frames import facet_groups, facet_labels, paired_ratio

MIN_FIT_POINTS = 3  # two points always lie on a line: an exponent from them would say nothing about its fit


def fit_exponent(n, y, sigma=None) -> dict:
    """Weighted least-squares fit of log y = a * log n + b: the exponent a with its 95% interval,
    R^2 and the n range; no exponent from fewer than MIN_FIT_POINTS lengths.  ``sigma``: each
    point's relative uncertainty (bench.runs.judge.fit_sigma), its weight 1 / sigma^2.  The
    interval is the slope's standard error from those sigmas, widened by the scatter about the
    line where it exceeds them (a reduced chi-square above 1: the points depart from a power law,
    or the sigmas were optimistic), with Student's t then."""
    n = np.asarray(n, dtype=float)
    y = np.asarray(y, dtype=float)
    s = np.full_like(n, 0.02) if sigma is None else np.asarray(sigma, dtype=float)
    ok = np.isfinite(n) & np.isfinite(y) & (n > 0) & (y > 0) & np.isfinite(s) & (s > 0)
    n, y, s = n[ok], y[ok], s[ok]
    empty = {"exponent": math.nan, "exponent_lo": math.nan, "exponent_hi": math.nan, "r2": math.nan,
             "points": int(len(n)), "n_min": n.min() if len(n) else math.nan, "n_max": n.max() if len(n) else math.nan}
    if len(np.unique(n)) < MIN_FIT_POINTS:
        return empty
    x, z, w = np.log(n), np.log(y), 1.0 / s**2  # a relative sigma is the sigma of log y
    xm = float((w * x).sum() / w.sum())
    sxx = float((w * (x - xm) ** 2).sum())
    a = float((w * (x - xm) * (z - (w * z).sum() / w.sum())).sum() / sxx)
    b = float((w * z).sum() / w.sum()) - a * xm
    resid = z - (a * x + b)
    dof = len(n) - 2
    chi2 = float((w * resid**2).sum()) / dof if dof > 0 else math.nan
    se = math.sqrt(1.0 / sxx)
    if dof > 0 and chi2 > 1.0:
        from bench.measure.stats import t_quantile

        se *= math.sqrt(chi2)
        q = t_quantile(0.975, dof)
    else:
        q = 1.959963984540054
    ss_tot = float(((z - z.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 and len(n) > 2 else math.nan
    return {"exponent": a, "exponent_lo": a - q * se, "exponent_hi": a + q * se, "r2": r2, "points": int(len(n)),
            "n_min": float(n.min()), "n_max": float(n.max())}


def _series(df: pd.DataFrame, keep: pd.Series | None = None):
    """(facet label, variant, that series' rows as records, n ascending) in facet_groups' order,
    variants sorted: one pass over the frame however many facets it has.  ``keep``: only these
    rows, under the facets of the whole frame."""
    if df.empty:
        return
    label = facet_labels(df)
    order = {name: i for i, (name, _) in enumerate(facet_groups(df))}
    if keep is not None:
        df, label = df[keep], label[keep]
    records = df.to_dict("records")
    index = df.groupby([label, df["variant"]], sort=False).indices
    for (name, variant), rows in sorted(index.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        yield name, variant, sorted((records[i] for i in rows), key=lambda r: r["n"])


def scaling_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per facet and variant: time and memory exponents, R^2, n range, largest n that ran,
    and the first failure above it."""
    out = []
    for label, variant, rows in _series(df):
        ok = [r for r in rows if r["status"] == "ok"]
        if not ok:
            continue
        sigma = [judge.fit_sigma(r) for r in ok]  # every measured cell, weighed by its uncertainty
        kept = [(r, s) for r, s in zip(ok, sigma) if s is not None]
        t = fit_exponent([r["n"] for r, _ in kept], [r["median_ms"] for r, _ in kept], [s for _, s in kept])
        m = fit_exponent([r["n"] for r in ok], [r["peak_mem_bytes"] for r in ok])  # counted, not timed: every ok cell
        f = fit_exponent([r["n"] for r, _ in kept], [r.get("flops") for r, _ in kept])  # exact: the work's own
        largest = int(max(r["n"] for r in ok))
        above = [r for r in rows if r["n"] > largest and r["status"] != "ok"]
        fail = f"{above[0]['status']} at n={int(above[0]['n'])}" if above else ""
        out.append({"facet": label, "variant": variant, "time_exp": t["exponent"], "time_exp_lo": t["exponent_lo"],
                    "time_exp_hi": t["exponent_hi"], "time_r2": t["r2"], "flops_exp": f["exponent"],
                    "time_note": exponent_note(t, f["exponent"]), "mem_exp": m["exponent"], "mem_r2": m["r2"],
                    "n_range": f"{int(t['n_min'])}-{int(t['n_max'])}" if t["points"] else "",
                    "points": t["points"], "weighted_down": judge.weighted_down(ok),
                    "largest_ok_n": largest, "first_failure": fail})
    return pd.DataFrame(out)


def exponent_note(t: dict, flops_exp: float) -> str:
    """What the report says beside a time exponent: uncertain when its 95% interval is wider than
    judge.EXPONENT_UNCERTAIN either way, and where the FLOPs' exponent lies outside that interval,
    that the time departs from the work (a cache effect, a kernel's overhead at short lengths)."""
    a, lo, hi = t["exponent"], t["exponent_lo"], t["exponent_hi"]
    if not math.isfinite(a):
        return ""
    notes = []
    if (hi - lo) / 2 > judge.EXPONENT_UNCERTAIN:
        notes.append(f"uncertain (95% interval {lo:.2f}-{hi:.2f})")
    if math.isfinite(flops_exp) and not lo <= flops_exp <= hi:
        notes.append(f"departs from the FLOPs' {flops_exp:.2f}: time grows {'faster' if a > flops_exp else 'slower'} "
                     f"than the work")
    return "; ".join(notes)


def _side(a: dict, b: dict) -> int:
    """+1 when a is slower than b beyond noise, -1 when faster, 0 when it cannot be told.
    Paired (both measured in the same interleaved rounds): a/b in every round on one side
    of 1.  Otherwise: the interquartile ranges apart.  Either way the ratio must also be
    beyond judge.SAME_WITHIN, the closeness the charts draw as equal."""
    from bench.runs.judge import beyond_same

    ratio, lo, hi, _ = paired_ratio(b, a)  # a / b
    return beyond_same(ratio, lo, hi)  # and beyond the 3 % within which the charts call two the same


def crossover_note(df: pd.DataFrame, cross: pd.DataFrame) -> str:
    """What the report says where the crossovers table is empty: that none happens, or that
    too few clean points were left to tell (N shaky)."""
    if not cross.empty:
        return ""
    ok = df[df["status"] == "ok"]
    shaky = int(ok["shaky"].sum()) if "shaky" in ok else 0
    if shaky:
        return (f"Not enough clean points to find a crossover ({shaky} shaky: cells with too few samples, noisy or "
                f"contended are left out; re-measure them with --resume RUN --retry shaky).")
    return "No variant overtakes another within the measured range."


def crossovers(df: pd.DataFrame) -> pd.DataFrame:
    """Where one variant overtakes another: it is slower beyond noise at one n and faster
    beyond noise at a later n (see _side; shaky cells are left out).  The
    crossing length is where the log-log interpolation of the paired time ratios between
    those two n crosses 1."""
    out = []
    keep = df["status"] == "ok"
    if "shaky" in df:
        keep &= ~df["shaky"].fillna(False).astype(bool)
    facets: dict = {}
    for label, variant, rows in _series(df.drop(columns=["samples_ms"], errors="ignore"), keep):
        facets.setdefault(label, {})[variant] = {int(r["n"]): r for r in rows}
    for label, stats in facets.items():
        names = sorted(stats)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                common = sorted(set(stats[a]) & set(stats[b]))
                last = None  # (n, side, log ratio) of the last point outside noise
                for n in common:
                    ra, rb = stats[a][n], stats[b][n]
                    side = _side(ra, rb)
                    if side == 0:
                        continue
                    d = math.log(paired_ratio(rb, ra)[0])
                    if last is not None and side != last[1]:
                        n0, d0 = last[0], last[2]
                        f = d0 / (d0 - d) if d0 != d else 0.5
                        n_cross = math.exp(math.log(n0) + f * (math.log(n) - math.log(n0)))
                        faster, slower = (b, a) if side > 0 else (a, b)
                        out.append({"facet": label, "faster_above": faster, "slower_above": slower,
                                    "n_cross": round(n_cross), "between": f"{int(n0)}-{int(n)}"})
                    last = (n, side, d)
    return pd.DataFrame(out, columns=["facet", "faster_above", "slower_above", "n_cross", "between"])
