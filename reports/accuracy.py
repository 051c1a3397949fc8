"""Charts that explain the numbers: error against n and speed against error for approximate
variants (with the Pareto front), and the roofline (achieved FLOP/s against arithmetic
intensity, under the measured bandwidth and matmul ceilings)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from reports.charts import log_tick_values, minor_label, new_figure, place_grid, save_figure
from reports.frames import facet_groups

MAX_PANELS = 12
PARETO_PANELS = 8  # panels of the Pareto chart, one legend below them
EXACT_FLOOR = 1e-8  # an exact variant's error is drawn no lower than this (log axis)


PANEL = (4.4, 3.3)  # inches: three across with the legend at the right fit a 1400 px page


def _grid(n: int):
    """A figure of ``n`` panels, three across, placed by ``finish`` once drawn."""
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = new_figure(rows, cols, figsize=(10, 10), squeeze=False, layout="none")
    for ax in axes.flat[n:]:
        fig.delaxes(ax)
    return fig, list(axes.flat[:n])


def finish(fig, axes, out: Path) -> list[Path]:
    """The panels placed with one legend at the right (charts.place_grid), then saved."""
    place_grid(fig, axes, min(3, len(axes)), PANEL)
    return save_figure(fig, out)


def _points(ax, v: pd.DataFrame, x: str, y: str, st: dict, label: str | None) -> None:
    shaky = v["shaky"].to_numpy(dtype=bool) if "shaky" in v else np.zeros(len(v), bool)
    if (~shaky).any():
        ax.scatter(v[x][~shaky], v[y][~shaky], color=st["color"], marker=st["marker"], s=34, zorder=st["z"] + 0.1,
                   label=label)
    if shaky.any():  # hollow: shaky; one legend entry per variant
        ax.scatter(v[x][shaky], v[y][shaky], facecolors="white", edgecolors=st["color"], marker=st["marker"], s=34,
                   zorder=st["z"] + 0.1, label=None if (~shaky).any() else label)


def _plain(ax, axis: str = "both") -> None:
    fmt = FuncFormatter(lambda val, _pos: f"{val:g}")
    if axis in ("x", "both"):
        ax.xaxis.set_major_formatter(fmt)
    if axis in ("y", "both"):
        ax.yaxis.set_major_formatter(fmt)
        ax.yaxis.set_minor_formatter(FuncFormatter(minor_label))  # 2 and 5 of a decade, no mathtext


def log_ticks(ax) -> None:
    """1-2-5 ticks, every one labelled, across a log y axis's drawn range: a range shorter than
    a decade (an error between 0.3 and 2, say) still reads."""
    ticks = log_tick_values(*ax.get_ylim())
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda val, _pos: f"{val:g}"))
    ax.yaxis.set_minor_locator(NullLocator())


def _style(style: dict, name: str) -> dict:
    return style.get(name, {"color": "gray", "marker": "o", "lw": 1.5, "z": 3})


def _approximate_rows(df: pd.DataFrame) -> pd.DataFrame:
    approx = df["approximate"].fillna(False).astype(bool) if "approximate" in df else pd.Series(False, df.index)
    return df[approx]


def error_chart(df: pd.DataFrame, out: Path, style: dict) -> list[Path]:
    """Relative error of each approximate variant's output against n, per facet (log-log)."""
    ok = df[(df["status"].isin(["ok", "mismatch"])) & df["rel_err"].notna()]
    approx = _approximate_rows(ok)
    if approx.empty:
        return []
    groups = [(label, g) for label, g in facet_groups(approx)][:MAX_PANELS]
    fig, axes = _grid(len(groups))
    for ax, (label, g) in zip(axes, groups):
        for name, v in g.groupby("variant", sort=True):
            v = v.sort_values("n")
            st = _style(style, name)
            ax.plot(v["n"], v["rel_err"], color=st["color"], lw=st["lw"], zorder=st["z"])
            _points(ax, v, "n", "rel_err", st, name)
        ax.axhline(1.0, color="#999999", lw=0.8, ls="--", label="error of answering zeros")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain(ax)
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, 0.5), max(hi, 2.0))  # the zeros line always in view
        log_ticks(ax)
        ax.set_xticks(sorted(g["n"].unique()))
        ax.set_xlabel("sequence length n (tokens)", fontsize=9)
        ax.set_ylabel("relative error ||out - ref|| / ||ref||", fontsize=9)
        ax.set_title("\n".join(textwrap.wrap(label, 55)[:2]), fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
    fig.suptitle("Approximate variants: output error against the float64 softmax reference", fontsize=11)
    return finish(fig, axes, out)


def pareto_chart(df: pd.DataFrame, out: Path, style: dict) -> list[Path]:
    """Median time against relative error at each n, every variant of the facet (exact ones
    at the left edge), with the Pareto front: no point on it is beaten on both.  At most
    PARETO_PANELS panels: each facet's largest n first, then the next largest, and so on."""
    ok = df[(df["status"] == "ok") & df["rel_err"].notna() & df["median_ms"].notna()]
    if _approximate_rows(ok).empty:
        return []
    per_facet = []  # each facet's panels, largest n first
    for label, g in facet_groups(ok):
        if _approximate_rows(g).empty:
            continue
        ns = [(n, gn) for n, gn in g.groupby("n", sort=True) if gn["variant"].nunique() >= 2]
        per_facet.append([(f"n = {n}" + ("" if label == "all cells" else f"; {label}"), gn)
                          for n, gn in reversed(ns)])
    # at most PARETO_PANELS: every facet's largest n first, then each one's next largest, and so on
    ranked = sorted((rank, i) for i, f in enumerate(per_facet) for rank in range(len(f)))[:PARETO_PANELS]
    panels = [f[rank] for i, f in enumerate(per_facet) for rank in reversed(range(len(f))) if (rank, i) in ranked]
    if not panels:
        return []
    fig, axes = _grid(len(panels))
    for ax, (title, g) in zip(axes, panels):
        g = g.assign(err=g["rel_err"].clip(lower=EXACT_FLOOR).astype(float))
        # the exact variants side by side in their strip (their errors, 1e-7 against 3e-7, say nothing
        # between them and would draw them on top of one another).  Exact is what the variant declares,
        # not an error below the break: in bf16 an exact kernel's error (about 4e-3) is above it
        in_strip = ~g.index.isin(_approximate_rows(g).index) | (g["err"] < EXACT_BREAK)
        exact = sorted(g.loc[in_strip, "variant"].unique())
        if exact:
            spots = dict(zip(exact, np.geomspace(3 * EXACT_FLOOR, EXACT_BREAK / 3, len(exact))))
            g.loc[in_strip, "err"] = g.loc[in_strip, "variant"].map(spots).astype(float)
        for name, v in g.groupby("variant", sort=True):
            _points(ax, v, "err", "median_ms", _style(style, name), name)
        front = g.sort_values(["err", "median_ms"])
        front = front[front["median_ms"] <= front["median_ms"].cummin()]
        ax.step(front["err"], front["median_ms"], where="post", color="#444444", lw=1.0, ls=":", zorder=1,
                label="Pareto front")
        _broken_error_axis(ax, g["err"])
        ax.axvline(1.0, color="#b22222", lw=0.9, ls="--", zorder=1, label="error of answering zeros")
        ax.set_yscale("log")
        log_ticks(ax)  # 1-2-5: a panel whose times span less than a decade still has several labels
        ax.set_xlabel("relative error\n(exact variants side by side in the shaded strip)", fontsize=9)
        ax.set_ylabel("median time per call (ms)", fontsize=9)
        ax.set_title("\n".join(textwrap.wrap(title, 55)[:2]), fontsize=9)
        ax.grid(True, which="major", alpha=0.25)
    fig.suptitle("Speed against error: faster is lower, more exact is further left", fontsize=11)
    return finish(fig, axes, out)


EXACT_BREAK = 1e-3  # below this a variant counts as exact: its errors share a narrow strip of the axis
STRIP = 0.15  # how much of a decade one decade below the break takes


def _broken_error_axis(ax, errs) -> None:
    """An error axis broken at EXACT_BREAK: the exact variants' errors (1e-8 to 1e-3) squeezed
    into a strip at the left, the approximations' on a plain log axis to the right of the break
    (a double slash marks it), so that the exact variants do not take most of the width."""
    b = math.log10(EXACT_BREAK)

    def fwd(x):
        lx = np.log10(np.clip(x, EXACT_FLOOR, None))
        return np.where(lx < b, b + (lx - b) * STRIP, lx)

    def inv(y):
        return 10 ** np.where(y < b, b + (y - b) / STRIP, y)

    ax.set_xscale("function", functions=(fwd, inv))
    hi = max(10.0, float(np.nanmax(errs)) * 2)
    ax.set_xlim(EXACT_FLOOR / 2, hi)
    ticks = [1e-6, 1e-3] + [10.0 ** e for e in range(-2, math.ceil(math.log10(hi)) + 1)]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda val, _pos: f"{val:.0e}" if val < 0.01 else f"{val:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.tick_params(axis="x", labelsize=7)
    ax.axvspan(EXACT_FLOOR / 2, EXACT_BREAK, color="#f1f1f1", zorder=0)
    ax.text(EXACT_BREAK, 0.02, "//", transform=ax.get_xaxis_transform(), ha="center", fontsize=9, color="#555555")


def _n_size(ns: pd.Series, lo: float, hi: float):
    """A marker's area from its n, on a log scale from 12 (the shortest) to 110 (the longest)."""
    span = max(math.log2(hi / lo), 1e-9) if hi > lo else 1.0
    return (12 + 98 * np.log2(ns.astype(float) / lo) / span).clip(12, 110)


def roofline_chart(df: pd.DataFrame, out: Path, style: dict, envs: list[dict]) -> list[Path]:
    """Achieved TFLOP/s against arithmetic intensity (FLOPs per minimum byte moved), under
    the measured ceilings: the copy bandwidth (the slope) and the matmul peak (the roof)."""
    ok = df[(df["status"] == "ok") & df["tflops"].notna() & df["intensity"].notna() & (df["tflops"] > 0)]
    ok = ok.drop(_approximate_rows(ok).index)  # their FLOPs are exact attention's, not the work they do
    bandwidth = {e["run"]: e.get("peak_gbps") for e in envs}
    peaks = {e["run"]: e.get("peaks_tflops") or {} for e in envs}
    panels = [((run, dtype), g) for (run, dtype), g in ok.groupby(["run", "dtype"], sort=True)
              if bandwidth.get(run) and peaks.get(run, {}).get(dtype)]
    if not panels:
        return []
    fig, axes = _grid(len(panels))
    for ax, ((run, dtype), g) in zip(axes, panels):
        bw, peak = bandwidth[run], peaks[run][dtype]
        lo = min(g["intensity"].min(), 0.1) / 2
        hi = max(g["intensity"].max(), 1e3 * peak / bw) * 2
        x = np.geomspace(lo, hi, 200)
        ax.plot(x, np.minimum(peak, x * bw / 1e3), color="#333333", lw=1.6, zorder=2)
        ridge = 1e3 * peak / bw
        ax.annotate(f"matmul peak {peak:.3g} TFLOP/s", (hi, peak), fontsize=7, ha="right", va="bottom")
        ax.annotate(f"copy bandwidth {bw:.3g} GB/s", (lo * 1.5, lo * 1.5 * bw / 1e3), fontsize=7, rotation=0,
                    va="bottom")
        ax.axvline(ridge, color="#999999", lw=0.7, ls=":")
        n_lo, n_hi = float(g["n"].min()), float(g["n"].max())
        for name, v in g.groupby("variant", sort=True):  # n as the marker's size: small to large
            st = _style(style, name)
            ax.scatter(v["intensity"], v["tflops"], s=_n_size(v["n"], n_lo, n_hi), color=st["color"],
                       marker=st["marker"], alpha=0.85, edgecolors="white", linewidths=0.4, zorder=st["z"] + 0.1,
                       label=name)
        for n in sorted({n_lo, n_hi, float(2 ** round(math.log2(math.sqrt(n_lo * n_hi))))}):
            ax.scatter([], [], s=_n_size(pd.Series([n]), n_lo, n_hi), color="#999999", label=f"n = {int(n)}")
        decode = g[g["q_len"] <= 8]
        if not decode.empty:
            ax.scatter(decode["intensity"], decode["tflops"], s=110, facecolors="none", edgecolors="#d62728",
                       lw=0.9, zorder=1, label="decode (q_len <= 8)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain(ax)
        ax.set_xlabel("arithmetic intensity (FLOPs per byte moved:\nminimum traffic, or the variant's own model)",
                      fontsize=9)
        ax.set_ylabel("achieved TFLOP/s", fontsize=9)
        ax.set_title(f"{dtype}" + ("" if len({r for (r, _), _ in panels}) == 1 else f", run {run}")
                     + f"; left of the ridge ({ridge:.3g} FLOP/B) memory-bound", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
    fig.suptitle("Roofline: each ok cell under the measured ceilings (marker size: n)", fontsize=11)
    return finish(fig, axes, out)
