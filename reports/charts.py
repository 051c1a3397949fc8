"""Charts: one figure per metric, the facets as small multiples with shared axes, one
colour per variant across every chart, failed cells marked at their n with their status."""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from bench.model.row import Status
from reports.frames import constant_facets, facet_groups, ran_here, x_label
from reports.tables import failed_cells, with_metrics

MARKERS = "osD^v<>phX*"
FAIL_MARK = {s.value: "UNSUPP." if s is Status.UNSUPPORTED else s.word for s in Status if s is not Status.OK}


PALETTE = (list(matplotlib.colormaps["tab10"].colors) + list(matplotlib.colormaps["Dark2"].colors)
           + list(matplotlib.colormaps["tab20b"].colors)[::2])
# every built-in variant has its own slot of PALETTE, the same in every chart of every run (the
# baseline is drawn in near-black), chosen so that the variants drawn together on a CPU (the exact
# ones beside the approximations) differ in hue; a plugin's variant takes a slot from its name's CRC-32
BUILTIN_SLOTS = {"flex": 0, "chunked.online": 1, "nystrom": 2, "sdpa.cudnn": 3, "sdpa": 4, "sdpa.efficient": 5,
                 "sdpa.math": 6, "sdpa.flash": 7, "window.chunked": 8, "xformers": 9, "performer": 10, "naive": 17,
                 "linear.elu": 24}
PLUGIN_SLOTS = [i for i in range(len(PALETTE)) if i not in BUILTIN_SLOTS.values()]


def _slot(name: str) -> int:
    import zlib

    if name in BUILTIN_SLOTS:
        return BUILTIN_SLOTS[name]
    return PLUGIN_SLOTS[zlib.crc32(name.encode()) % len(PLUGIN_SLOTS)]


def variant_style(variants, baseline: str | None) -> dict:
    """A colour and marker per variant that depend on its name alone (the same in every chart
    of every run, whatever else is drawn beside it)."""
    names = sorted(set(variants))
    style = {}
    for i, name in enumerate(names):
        # earlier names are drawn wider and lower, so identical curves stay visible as an outline
        width = 1.4 + 1.6 * (len(names) - 1 - i) / max(1, len(names) - 1)
        if name == baseline:
            style[name] = {"color": "#222222", "marker": "o", "lw": width, "z": 3 + i / 100}
            continue
        k = _slot(name)
        style[name] = {"color": PALETTE[k % len(PALETTE)], "marker": MARKERS[k % len(MARKERS)], "lw": width,
                       "z": 3 + i / 100}
    return style


def _grid_cols(n_facets: int) -> int:
    return 2 if n_facets == 4 else min(3, n_facets)


def _subplots(n_facets: int):
    """One panel per facet.  The panels share their y range (``_share``) without matplotlib's
    shared axes, whose tick and title placement asks every sibling (quadratic in the panels)."""
    cols = _grid_cols(n_facets)
    rows = math.ceil(n_facets / cols)
    width = max(5.4 * cols, 10.0)
    fig, axes = new_figure(rows, cols, figsize=(width, 3.9 * rows + 1.4), squeeze=False, layout="constrained")
    for ax in axes.flat[n_facets:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n_facets])


def _share(axes, x: bool) -> None:
    """One y range for every panel (and one x range when ``x``), tick labels on the outer
    panels only: the left column's y, the lowest panel of each column's x."""
    cols = _grid_cols(len(axes))
    lims = [ax.get_ylim() for ax in axes if ax.has_data()] or [ax.get_ylim() for ax in axes]
    lo, hi = min(a for a, _ in lims), max(b for _, b in lims)
    for i, ax in enumerate(axes):
        ax.set_ylim(lo, hi)
        if i % cols:
            ax.tick_params(axis="y", which="both", labelleft=False)
    if x:
        lims = [ax.get_xlim() for ax in axes]
        lo, hi = min(a for a, _ in lims), max(b for _, b in lims)
        for i, ax in enumerate(axes):
            ax.set_xlim(lo, hi)
            if i + cols < len(axes):
                ax.tick_params(axis="x", which="both", labelbottom=False)


GUIDES = (("O(n) guide", 1, (0, (5, 3))), ("O(n²) guide", 2, (0, (1, 2))))  # label, power, dash pattern


def _guides(ax, ns, ys) -> None:
    """O(n) (dashed) and O(n^2) (dotted) lines through the median of the smallest n's values;
    named in the legend, not on the plot, where a label would sit on the data."""
    ns = np.array(sorted(set(ns)), dtype=float)
    if len(ns) < 2 or not len(ys):
        return
    n0, y0 = ns[0], float(np.median(ys))
    for _, k, dash in GUIDES:
        ax.plot(ns, y0 * (ns / n0) ** k, ls=dash, lw=0.9, color="#9a9a9a", zorder=1)


COINCIDE = 0.03  # two variants whose values agree within 3 % at every n they share are drawn apart


def coinciding(ok: pd.DataFrame, metric: str) -> list[tuple[str, str]]:
    """Pairs of variants (a, b) whose ``metric`` agrees within COINCIDE at every n both have
    (two n at least): b would hide under a."""
    wide = ok.pivot_table(index="n", columns="variant", values=metric, aggfunc="first")
    names, pairs = list(wide.columns), []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            both = wide[[a, b]].dropna()
            if len(both) >= 2 and ((both[b] / both[a] - 1).abs() <= COINCIDE).all():
                pairs.append((a, b))
    return pairs


def _failed_marks(ax, fails: pd.DataFrame, style) -> None:
    """An X in the variant's colour at the top of the plot, at the n where it failed or stopped
    (unsupported there), with the status."""
    trans = ax.get_xaxis_transform()  # x in data, y in axes fraction
    for k, (name, g) in enumerate(fails.groupby("variant", sort=True)):
        y = 0.95 - 0.07 * k
        for _, r in g.iterrows():
            ax.plot(r["n"], y, transform=trans, marker="X", ms=8, color=style[name]["color"],
                    ls="none", clip_on=False, zorder=5)
            ax.annotate(FAIL_MARK.get(r["status"], r["status"]), (r["n"], y), xycoords=trans,
                        xytext=(6, 0), textcoords="offset points", fontsize=7, va="center",
                        color=style[name]["color"])


def not_drawn(df: pd.DataFrame) -> str:
    """The variants of a chart with no cell that ran (every one unsupported), with the first
    reason of each, shortened: said under the chart, so that no variant vanishes unexplained."""
    out = []
    for name, g in df.groupby("variant", sort=True):
        if (g["status"] == "unsupported").all():
            reason = str(g["reason"].dropna().iloc[0]) if g["reason"].notna().any() else "no reason"
            out.append(f"{name} ({textwrap.shorten(reason, 48, placeholder='...')})")
    if not out:
        return ""
    return "\n".join(textwrap.wrap("not drawn, unsupported in every cell: " + "; ".join(out), 190))


def new_figure(rows: int = 1, cols: int = 1, *, figsize, layout: str = "constrained", **subplots):
    """A figure with its axes, drawn by matplotlib's object API: no pyplot, so no global
    figure state and no backend to choose (a Figure renders with Agg when it is saved)."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(rows, cols, **subplots)


def figure_legend(fig, axes) -> None:
    """One legend for the figure, below the panels: no legend box covers a point."""
    seen: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        # as many columns as the figure's width holds at 8 pt (about 0.065 in a character, 0.55 in for the
        # marker and the gap): a narrow one-panel figure wraps its legend instead of cutting it at the edge
        per_column = 0.55 + 0.065 * max(len(label) for label in seen)
        ncol = max(1, min(6, len(seen), int(fig.get_figwidth() / per_column)))
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncol=ncol, fontsize=8,
                   frameon=False)


SVG_ENV = "ATTNBENCH_REPORT_SVG"  # "1": every chart as SVG too (report --svg); read by the drawing processes


def save_figure(fig, out: Path) -> list[Path]:
    """The figure as PNG beside ``out`` (the page embeds it), and as SVG too when asked
    (``report --svg``): each format costs a full render, so the page's one is the default."""
    paths = [out.with_suffix(".png")] + ([out.with_suffix(".svg")] if os.environ.get(SVG_ENV) == "1" else [])
    for p in paths:
        fig.savefig(p, dpi=130)
        fig.set_layout_engine("none")  # the layout is done: a second format reuses it
    return paths


def _subtitle(df: pd.DataFrame) -> str:
    const = constant_facets(df)
    items = [f"{k}={v}" for k, v in const.items() if not (k == "window" and v == "-")]
    half = (len(items) + 1) // 2
    return ", ".join(items) if len(items) <= 6 else ", ".join(items[:half]) + "\n" + ", ".join(items[half:])


def minor_label(y, _pos) -> str:
    """Label the 2x and 5x minor ticks of a log axis, so short ranges still read."""
    lead = y / 10 ** math.floor(math.log10(y)) if y > 0 else 0
    return f"{y:g}" if round(lead) in (2, 5) and abs(lead - round(lead)) < 1e-6 else ""


UNTIMED = ("mem_mib",)  # metrics not from the timed samples: drawn filled whatever the timing flags


def _x_axis(ax, ns) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(n) for n in ns))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [str(t) for t in ticks], rotation=0 if len(ticks) < 8 else 45)


def chart(df: pd.DataFrame, metric: str, ylabel: str, title: str, style: dict, baseline: str | None,
          out: Path, peaks: dict | None = None, guides: bool = False, band: tuple[str, str] | None = None,
          logy: bool = True, hline: float | None = None, band_label: str = "IQR band") -> list[Path]:
    groups = [(label, with_metrics(ran_here(g), baseline)) for label, g in facet_groups(df)]
    groups = [(label, g) for label, g in groups if not g.empty]
    measured = [g[(g["status"] == "ok") & g[metric].notna() & ((g[metric] > 0) if logy else True)] for _, g in groups]
    if not any(len(m) for m in measured):
        return []  # nothing measured to draw: the failures are listed in the tables
    same_x = len({tuple(sorted(g["n"].unique())) for _, g in groups}) == 1  # else each panel its own n axis
    fig, axes = _subplots(len(groups))
    all_fails = failed_cells(df)
    shown, together, peak_labels = set(), set(), set()
    any_fail = any_shaky = False
    for ax, (label, g) in zip(axes, groups):
        ok = g[(g["status"] == "ok") & g[metric].notna() & (g[metric] > 0 if logy else True)]
        keep = [c for c in ("n", metric, "shaky", *(band or ())) if c in ok]  # grouping a wide frame is slow
        pairs = coinciding(ok, metric)
        beside = {b for _, b in pairs}  # drawn a step to the right of the one it would hide under
        together.update(f"{b} = {a}" for a, b in pairs)
        for name, v in ok.groupby("variant", sort=True):
            # a failed n in between breaks the line instead of being bridged
            ns = sorted(g.loc[g["variant"] == name, "n"].unique())
            v = v[keep].groupby("n").first().reindex(ns).reset_index()
            if name in beside:
                v["n"] = v["n"] * 1.03
            st = style[name]
            ax.plot(v["n"], v[metric], color=st["color"], lw=st["lw"], label=name, zorder=st["z"])
            shaky = v["shaky"].fillna(False).astype(bool) if "shaky" in v else pd.Series(False, index=v.index)
            if metric in UNTIMED:  # counted in a pass of its own: contention does not change it
                shaky = pd.Series(False, index=v.index)
            for hollow, pts in ((False, v[~shaky]), (True, v[shaky])):
                if len(pts):
                    ax.plot(pts["n"], pts[metric], ls="none", marker=st["marker"], ms=5 if hollow else 4.5,
                            color=st["color"], markerfacecolor="white" if hollow else st["color"],
                            markeredgewidth=1.3 if hollow else 1.0, zorder=st["z"] + 0.5)
            any_shaky = any_shaky or bool(shaky.any())
            shown.add(name)
            if band and set(band) <= set(v):
                ax.fill_between(v["n"], v[band[0]], v[band[1]], color=st["color"], alpha=0.18, lw=0,
                                zorder=2)
        if guides and not ok.empty:
            first = ok[ok["n"] == ok["n"].min()][metric]
            _guides(ax, g["n"], first)
        if hline is not None:
            ax.axhline(hline, color="#444444", lw=1, ls=":", zorder=1)
        if peaks:
            dtype = g["dtype"].iloc[0]
            if peaks.get(dtype) and g["dtype"].nunique() == 1:
                ax.axhline(peaks[dtype], color="#b22222", lw=1.2, ls="-.", zorder=1)
                peak_labels.add(f"measured {dtype} matmul peak {peaks[dtype]:.3g} TFLOP/s")
        # failed cells, and where a drawn variant stops: its unsupported cells (a length it refuses)
        stopped = (g["status"] == "unsupported") & g["variant"].isin(ok["variant"].unique())
        fails = g[(g["status"] != "ok") & (g.index.isin(all_fails.index) | stopped)]
        _failed_marks(ax, fails, style)
        shown.update(fails["variant"])
        any_fail = any_fail or not fails.empty
        _x_axis(ax, g["n"])
        if logy:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(minor_label))
        ax.set_title("" if label == "all cells" else "\n".join(textwrap.wrap(label, 60)), fontsize=10)
        ax.grid(True, which="major", color="#e6e6e6", lw=0.7)
        ax.set_axisbelow(True)
    _share(axes, x=same_x)
    cols = _grid_cols(len(axes))
    for i, ax in enumerate(axes):
        if i + cols >= len(axes) or not same_x:  # lowest plot of its column, or every plot of its own axis
            ax.set_xlabel(x_label(df), fontsize=9)
            ax.tick_params(labelbottom=True)
        if i % cols == 0:
            ax.set_ylabel(ylabel, fontsize=9)
    handles = [Line2D([], [], color=style[n]["color"], marker=style[n]["marker"], lw=1.6, label=n)
               for n in sorted(shown)]
    extra = []
    if guides:
        extra += [Line2D([], [], color="#9a9a9a", ls=dash, lw=0.9, label=name) for name, _, dash in GUIDES]
    extra += [Line2D([], [], color="#b22222", ls="-.", lw=1.2, label=text) for text in sorted(peak_labels)]
    if band:
        extra.append(Rectangle((0, 0), 1, 1, color="#888888", alpha=0.25, label=band_label))
    if any_shaky:
        extra.append(Line2D([], [], color="#555555", marker="o", markerfacecolor="white", ls="none",
                            label="hollow: shaky (few samples, noisy, contended)"))
    if any_fail:
        extra.append(Line2D([], [], color="#555555", marker="X", ls="none", label="failed or stopped (status)"))
    fig.suptitle(f"{title}\n{_subtitle(df)}", fontsize=12)
    notes = [n for n in (not_drawn(df), ("drawn 3 % to the right, equal within 3 % to the one named: "
                                         + ", ".join(sorted(together))) if together else "") if n]
    if notes:
        fig.supxlabel("\n".join(notes), fontsize=8, color="#555555")
    fig.legend(handles=handles + extra, loc="outside right center", ncol=1, fontsize=8, frameon=False)
    return save_figure(fig, out)


def all_charts(df: pd.DataFrame, folder: Path, baseline: str | None, peaks: dict,
               extra=(), bandwidth: float | None = None) -> dict[str, list[Path]]:
    """Every chart, drawn in parallel: the metric charts and the breakdown, then ``extra``
    jobs ``(name, function, first argument, keyword arguments)``; {name: paths} of those drawn."""
    style = variant_style(df["variant"], baseline)
    folder.mkdir(parents=True, exist_ok=True)
    specs = {
        "time": dict(metric="time_ms", ylabel="median time per call (ms)",
                     title="Time vs sequence length (log-log; band = IQR)", guides=True, band=("q1_ms", "q3_ms")),
        "memory": dict(metric="mem_mib", ylabel="peak memory above inputs (MiB)",
                       title="Peak memory vs sequence length (log-log)", guides=True),
        "speedup": dict(metric="speedup", ylabel=f"speedup vs {baseline} (x, higher is faster)",
                        title=f"Speedup against the baseline ({baseline}), paired per interleaved round",
                        hline=1.0, band=("speedup_lo", "speedup_hi"), band_label="spread over the rounds"),
        "tflops": dict(metric="tflops", ylabel="achieved TFLOP/s",
                       title="Achieved TFLOP/s (exact FLOPs of the kept pairs) vs the measured peak",
                       peaks=peaks),
    }
    if "decode" in df and df["decode"].astype(bool).any():  # decode is memory-bound: its bandwidth, drawn
        specs["bandwidth"] = dict(metric="gbps", ylabel="achieved GB/s (minimum bytes moved)",
                                  title="Bandwidth vs KV cache length (decode reads the whole cache per token"
                                        + (f"; dotted: measured copy bandwidth {bandwidth:.3g} GB/s)" if bandwidth
                                           else ")"), hline=bandwidth)
    df = df.drop(columns=["samples_ms"], errors="ignore")
    jobs = [(name, chart, df, dict(style=style, baseline=baseline, out=folder / name, **spec))
            for name, spec in specs.items()]
    jobs.append(("breakdown", breakdown_chart, df, dict(out=folder / "breakdown")))
    jobs += list(extra)
    results = _draw_all(jobs)
    return {name: paths for (name, _, _, _), paths in zip(jobs, results) if paths}


def _draw(job) -> list[Path]:
    _name, func, arg, kw = job
    return func(arg, **kw)


def _draw_all(jobs) -> list[list[Path]]:
    """Each chart is independent: draw them on every core (the sweep is over by now), this
    process and one more per further core; in order, in this process, where a pool cannot start."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from bench.measure.contention import usable_cpus

    workers = min(len(jobs) - 1, len(usable_cpus()) - 1)  # this process draws too
    if workers >= 1:
        try:
            with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
                futures = [pool.submit(_draw, job) for job in jobs]
                results = {}
                # while the pool starts (imports) and takes jobs from the front, draw from the back
                # every job it has not started yet
                for i in reversed(range(len(jobs))):
                    if futures[i].cancel():
                        results[i] = _draw(jobs[i])
                return [results[i] if i in results else futures[i].result() for i in range(len(jobs))]
        except (OSError, BrokenProcessPool):
            pass
    return [_draw(job) for job in jobs]


CATEGORY_COLORS = {"matmul": "#4c72b0", "softmax": "#dd8452", "mask_elementwise": "#55a868",
                   "copy": "#c44e52", "fused_attention": "#8172b3", "other": "#9c9c9c"}


def breakdown_chart(df: pd.DataFrame, out: Path) -> list[Path]:
    """Stacked share of profiled self time by category against n, one panel per variant
    (and facet), from the columns that ``sweep --profile`` adds."""
    cols = [f"share_{c}" for c in CATEGORY_COLORS if f"share_{c}" in df]
    if not cols:
        return []
    panels = []
    for label, g in facet_groups(df):
        ok = g[(g["status"] == "ok") & g[cols].notna().all(axis=1)]
        for name, v in ok.groupby("variant", sort=True):
            panels.append((name if label == "all cells" else f"{name}\n{label}", v.sort_values("n")))
    if not panels:
        return []
    fig, axes = _subplots(len(panels))
    for ax, (title, v) in zip(axes, panels):
        x = np.arange(len(v))
        bottom = np.zeros(len(v))
        for c in cols:
            vals = v[c].fillna(0).to_numpy(dtype=float)
            ax.bar(x, vals, bottom=bottom, color=CATEGORY_COLORS[c.removeprefix("share_")], width=0.7)
            bottom += vals
        ax.set_xticks(x, [str(int(n)) for n in v["n"]])
        ax.set_ylim(0, 100)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("sequence length n (tokens)", fontsize=8)
    _share(axes, x=False)
    for i, ax in enumerate(axes):
        if i % _grid_cols(len(axes)) == 0:
            ax.set_ylabel("share of profiled self time (%)", fontsize=9)
    handles = [Rectangle((0, 0), 1, 1, color=CATEGORY_COLORS[c.removeprefix("share_")],
                             label=c.removeprefix("share_").replace("_", " / ", 1)
                             if c == "share_mask_elementwise" else c.removeprefix("share_").replace("_", " "))
               for c in cols]
    fig.suptitle("Where the time goes: torch.profiler self time by category (separate profiled pass)",
                 fontsize=12)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)
    return save_figure(fig, out)


def _duration(ms: float) -> str:
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:,.3g} h" if ms < 3.6e8 else f"{ms / 3_600_000:,.0f} h"
    if ms >= 60_000:
        return f"{ms / 60_000:.3g} min"
    return f"{ms / 1000:.3g} s" if ms >= 1000 else f"{ms:.3g} ms"


def frontier_chart(df: pd.DataFrame, out: Path, title: str, predicted: bool = False) -> Path | None:
    """The memory frontier: the largest size each variant fits in the budget as a bar, its
    median time at that size written on it (``frontier.csv``'s columns: variant, largest,
    median_ms_at_largest).  ``predicted``: the bars come from the memory model, not from cells,
    and are drawn hatched."""
    rows = df[df["largest"].notna()].sort_values("largest")
    if rows.empty:
        return None
    fig, ax = new_figure(figsize=(7.5, 0.5 + 0.45 * len(rows)))
    style = variant_style(rows["variant"], None)
    y = np.arange(len(rows))
    ax.barh(y, rows["largest"].astype(float), color=[style[v]["color"] for v in rows["variant"]],
            hatch="//" if predicted else None, alpha=0.6 if predicted else 0.9)
    for i, (size, ms) in enumerate(zip(rows["largest"], rows["median_ms_at_largest"])):
        time_ = "" if ms is None or pd.isna(ms) else f"  ({_duration(ms)}{' predicted' if predicted else ''})"
        note = f" {int(size):,}{time_}"
        ax.text(float(size), i, note, va="center", fontsize=8)
    untrusted = rows["trusted"].eq(False) if "trusted" in rows else pd.Series(False, index=rows.index)
    ax.set_yticks(y, [f"{v}\n(untrusted model)" if u else v for v, u in zip(rows["variant"], untrusted)], fontsize=8)
    top, bottom = float(rows["largest"].max()), float(rows["largest"].min())
    if top > 20 * bottom:  # sizes an order of magnitude apart: each bar readable on a log axis
        ax.set_xscale("log")  # room on the right for the longest label: about a decade and a half
        ax.set_xlim(max(1.0, bottom / 4), top * 60)
    else:
        ax.set_xlim(0, top * 1.9)
    ax.set_xlabel(("predicted " if predicted else "") + "largest size within the budget", fontsize=9)
    ax.set_title(title, fontsize=10)
    return save_figure(fig, out)[0]
