"""Charts: one figure per metric, the facets as small multiples with shared axes, one
colour per variant across every chart, failed cells marked at their n with their status."""

from __future__ import annotations

import contextlib
import math
import os
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

from bench.model.row import Status
from bench.runs.judge import SAME_WITHIN
from reports.frames import constant_facets, facet_groups, ran_here, x_label
from reports.tables import UNTIMED, failed_cells, with_metrics

MARKERS = "osD^v<>phX*"
FAIL_MARK = {s.value: "UNSUPP." if s is Status.UNSUPPORTED else s.word for s in Status if s is not Status.OK}


# colours told apart at a glance (no two oranges, no two greys): the built-in variants take the first
# slots, the same in every chart of every run; plugins share the rest
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#1b9e77", "#222222", "#393b79", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#637939",
           "#a50026", "#7b4173", "#5254a3", "#9c9ede", "#d6616b", "#6b6ecf")
# a variant that declares a slot of PALETTE (``variant(..., colour=N)``; the run folder's env.json keeps it)
# has it in every chart of every run (the built-ins' slots are chosen so that the variants drawn together on a
# CPU differ in hue; the default baseline is near-black); any other takes a slot no variant of the report
# declares, from its name's CRC-32, the next free one where another variant of the same report took it


def declared_colours(envs) -> dict:
    """{variant: palette slot} as the run folders' env.json recorded them (the newest folder's last)."""
    out: dict = {}
    for env in envs or ():
        out.update({n: int(s) for n, s in (env.get("colours") or {}).items() if 0 <= int(s) < len(PALETTE)})
    return out


def _slots(names, declared: dict) -> dict:
    """{name: slot}: a declared one's own; another's from its name's CRC-32 among the slots not declared,
    moved on to the next free one when another variant of ``names`` holds it (distinct while there are slots)."""
    import zlib

    out = {n: declared[n] for n in names if n in declared}
    free = [i for i in range(len(PALETTE)) if i not in set(declared.values())] or list(range(len(PALETTE)))
    taken: set = set()
    for n in sorted(n for n in names if n not in declared):
        k = zlib.crc32(n.encode()) % len(free)
        for step in range(len(free)):
            if free[(k + step) % len(free)] not in taken:
                k = (k + step) % len(free)
                break
        taken.add(free[k])
        out[n] = free[k]
    return out


def variant_style(variants, baseline: str | None, declared: dict | None = None) -> dict:
    """A colour and marker per variant: one that declares a palette slot (``declared``: {name: slot}) has
    it whatever else is drawn beside it; the others' are distinct among the variants given.  The baseline
    keeps its colour and is drawn as a circle."""
    names = sorted(set(variants))
    slots = _slots(names, declared or {})
    style = {}
    for i, name in enumerate(names):
        # earlier names are drawn wider and lower, so identical curves stay visible as an outline
        width = 1.4 + 1.6 * (len(names) - 1 - i) / max(1, len(names) - 1)
        k = slots[name]
        style[name] = {"color": PALETTE[k], "marker": "o" if name == baseline else MARKERS[k % len(MARKERS)],
                       "lw": width, "z": 3 + i / 100}
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


COINCIDE = SAME_WITHIN  # two variants whose values agree this closely at every n they share are drawn apart


def _series_by_variant(ok: pd.DataFrame, metric: str) -> dict:
    """{variant: {n: value}} of a panel's drawable rows (a cell's first row)."""
    out: dict = {}
    for name, n, y in zip(ok["variant"], ok["n"], ok[metric]):
        out.setdefault(name, {}).setdefault(n, y)
    return out


def _coinciding(series: dict) -> list[tuple[str, str]]:
    """Pairs of variants (a, b) whose values agree within COINCIDE at every n both have (two n at
    least): b would hide under a."""
    names, pairs = sorted(series), []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = set(series[a]) & set(series[b])
            if len(common) >= 2 and all(abs(series[b][n] / series[a][n] - 1) <= COINCIDE for n in common):
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


def new_figure(rows: int = 1, cols: int = 1, *, figsize, layout: str = "constrained", **subplots):
    """A figure with its axes, drawn by matplotlib's object API: no pyplot, so no global
    figure state and no backend to choose (a Figure renders with Agg when it is saved)."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(rows, cols, **subplots)


def legend_entries(axes) -> dict:
    """{label: handle} of every labelled artist of the panels, each label once."""
    seen: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    return seen


def figure_legend(fig, axes) -> None:
    """One legend for the figure, below the panels: no legend box covers a point."""
    seen = legend_entries(axes)
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
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out.with_suffix(".png")] + ([out.with_suffix(".svg")] if os.environ.get(SVG_ENV) == "1" else [])
    _png(fig, paths[0])
    fig.set_layout_engine("none")  # the layout is done: the SVG reuses it
    for p in paths[1:]:
        fig.savefig(p, dpi=DPI)
    return paths


def _png(fig, path: Path) -> None:
    """Render with Agg and write the pixels as a 256-colour PNG: a chart holds a few dozen
    colours and their antialiased edges, which a palette keeps, at a quarter of the bytes of
    true colour (the page embeds every chart, so its size follows)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    fig.set_dpi(DPI)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    width, height = canvas.get_width_height()
    rgba = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    rgba.convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(path)


def _subtitle(df: pd.DataFrame) -> str:
    const = constant_facets(df)
    items = [f"{k}={v}" for k, v in const.items() if not (k == "window" and v == "-")]
    half = (len(items) + 1) // 2
    return ", ".join(items) if len(items) <= 6 else ", ".join(items[:half]) + "\n" + ", ".join(items[half:])


def minor_label(y, _pos) -> str:
    """Label the 2x and 5x minor ticks of a log axis, so short ranges still read."""
    lead = y / 10 ** math.floor(math.log10(y)) if y > 0 else 0
    return f"{y:g}" if round(lead) in (2, 5) and abs(lead - round(lead)) < 1e-6 else ""


ROTATE_AT = 8  # lengths on one axis from which their labels are turned 45 degrees


def _x_axis(ax, ns) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(n) for n in ns))
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:.0f}"))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    if len(ticks) >= ROTATE_AT:
        ax.tick_params(axis="x", labelrotation=45)


PANEL = (4.6, 3.1)  # inches of one panel: 3 across and the legend fit a 1400 px page at DPI
DPI = 100
GAP = (0.3, 0.85)  # between panels: across (the left column alone has y labels), down (title, x ticks)


class Layout:
    """A fixed grid of panels, placed by arithmetic rather than by a layout engine (which
    measures every text of every panel, twice per save): margins from the title's and notes'
    lines and the legend's longest label."""

    def __init__(self, panels: int, title_lines: int, note_lines: int, legend_chars: int, own_x: bool,
                 rotated: bool = False):
        self.cols = _grid_cols(panels)
        self.rows = math.ceil(panels / self.cols)
        w, h = PANEL
        self.left, self.gap_x = 0.85, GAP[0] + (0.45 if own_x else 0.0)
        turn = 0.35 if rotated else 0.0  # x tick labels at 45 degrees take more height
        self.gap_y = GAP[1] + (0.35 + turn if own_x else 0.0)
        self.legend = min(4.0, 0.75 + 0.076 * legend_chars)  # at 10 pt
        self.top = 0.3 + 0.26 * title_lines
        self.bottom = 0.75 + turn + 0.17 * note_lines
        self.width = self.left + self.cols * w + (self.cols - 1) * self.gap_x + 0.2 + self.legend
        self.height = self.top + self.rows * h + (self.rows - 1) * self.gap_y + self.bottom

    def figure(self, panels: int):
        fig = Figure(figsize=(self.width, self.height))
        w, h = PANEL
        axes = []
        for i in range(panels):
            r, c = divmod(i, self.cols)
            x = self.left + c * (w + self.gap_x)
            y = self.height - self.top - (r + 1) * h - r * self.gap_y
            axes.append(fig.add_axes((x / self.width, y / self.height, w / self.width, h / self.height)))
        return fig, axes

    def legend_anchor(self) -> tuple[float, float]:
        return 1 - (self.legend + 0.05) / self.width, 0.5


def place_grid(fig, axes, cols: int, panel: tuple[float, float]) -> None:
    """Lay out a figure of panels that each carry their own axis labels, with one legend to the
    right of them (every label the panels hold, once): the figure sized and each panel placed
    by arithmetic, as Layout does for the metric charts, rather than by a layout engine."""
    seen = legend_entries(axes)
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    rows = math.ceil(len(axes) / cols)
    w, h = panel
    left, gap_x, gap_y = 0.95, 0.95, 1.05
    legend = min(3.6, 0.7 + 0.068 * max((len(x) for x in seen), default=0)) if seen else 0.0
    top, bottom = 0.3 + 0.24 * (title.count("\n") + 1 if title else 0), 0.7
    width = left + cols * w + (cols - 1) * gap_x + 0.3 + legend
    height = top + rows * h + (rows - 1) * gap_y + bottom
    fig.set_layout_engine("none")
    fig.set_size_inches(width, height)
    for i, ax in enumerate(axes):
        r, c = divmod(i, cols)
        x, y = left + c * (w + gap_x), height - top - (r + 1) * h - r * gap_y
        ax.set_position((x / width, y / height, w / width, h / height))
    if title:
        fig._suptitle.set_y(1 - 0.12 / height)
        fig._suptitle.set_va("top")
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="center left",
                   bbox_to_anchor=(1 - (legend + 0.05) / width, 0.5), fontsize=9, frameon=False)


def log_tick_values(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks over [lo, hi], every one labelled: finer steps over less than a decade (no panel
    reads from one tick), the powers of ten alone over many decades, and at most ten."""
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    ticks = [m * 10.0 ** e for e in decades for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
    if len(ticks) < 3:  # a range short of a decade: finer steps
        ticks = [m * 10.0 ** e for e in decades for m in (1, 1.5, 2, 3, 5, 7) if lo <= m * 10.0 ** e <= hi]
    if len(ticks) > 10:
        ticks = [t for t in ticks if f"{t:g}".lstrip("0.").startswith("1")]
    if len(ticks) > 10:
        step = math.ceil(len(ticks) / 8)
        ticks = ticks[::step]
    return ticks


def _y_range(values, logy: bool) -> tuple[float, float]:
    v = np.asarray([x for x in values if np.isfinite(x) and (x > 0 or not logy)], dtype=float)
    if not len(v):
        return (0.1, 10.0) if logy else (0.0, 1.0)
    lo, hi = float(v.min()), float(v.max())
    if logy:
        span = max(math.log10(hi / lo), 0.3)  # a flat series still shows a range around it
        pad = 0.06 * span
        mid = (math.log10(lo) + math.log10(hi)) / 2
        half = max(math.log10(hi / lo) / 2, 0.15)
        return 10 ** (mid - half - pad), 10 ** (mid + half + pad)
    pad = 0.06 * (hi - lo or abs(hi) or 1.0)
    return lo - pad, hi + pad


def _panels(df: pd.DataFrame, metric: str, baseline: str | None, logy: bool, exact_only: bool):
    """(the frame of the variants that ran, its facets as (label, rows), and each facet's drawable
    ok rows): a variant with no ok cell is left out, as are approximations with ``exact_only``."""
    if exact_only and "approximate" in df:
        df = df[~df["approximate"].fillna(False).astype(bool)]
    ran = df.loc[df["status"] == "ok", "variant"].unique()
    df = df[df["variant"].isin(ran)]
    groups = [(label, with_metrics(ran_here(g), baseline)) for label, g in facet_groups(df)]
    groups = [(label, g) for label, g in groups if not g.empty]
    usable = [g[(g["status"] == "ok") & g[metric].notna() & ((g[metric] > 0) if logy else True)] for _, g in groups]
    return df, groups, usable


def _lines(ax, g: pd.DataFrame, ok: pd.DataFrame, metric: str, band, style: dict, beside: set) -> tuple[set, bool]:
    """A facet's line per variant, hollow marks on its shaky cells and its band; a failed n in
    between breaks the line instead of being bridged.  Returns (the variants drawn, any shaky)."""
    facet_ns: dict = {}
    for name, n in zip(g["variant"], g["n"]):
        facet_ns.setdefault(name, set()).add(n)
    cells: dict = {}  # variant -> n -> (value, shaky, band low, band high): a cell's first row
    flags = ok["shaky"] if "shaky" in ok and metric not in UNTIMED else pd.Series(False, index=ok.index)
    lows = ok[band[0]] if band else pd.Series(np.nan, index=ok.index)
    highs = ok[band[1]] if band else pd.Series(np.nan, index=ok.index)
    for name, n, y, sh, b0, b1 in zip(ok["variant"], ok["n"], ok[metric], flags, lows, highs):
        cells.setdefault(name, {}).setdefault(n, (y, bool(sh) if not pd.isna(sh) else False, b0, b1))
    any_shaky = False
    for name in sorted(cells):
        ns = sorted(facet_ns[name])
        pts = [cells[name].get(n, (np.nan, False, np.nan, np.nan)) for n in ns]
        x = np.asarray(ns, dtype=float) * (1.03 if name in beside else 1.0)
        y = np.array([p[0] for p in pts], dtype=float)
        st = style[name]
        ax.plot(x, y, color=st["color"], lw=st["lw"], marker=st["marker"], ms=4.5, zorder=st["z"])
        shaky = np.array([p[1] for p in pts], dtype=bool)
        if shaky.any():  # memory is counted in a pass of its own: never shaky (UNTIMED)
            ax.plot(x[shaky], y[shaky], ls="none", marker=st["marker"], ms=5, color=st["color"],
                    markerfacecolor="white", markeredgewidth=1.3, zorder=st["z"] + 0.5)
            any_shaky = True
        if band:
            ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], color=st["color"], alpha=0.18, lw=0,
                            zorder=2)
    return set(cells), any_shaky


def _axes_of(ax, i: int, layout: Layout, n_panels: int, ns, y_range: tuple[float, float], logy: bool,
             ylabel: str, xlabel: str, label: str, same_x: bool) -> None:
    """A panel's axes: the shared y range, y labels on the outer panels only, x labels on the
    lowest row where the panels share their lengths, its facet as its title."""
    lo, hi = y_range
    _x_axis(ax, ns)
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(log_tick_values(lo, hi)))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_ylim(lo, hi)
    ax.tick_params(labelsize=10)
    if i % layout.cols:
        ax.tick_params(axis="y", labelleft=False)
    else:
        ax.set_ylabel(ylabel, fontsize=11)
    lowest = i + layout.cols >= n_panels
    if same_x and not lowest:
        ax.tick_params(axis="x", labelbottom=False)
    else:
        ax.set_xlabel(xlabel, fontsize=10)
    ax.set_title("" if label == "all cells" else "\n".join(textwrap.wrap(label, 52)[:2]), fontsize=11)
    ax.grid(True, which="major", color="#e6e6e6", lw=0.7)
    ax.set_axisbelow(True)


def _legend_entries(style: dict, shown: set, guides: bool, peak_labels: set, band, band_label: str,
                    any_shaky: bool, any_fail: bool) -> list:
    """The legend: a line per variant drawn, then the guides, peaks, band and marks the panels use."""
    handles = [Line2D([], [], color=style[n]["color"], marker=style[n]["marker"], lw=1.6, label=n)
               for n in sorted(shown)]
    if guides:
        handles += [Line2D([], [], color="#9a9a9a", ls=dash, lw=0.9, label=name) for name, _, dash in GUIDES]
    handles += [Line2D([], [], color="#b22222", ls="-.", lw=1.2, label=text) for text in sorted(peak_labels)]
    if band:
        handles.append(Rectangle((0, 0), 1, 1, color="#888888", alpha=0.25, label=band_label))
    if any_shaky:
        handles.append(Line2D([], [], color="#555555", marker="o", markerfacecolor="white", ls="none",
                              label="hollow: shaky (few samples, noisy, contended)"))
    if any_fail:
        handles.append(Line2D([], [], color="#555555", marker="X", ls="none", label="failed or stopped (status)"))
    return handles


def chart(df: pd.DataFrame, metric: str, ylabel: str, title: str, style: dict, baseline: str | None,
          out: Path, peaks: dict | None = None, guides: bool = False, band: tuple[str, str] | None = None,
          logy: bool = True, hline: float | None = None, band_label: str = "IQR band",
          exact_only: bool = False) -> list[Path]:
    """One metric against n, a panel per facet of ``df`` (one report group), a line per variant.
    ``exact_only``: approximations left out (their speed-up and FLOP rate are not the same work's).
    A variant with no ok cell in ``df`` is not drawn: the page lists it once, with its reasons."""
    df, groups, usable = _panels(df, metric, baseline, logy, exact_only)
    if not any(len(m) for m in usable):
        return []  # nothing measured to draw: the failures are listed in the tables
    same_x = len({tuple(sorted(g["n"].unique())) for _, g in groups}) == 1  # else each panel its own n axis
    all_fails = failed_cells(df)
    # the y range every panel shares: the values, their bands, the reference lines
    values = [x for ok in usable for c in (metric, *(band or ())) if c in ok for x in ok[c].to_numpy(dtype=float)]
    values += [hline] if hline is not None else []
    dtypes = set(df["dtype"]) if "dtype" in df else set()
    peak_values = {d: peaks[d] for d in dtypes if peaks and peaks.get(d)} if len(dtypes) == 1 else {}
    values += list(peak_values.values())
    y_range = _y_range(values, logy)
    panel_pairs = [_coinciding(_series_by_variant(ok, metric)) for ok in usable]
    together = {f"{b} = {a}" for pairs in panel_pairs for a, b in pairs}
    note = ("drawn 3 % to the right, equal within 3 % to the one named: " + ", ".join(sorted(together))
            if together else "")
    note_lines = textwrap.wrap(note, 170)
    subtitle = _subtitle(df)
    legend_labels = sorted(set(df["variant"])) + ["hollow: shaky (few samples, noisy, contended)"]
    layout = Layout(len(groups), 1 + subtitle.count("\n") + 1, len(note_lines),
                    max(len(x) for x in legend_labels), own_x=not same_x,
                    rotated=any(g["n"].nunique() >= ROTATE_AT for _, g in groups))
    fig, axes = layout.figure(len(groups))
    shown, peak_labels = set(), set()
    any_fail = any_shaky = False
    xlabel = x_label(df)
    band = band if band and all(c in df for c in band) else None
    for i, (ax, (label, g), ok, pairs) in enumerate(zip(axes, groups, usable, panel_pairs)):
        drawn, shaky = _lines(ax, g, ok, metric, band, style, beside={b for _, b in pairs})
        shown |= drawn
        any_shaky = any_shaky or shaky
        if guides and not ok.empty:
            _guides(ax, g["n"], ok[ok["n"] == ok["n"].min()][metric])
        if hline is not None:
            ax.axhline(hline, color="#444444", lw=1, ls=":", zorder=1)
        for dtype, peak in peak_values.items():
            ax.axhline(peak, color="#b22222", lw=1.2, ls="-.", zorder=1)
            peak_labels.add(f"measured {dtype} matmul peak {peak:.3g} TFLOP/s")
        # failed cells, and where a drawn variant stops: its unsupported cells (a length it refuses)
        stopped = (g["status"] == "unsupported") & g["variant"].isin(ok["variant"].unique())
        fails = g[(g["status"] != "ok") & (g.index.isin(all_fails.index) | stopped)]
        _failed_marks(ax, fails, style)
        shown.update(fails["variant"])
        any_fail = any_fail or not fails.empty
        _axes_of(ax, i, layout, len(groups), g["n"], y_range, logy, ylabel, xlabel, label, same_x)
    if same_x:
        xs = [ax.get_xlim() for ax in axes]
        for ax in axes:
            ax.set_xlim(min(a for a, _ in xs), max(b for _, b in xs))
    fig.suptitle(f"{title}\n{subtitle}", fontsize=13, y=1 - 0.12 / layout.height, va="top")
    if note_lines:
        fig.text(0.5, 0.1 / layout.height, "\n".join(note_lines), ha="center", va="bottom", fontsize=8,
                 color="#555555")
    fig.legend(handles=_legend_entries(style, shown, guides, peak_labels, band, band_label, any_shaky, any_fail),
               loc="center left", bbox_to_anchor=layout.legend_anchor(), ncol=1, fontsize=10, frameon=False)
    return save_figure(fig, out)


def metric_specs(df: pd.DataFrame, baseline: str | None, peaks: dict, bandwidth: float | None) -> dict:
    """The metric charts of one group: name -> chart()'s keyword arguments."""
    specs = {
        "time": dict(metric="time_ms", ylabel="median time per call (ms)",
                     title="Time vs sequence length (log-log; band = IQR)", guides=True, band=("q1_ms", "q3_ms")),
        "memory": dict(metric="mem_mib", ylabel="peak memory above inputs (MiB)",
                       title="Peak memory vs sequence length (log-log)", guides=True),
        "speedup": dict(metric="speedup", ylabel=f"speedup vs {baseline} (x, higher is faster)",
                        title=f"Speedup of the exact variants against the baseline ({baseline}), paired per "
                              "interleaved round", hline=1.0, band=("speedup_lo", "speedup_hi"),
                        band_label="spread over the rounds", exact_only=True),
        "tflops": dict(metric="tflops", ylabel="achieved TFLOP/s",
                       title="Achieved TFLOP/s of the exact variants (exact FLOPs of the kept pairs) vs the "
                             "measured peak", peaks=peaks, exact_only=True),
    }
    if "decode" in df and df["decode"].astype(bool).any():  # decode is memory-bound: its bandwidth, drawn
        specs["bandwidth"] = dict(metric="gbps", ylabel="achieved GB/s (minimum bytes moved)",
                                  title="Bandwidth vs KV cache length (decode reads the whole cache per token"
                                        + (f"; dotted: measured copy bandwidth {bandwidth:.3g} GB/s)" if bandwidth
                                           else ")"), hline=bandwidth)
    return specs


def chart_jobs(df: pd.DataFrame, folder: Path, style: dict, baseline: str | None, peaks: dict,
               bandwidth: float | None = None) -> list:
    """The metric charts and the breakdown of one group as drawing jobs ``(name, function,
    first argument, keyword arguments)``, written under ``folder``."""
    jobs = [(name, chart, df, dict(style=style, baseline=baseline, out=folder / name, **spec))
            for name, spec in metric_specs(df, baseline, peaks, bandwidth).items()]
    jobs.append(("breakdown", breakdown_chart, df, dict(out=folder / "breakdown")))
    return jobs


def _draw(job) -> list[Path]:
    _name, func, arg, kw = job
    return func(arg, **kw)


CACHE = ".drawn.json"  # report/charts/.drawn.json: {chart path: the hash of what it was drawn from}


def _code_version() -> str:
    """A hash of the reports package's source: a change to any drawing code redraws every chart."""
    import hashlib

    h = hashlib.sha1()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()


def job_key(job, version: str) -> str:
    """What a chart is drawn from: its function, its frame and its settings (not where it goes)."""
    import hashlib
    import pickle

    _name, func, arg, kw = job
    settings = {k: v for k, v in kw.items() if k != "out"}
    blob = pickle.dumps((func.__module__, func.__qualname__, arg, sorted(settings.items(), key=str),
                         os.environ.get(SVG_ENV) == "1", version), protocol=5)
    return hashlib.sha1(blob).hexdigest()


def draw(jobs, folder: Path) -> list[list[Path]]:
    """Each job's chart files, drawn in parallel (``_draw_all``) but for those whose frame and
    settings have not changed since the last build of ``folder`` and whose files are still there."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    cache_path = folder / CACHE
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    version = _code_version()
    keys = [job_key(j, version) for j in jobs]
    results: dict[int, list[Path]] = {}
    todo = []
    for i, (job, key) in enumerate(zip(jobs, keys)):
        hit = cache.get(str(job[3].get("out")))
        if hit and hit.get("key") == key and all(Path(p).exists() for p in hit["paths"]):
            results[i] = [Path(p) for p in hit["paths"]]
        else:
            todo.append(i)
    for i, paths in zip(todo, _draw_all([jobs[i] for i in todo]) if todo else []):
        results[i] = paths
    fresh = {str(j[3].get("out")): {"key": k, "paths": [str(p) for p in results[i]]}
             for i, (j, k) in enumerate(zip(jobs, keys))}
    cache_path.write_text(json.dumps(fresh))
    return [results[i] for i in range(len(jobs))]


def _start_method() -> str:
    """fork where this process holds nothing a child could inherit broken (the report command:
    pandas and matplotlib, no torch), so a drawing process starts at once; spawn after a sweep in
    this process (torch's thread pools, a CUDA context), at the cost of a fresh import."""
    import multiprocessing as mp
    import sys

    return "fork" if "torch" not in sys.modules and "fork" in mp.get_all_start_methods() else "spawn"


_POOL = None  # the drawing processes of the report being built (drawing_pool)


def _ready() -> bool:
    return True


DRAW_PROCESSES_ENV = "ATTNBENCH_DRAW_PROCESSES"  # how many processes draw beside the report's own


def drawing_processes() -> int:
    """How many processes draw the charts beside this one: $ATTNBENCH_DRAW_PROCESSES where it is
    set (0: this process draws them all, as on a machine whose other cores are someone else's),
    else one per usable core but this process's."""
    from bench.errors import UsageError
    from bench.measure.cpuload import usable_cpus

    raw = os.environ.get(DRAW_PROCESSES_ENV, "").strip()
    if not raw:
        return len(usable_cpus()) - 1
    if not (raw.isascii() and raw.isdigit()):
        raise UsageError(f"{DRAW_PROCESSES_ENV}={raw!r}: a whole number of processes that draw charts beside the "
                         "report's own, 0 or more (0: the report's process draws them all)")
    return int(raw)


@contextlib.contextmanager
def drawing_pool():
    """The drawing processes, started on entry: a spawned one imports pandas and matplotlib for a
    second or two, while this process reads the rows and computes the tables; shut on exit."""
    global _POOL
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    workers = drawing_processes()
    pool = None
    if workers >= 1:
        try:
            pool = ProcessPoolExecutor(workers, mp_context=mp.get_context(_start_method()))
            for _ in range(workers):
                pool.submit(_ready)
        except OSError:
            pool = None
    _POOL = pool
    try:
        yield pool
    finally:
        _POOL = None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _draw_all(jobs) -> list[list[Path]]:
    """Each chart is independent: draw them on every core (the sweep is over by now), this
    process and the drawing pool's; in order, in this process, where a pool cannot start."""
    from concurrent.futures.process import BrokenProcessPool

    if len(jobs) > 1:
        try:
            if _POOL is not None:
                return _share_out(_POOL, jobs)
            with drawing_pool() as pool:
                if pool is not None:
                    return _share_out(pool, jobs)
        except (OSError, BrokenProcessPool):
            pass
    return [_draw(job) for job in jobs]


def _share_out(pool, jobs) -> list[list[Path]]:
    futures = [pool.submit(_draw, job) for job in jobs]
    results = {}
    # while the pool takes jobs from the front, this process draws from the back every job it has not started
    for i in reversed(range(len(jobs))):
        if futures[i].cancel():
            results[i] = _draw(jobs[i])
    return [results[i] if i in results else futures[i].result() for i in range(len(jobs))]


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


def frontier_chart(df: pd.DataFrame, out: Path, title: str, predicted: bool = False,
                   declared: dict | None = None) -> Path | None:
    """The memory frontier: the largest size each variant fits in the budget as a bar, its
    median time at that size written on it (``frontier.csv``'s columns: variant, largest,
    median_ms_at_largest).  ``predicted``: the bars come from the memory model, not from cells,
    and are drawn hatched; ``declared``: the variants' palette slots (``declared_colours``)."""
    rows = df[df["largest"].notna()].sort_values("largest")
    if rows.empty:
        return None
    fig, ax = new_figure(figsize=(7.5, 0.5 + 0.45 * len(rows)))
    style = variant_style(rows["variant"], None, declared)
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
