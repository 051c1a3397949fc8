"""Where O(n^2) starts to matter (``--scope block|encoder|decoder``): attention's share of the
layer against n per variant, the n at which the attention cores take as long as the rest of
the layer (measured, with its interval, and from the FLOPs), and the layer time the fastest
exact core saves against the baseline at each n.

A layer row's ``layer`` column (bench.scopes.layer_run.layer_figures) holds each part's median,
95% interval and FLOPs.  The cores are ``core`` and, in a decoder, ``core_cross``; the rest is
every other part (projections, output projection, norms and residuals, FFN).  On a GPU a
forward's parts are also timed inside whole calls (``layer["in_call"]``: events around each part,
the L2 as the layer leaves it), and those figures are the ones the share, the crossovers and the
parts' sum come from; the parts timed alone (each its own call, after an L2 flush) stay beside
them (``share_isolated``, the table's "share alone")."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from reports.sections import Section, SectionInput

SERIES = ("scope", "ffn", "device", "dtype", "direction", "mask", "window", "heads", "kv_heads", "head_dims", "batch",
          "kv")  # one curve per variant within these
NOTE = ("Attention's share is the cores' time (self and, in a decoder, cross) over the sum of the layer's parts, "
        "each part timed as its own call in the whole layer's rounds, or, on a GPU forward, inside whole calls (events "
        "around each part, the cache as the layer leaves it: 'parts timed' says which; 'share alone' is the share "
        "from the parts timed as their own calls). The crossover n is where the cores take as long "
        "as the rest of the layer: measured (log-log interpolation of core/rest between the lengths that straddle 1; "
        "its interval from the parts' 95% intervals; 'extrapolated' when no swept length straddles it) and analytic "
        "(the same on the FLOPs: core O(n² d) against projections and FFN O(n d²)). A sum of parts more than 15% "
        "away from the whole call is flagged in the share table.")
SAVED_NOTE = ("At each n, the fastest exact core in the layer against the baseline's: the layer time it saves, in ms "
              "and in % of the baseline's layer (its whole call).")


def layer_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One line per ok layer row: its series, n, the cores' and the rest's time with their
    interval ends, their FLOPs, the whole call and the parts' sum against it."""
    if "layer" not in df or "scope" not in df:
        return pd.DataFrame()
    rows = []
    for _, r in df[(df["status"] == "ok") & (df["scope"].astype(str) != "core")].iterrows():
        layer = r["layer"]
        if not isinstance(layer, dict) or not layer.get("parts"):
            continue
        alone = layer["parts"]
        inside = layer.get("in_call") if isinstance(layer.get("in_call"), dict) else None
        inside = inside if inside and inside.get("parts") and set(inside["parts"]) == set(alone) else None
        timed = {p: v | {"flops": alone[p].get("flops")} for p, v in inside["parts"].items()} if inside else alone
        core, rest = _sums(timed, True), _sums(timed, False)
        core_alone, rest_alone = _sums(alone, True)[0], _sums(alone, False)[0]
        source = inside or layer
        rows.append({**{k: r.get(k) for k in SERIES}, "variant": r["variant"], "n": int(r["n"]),
                     "approximate": bool(r.get("approximate") or False),
                     "core_ms": core[0], "core_lo": core[1], "core_hi": core[2], "core_flops": core[3],
                     "rest_ms": rest[0], "rest_lo": rest[1], "rest_hi": rest[2], "rest_flops": rest[3],
                     "whole_ms": layer.get("whole_ms"), "sum_ratio": source.get("sum_ratio"),
                     "sum_agrees": source.get("sum_agrees"), "timed": "in whole calls" if inside else "alone",
                     "share_isolated": core_alone / (core_alone + rest_alone) if core_alone + rest_alone else None})
    out = pd.DataFrame(rows)
    if not out.empty:
        out["share"] = out["core_ms"] / (out["core_ms"] + out["rest_ms"])
    return out


def _sums(parts: dict, cores: bool) -> tuple[float, float, float, float]:
    """(median, interval low, interval high, FLOPs) summed over the cores or over the rest; a part
    without an interval counts its median at both ends."""
    med = lo = hi = flops = 0.0
    for name, p in parts.items():
        if name.startswith("core") != cores:
            continue
        m = float(p["median_ms"])
        med += m
        lo += float(p["ci_lo_ms"]) if p.get("ci_lo_ms") is not None else m
        hi += float(p["ci_hi_ms"]) if p.get("ci_hi_ms") is not None else m
        flops += float(p.get("flops") or 0.0)
    return med, lo, hi, flops


MIN_SLOPE = 0.25  # the least growth of core/rest against n (log-log) that is extrapolated to a crossing


def crossing(ns, ratios, fit: bool = False) -> tuple[float | None, bool]:
    """(n where ``ratios`` (core over rest, against ``ns``) cross 1, extrapolated?): log-log
    interpolation between the first pair of lengths that straddles 1; else the line fitted to
    log ratio against log n, extended, when it rises; (None, False) when it never reaches 1.
    ``fit``: the fitted line alone (an extrapolated estimate's interval ends, read the same way)."""
    pts = sorted((float(n), float(r)) for n, r in zip(ns, ratios) if r and r > 0 and n and n > 0)
    if not pts:
        return None, False
    for (n0, r0), (n1, r1) in zip(pts, pts[1:]) if not fit else ():
        if (r0 - 1) * (r1 - 1) <= 0 and r0 != r1:
            f = math.log(r0) / (math.log(r0) - math.log(r1))
            return math.exp(math.log(n0) + f * (math.log(n1) - math.log(n0))), False
    if len(pts) < 2:
        return None, False
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    slope, icept = np.polyfit(x, y, 1)
    if abs(slope) < MIN_SLOPE:  # levelling off (a window: the core grows as n, as the rest): it never reaches 1
        return None, False
    n_star = math.exp(-icept / slope)
    return (n_star, True) if 0 < n_star < 1e12 else (None, False)


def crossover_table(lf: pd.DataFrame) -> pd.DataFrame:
    """Per series and variant: the measured crossover n with its interval, and the analytic one."""
    if lf.empty:
        return pd.DataFrame()
    out = []
    keys = [k for k in SERIES if k in lf] + ["variant"]
    for key, g in lf.groupby(keys, sort=False, dropna=False):
        g = g.sort_values("n")
        ns = g["n"].tolist()
        mid, extra = crossing(ns, (g["core_ms"] / g["rest_ms"]).tolist())
        # the ends: the cores slow and the rest fast, and the other way round, read as the estimate was
        low, _ = crossing(ns, (g["core_hi"] / g["rest_lo"]).tolist(), fit=extra)
        high, _ = crossing(ns, (g["core_lo"] / g["rest_hi"]).tolist(), fit=extra)
        analytic, a_extra = crossing(ns, (g["core_flops"] / g["rest_flops"]).tolist()) \
            if (g["rest_flops"] > 0).all() else (None, False)
        series = dict(zip(keys, key))
        out.append({"scope": series.get("scope"), "case": _case(series), "variant": series["variant"],
                    "lengths": f"{ns[0]}-{ns[-1]}" if len(ns) > 1 else str(ns[0]),
                    "share at largest n": f"{100 * g['share'].iloc[-1]:.0f}%",
                    "parts timed": ", ".join(sorted(set(g["timed"]))),
                    "share alone": f"{100 * g['share_isolated'].iloc[-1]:.0f}%"
                    if g["share_isolated"].iloc[-1] is not None else "-",
                    "measured crossover n": _n(mid, extra),
                    "95% interval": "-" if mid is None else _interval(low, high, mid),
                    "analytic crossover n": _n(analytic, a_extra),
                    "parts sum / whole": ", ".join(f"{x:.2f}" for x in g["sum_ratio"].dropna())})
    return pd.DataFrame(out)


def _interval(a, b, mid) -> str:
    """The interval's ends, low first (a falling ratio crosses in the other order), widened to hold
    the estimate (extrapolated lines of noisy ends can pass it); an end that never crosses is open."""
    ends = sorted(x for x in (a, b) if x is not None)
    if len(ends) == 2:
        ends = [min(ends[0], mid), max(ends[1], mid)]
    elif len(ends) == 1:
        ends = [min(ends[0], mid)]
    if len(ends) < 2:
        return f"{_n(ends[0], False)} .. open" if ends else "open"
    return f"{_n(ends[0], False)} .. {_n(ends[1], False)}"


def _n(x, extrapolated: bool) -> str:
    if x is None or not math.isfinite(x):
        return "none"
    return f"{round(x):,}" + (" (extrapolated)" if extrapolated else "")


def _case(s: dict) -> str:
    ffn = f" {s['ffn']}" if s.get("ffn") not in (None, "none") else ""
    return (f"{s.get('dtype')} {s.get('mask')} {s.get('direction')} h={s.get('heads')}/{s.get('kv_heads')} "
            f"d={s.get('head_dims')} b={s.get('batch')}{ffn}" + (f" kv={s['kv']}" if s.get("kv") not in (None, "self")
                                                                else ""))


def saved_table(lf: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """At each series and n: the fastest exact core's saving against the baseline's, in ms and in %
    of the baseline's whole layer."""
    if lf.empty or not baseline or baseline not in set(lf["variant"]):
        return pd.DataFrame()
    out = []
    keys = [k for k in SERIES if k in lf] + ["n"]
    for key, g in lf.groupby(keys, sort=False, dropna=False):
        base = g[g["variant"] == baseline]
        exact = g[~g["approximate"]]
        if base.empty or exact.empty:
            continue
        best = exact.loc[exact["core_ms"].idxmin()]
        b = base.iloc[0]
        saved = float(b["core_ms"] - best["core_ms"])
        series = dict(zip(keys, key))
        out.append({"scope": series.get("scope"), "case": _case(series), "n": int(series["n"]),
                    "baseline layer ms": round(float(b["whole_ms"]), 4), "fastest exact core": best["variant"],
                    "its core ms": round(float(best["core_ms"]), 4), "baseline core ms": round(float(b["core_ms"]), 4),
                    "saved ms": round(saved, 4), "saved % of layer": round(100 * saved / float(b["whole_ms"]), 1)})
    return pd.DataFrame(out)


MAX_PANELS = 12  # as reports.groups.MAX_FACETS: more series make more charts


def share_charts(lf: pd.DataFrame, out: Path, style: dict | None = None) -> list[Path]:
    """Attention's share of the layer against n, one panel per series and one line per variant, in
    charts of at most MAX_PANELS panels (``out``, then ``out``-2, -3, ...): every series drawn."""
    if lf.empty:
        return []
    keys = [k for k in SERIES if k in lf]
    groups = list(lf.groupby(keys, sort=False, dropna=False))
    chunks = [groups[i:i + MAX_PANELS] for i in range(0, len(groups), MAX_PANELS)]
    return [_share_chart(chunk, keys, out if i == 0 else out.with_name(f"{out.name}-{i + 1}"), style)
            for i, chunk in enumerate(chunks)]


def _share_chart(groups: list, keys: list, out: Path, style: dict | None) -> Path:
    from reports.charts import figure_legend, new_figure, save_figure

    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = new_figure(rows, cols, figsize=(4.2 * cols, 3.2 * rows + 0.6), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (key, g) in zip(flat, groups):
        for variant, s in g.groupby("variant", sort=True):
            s = s.sort_values("n")
            kw = (style or {}).get(variant, {})
            ax.plot(s["n"], 100 * s["share"], label=variant, color=kw.get("color"), marker=kw.get("marker", "o"),
                    linewidth=kw.get("lw", 1.5), zorder=kw.get("z", 3))
        ax.axhline(50, color="0.6", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 100)
        ax.set_xlabel("n")
        ax.set_ylabel("attention's share of the layer (%)")
        series = dict(zip(keys, key))
        ax.set_title(f"{series.get('scope')}: {_case(series)}", fontsize=8)
    for ax in flat[len(groups):]:
        ax.set_visible(False)
    figure_legend(fig, flat[:len(groups)])
    return save_figure(fig, out)[0]


def sections(ctx: SectionInput) -> list[Section]:
    """layer.csv and layer_saved.csv, and the two sections of the page (none without layer rows)."""
    lf = layer_frame(ctx.df)
    if lf.empty:
        return []
    table, saved = crossover_table(lf), saved_table(lf, ctx.baseline)
    table.to_csv(ctx.folder / "layer.csv", index=False)
    saved.to_csv(ctx.folder / "layer_saved.csv", index=False)
    charts = share_charts(lf, ctx.charts_dir / "layer_share", ctx.style)
    return [Section("layer", "Attention in its layer: where O(n²) starts to matter", NOTE, table, charts,
                    "attention's share of the layer against n"),
            Section("layer-saved", "Layer time saved by the fastest exact core", SAVED_NOTE, saved)]
