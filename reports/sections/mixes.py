"""Serving mixes (--batch-mix) drawn as what they are: one bar group per mix, a bar per variant
with its interquartile whisker, and beneath them each mix's phases (prefill, chunked prefill,
decode) as shares of its FLOPs, query tokens and keys read.  A mix is one point, not a length
to scale over, so no scaling guide or band is drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from reports.charts import log_tick_values, new_figure, save_figure
from reports.frames import ran_here
from reports.sections import Section, SectionInput

PHASE_COLORS = {"prefill": "#4c72b0", "chunked_prefill": "#dd8452", "decode": "#55a868"}
SHARES = (("flops", "FLOPs"), ("q_tokens", "query tokens"), ("kv_bytes", "keys read"))


def mix_jobs(df: pd.DataFrame, folder: Path, style: dict) -> list:
    """The charts of a group of serving mixes as drawing jobs (as charts.chart_jobs gives a scaling group's)."""
    return [("time", mix_chart, df, dict(style=style, out=folder / "time", metric="time_ms", low="q1_ms",
                                         high="q3_ms", ylabel="median time per call (ms; whisker: IQR)",
                                         title="Time per mixed batch, by variant")),
            ("memory", mix_chart, df, dict(style=style, out=folder / "memory", metric="mem_mib",
                                           ylabel="peak memory above inputs (MiB)",
                                           title="Peak memory per mixed batch, by variant"))]


def is_mix_frame(df: pd.DataFrame) -> bool:
    """Whether every row of the frame is a mixed batch (its charts are bar groups, not scaling lines)."""
    return "mix" in df and not df.empty and bool((df["mix"].astype(str) != "none").all())


def group_charts(df: pd.DataFrame, folder: Path, style: dict) -> list | None:
    """A group of serving mixes is drawn as bar groups (a mix is one batch, not a length that scales);
    None for any other group (reports.sections's protocol)."""
    return mix_jobs(df, folder, style) if is_mix_frame(df) else None


def phase_shares(phases) -> dict:
    """{(what, phase): share} of one mix's phases dict (FLOPs, query tokens, KV bytes)."""
    from bench.model.workload import PHASES

    out = {}
    if not isinstance(phases, dict):
        return out
    for key, _label in SHARES:
        total = sum(p.get(key, 0) for p in phases.values()) or 1
        for ph in PHASES:
            out[(key, ph)] = phases.get(ph, {}).get(key, 0) / total
    return out


def mix_chart(df: pd.DataFrame, metric: str, ylabel: str, title: str, style: dict, out: Path,
              low: str | None = None, high: str | None = None, logy: bool = True, **_ignored) -> list[Path]:
    """Bars of ``metric`` per variant in one group per mix (whiskers from ``low`` to ``high``), and
    each mix's phase shares below."""
    from bench.model.workload import PHASES

    ok = ran_here(df)
    ok = ok[(ok["status"] == "ok") & ok[metric].notna()] if metric in ok else ok.iloc[0:0]
    if ok.empty:
        return []
    mixes = sorted(ok["mix"].unique(), key=lambda m: float(ok.loc[ok["mix"] == m, "q_len"].iloc[0]))
    variants = sorted(ok["variant"].unique())
    width = 0.8 / len(variants)
    fig, (ax, shares) = new_figure(2, 1, figsize=(max(7.0, 1.6 + 1.2 * len(mixes) * max(1, len(variants)) * 0.45),
                                                  6.2), height_ratios=[3, 1.3])
    x = np.arange(len(mixes))
    timed = metric == "time_ms"  # shaky is the timing's flag: a memory peak is drawn filled
    for i, name in enumerate(variants):
        v = ok[ok["variant"] == name].set_index("mix")
        ys = [float(v.loc[m, metric]) if m in v.index else np.nan for m in mixes]
        st = style.get(name, {"color": "gray"})
        shaky = [bool(v.loc[m, "shaky"]) if timed and m in v.index and "shaky" in v else False for m in mixes]
        pos = x - 0.4 + width * (i + 0.5)
        ax.bar(pos, ys, width * 0.9, color=[st["color"] if not s else "white" for s in shaky],
               edgecolor=st["color"], lw=1.2, label=name, zorder=2)
        if low and high and low in v and high in v:
            lo = [float(v.loc[m, low]) if m in v.index else np.nan for m in mixes]
            hi = [float(v.loc[m, high]) if m in v.index else np.nan for m in mixes]
            err = np.array([np.subtract(ys, lo), np.subtract(hi, ys)]).clip(min=0)
            ax.errorbar(pos, ys, yerr=err, fmt="none", ecolor="#333333", elinewidth=0.8, capsize=2, zorder=3)
    if logy:
        from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(log_tick_values(*ax.get_ylim())))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda val, _pos: f"{val:g}"))
        ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xticks(x, [f"mix {i + 1}: " + _mix_label(ok, m) for i, m in enumerate(mixes)], fontsize=8)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    ax.set_title(title, fontsize=11)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0),
              title="hollow: shaky" if timed and "shaky" in ok and ok["shaky"].any() else None, title_fontsize=8)
    _draw_shares(shares, ok, mixes, PHASES)
    return save_figure(fig, out)


def _mix_label(ok: pd.DataFrame, mix: str) -> str:
    r = ok[ok["mix"] == mix].iloc[0]
    return f"{mix.replace('+', '+' + chr(10))}\n({int(r['q_len'])} query tokens)"


def _draw_shares(ax, ok: pd.DataFrame, mixes: list, phases) -> None:
    """Per mix, three thin stacked bars: the phases' shares of its FLOPs, query tokens and keys read."""
    first = ok.drop_duplicates("mix").set_index("mix")
    rows = []
    for i, m in enumerate(mixes):
        shares = phase_shares(first.loc[m, "phases"] if "phases" in first else None)
        for j, (key, label) in enumerate(SHARES):
            y = i * (len(SHARES) + 1) + j
            left = 0.0
            for ph in phases:
                s = shares.get((key, ph), 0.0)
                ax.barh(y, s, left=left, color=PHASE_COLORS[ph], height=0.8,
                        label=ph.replace("_", " ") if (i, j) == (0, 0) else None)
                if s >= 0.12:
                    ax.text(left + s / 2, y, f"{100 * s:.0f}%", ha="center", va="center", fontsize=6, color="white")
                left += s
            rows.append((y, f"{label}" if j else f"mix {i + 1}: {label}"))
    ax.set_yticks([y for y, _ in rows], [t for _, t in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the mix (by phase)", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


WORKLOAD_NOTES = {
    "ragged": "Ragged batches (--lengths): each cell's sequences have different lengths averaging n, held as the "
              "layout says (packed: back to back; nested: a nested jagged tensor). µs per real token is the median "
              "over batch x n tokens; padding waste is what an equal-length kernel would compute on the same batch "
              "padded to its longest sequence, over the real work (1 = none).",
    "mix": "Mixed batches (--batch-mix): each mix is one packed call of sequences with their own query and key "
           "lengths, bottom-right within each (a prefill has Q = KV, a chunked prefill continues against its cache, "
           "a decode step has Q = 1). µs per query token is the median over the mix's new tokens; ns per KV KiB "
           "read is the median over the keys and values it must read at least (each once), the figure that "
           "bounds a decode-heavy batch; the FLOPs columns give each phase's share of the work. layout: how the "
           "variant held the mix (packed, nested jagged tensors, or a dense mask over the packed tokens).",
    "inputs": "Approximation error by input kind (--inputs): the relative Frobenius error of the output against "
              "the float64 reference (1 = the error of answering zeros). i.i.d. normal inputs give nearly uniform "
              "attention, where every approximation fails; clustered, low-rank and outlier inputs give the "
              "structure each one assumes or breaks (bench/model/workload.py).",
}


def sections(ctx: SectionInput) -> list[Section]:
    """The workload tables of the page: mixed batches, ragged batches, and the approximation
    error by input kind where more than one kind ran."""
    from reports.tables import error_by_inputs, mix_table, ragged_table

    out = [Section("mixes", "Mixed batches", WORKLOAD_NOTES["mix"], mix_table(ctx.df)),
           Section("ragged", "Ragged batches", WORKLOAD_NOTES["ragged"], ragged_table(ctx.df))]
    if ctx.df["inputs"].nunique() > 1:
        out.append(Section("inputs", "Approximation error by input kind", WORKLOAD_NOTES["inputs"],
                           error_by_inputs(ctx.df)))
    return out
