"""The report's groups: a sweep of several dtypes, head dims, directions or models is read one
group at a time (a selector on the page switches between them), each group's charts holding at
most MAX_FACETS panels; and the overview a reader asks for first: per group, facet and n, the
fastest exact variant, its time and memory, the runner-up and the margin."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.model.axes import placed
from bench.runs.judge import beyond_same
from reports.frames import facet_groups, facet_labels, natural, paired_ratio, varying_facets

MAX_FACETS = 12  # panels in one chart: more and a 1400 px page shows hairlines under overlapping titles
# one group per combination
GROUP_AXES = ("model", "hardware", "device", "scope", "ffn", "dtype", "head_dims", "direction")
# (ranks: promoted, as heads are; the context-parallel section draws the world sizes side by side)
# when a group would still hold more than MAX_FACETS facets, these become group axes too, in this
# order (the mask, the window and the runs stay side by side in one chart for as long as they can)
PROMOTE = tuple(placed(("heads", "kv_heads", "batch", "ranks", "kv", "lengths", "mix", "align", "run", "window"),
                       "promote_after"))  # each plain axis where it declares (bench.model.axes)


@dataclass(frozen=True)
class Group:
    slug: str  # '' for a report of one group: its charts keep their plain names (charts/time.png)
    label: str
    frame: pd.DataFrame


def _facets(g: pd.DataFrame) -> int:
    cols = varying_facets(g)
    return len(g.drop_duplicates(cols)) if cols else 1


def group_axes(df: pd.DataFrame) -> list[str]:
    """The columns that split ``df`` into groups: GROUP_AXES that vary, then PROMOTE ones until
    no group holds more than MAX_FACETS facets (or none is left to promote)."""
    varying = varying_facets(df)
    axes = [c for c in GROUP_AXES if c in varying]
    for extra in (c for c in PROMOTE if c in varying):
        frames = [g for _, g in df.groupby(axes, sort=False, dropna=False)] if axes else [df]
        if max(_facets(g) for g in frames) <= MAX_FACETS:
            break
        axes.append(extra)
    return axes


def _slug(values) -> str:
    return re.sub(r"[^A-Za-z0-9.+=-]+", "_", "-".join(str(v) for v in values)).strip("_") or "all"


def split(df: pd.DataFrame) -> list[Group]:
    """The report's groups, in natural order; a group still over MAX_FACETS facets (a mask axis
    of more than twelve masks) is cut into parts of at most MAX_FACETS facets each."""
    axes = group_axes(df)
    if not axes:
        whole = [("", "all cells", df)]
    else:
        pieces = df.groupby(axes, sort=False, dropna=False)
        keyed = sorted(((k if isinstance(k, tuple) else (k,), g) for k, g in pieces),
                       key=lambda kg: tuple(natural(v) for v in kg[0]))
        whole = [(_slug(k), ", ".join(f"{c}={v}" for c, v in zip(axes, k)), g) for k, g in keyed]
    out = []
    for slug, label, g in whole:
        facets = list(facet_groups(g))
        if len(facets) <= MAX_FACETS:
            out.append(Group(slug if len(whole) > 1 else "", label, g))
            continue
        parts = math.ceil(len(facets) / MAX_FACETS)
        for i in range(parts):
            chunk = facets[i * MAX_FACETS:(i + 1) * MAX_FACETS]
            frame = pd.concat([f for _, f in chunk])
            out.append(Group(f"{slug}-part{i + 1}", f"{label} (part {i + 1} of {parts})", frame))
    return out


def _exact_ok(g: pd.DataFrame) -> pd.DataFrame:
    ok = g[(g["status"] == "ok") & g["median_ms"].notna()]
    if "approximate" in ok:
        ok = ok[~ok["approximate"].fillna(False).astype(bool)]
    return ok


OVERVIEW_COLUMNS = ["group", "facet", "n", "fastest", "median ms", "memory MiB", "runner-up", "runner-up ms",
                    "margin", "margin low", "margin high", "paired", "shaky"]


def overview(group: Group) -> pd.DataFrame:
    """Per facet and n of the group: the fastest exact variant (least median time), its time and
    peak memory, the runner-up and the margin (runner-up time / fastest time) with its spread:
    over the interleaved rounds when the two were timed together, else from their quartiles."""
    g = group.frame
    if g.empty:
        return pd.DataFrame(columns=OVERVIEW_COLUMNS)
    label = facet_labels(g)
    order = {name: i for i, (name, _) in enumerate(facet_groups(g))}
    ok = _exact_ok(g)
    ok = ok.assign(_facet=label[ok.index]).sort_values("median_ms", kind="stable")
    top = ok.groupby(["_facet", "n"], sort=False).head(2)
    records = top.to_dict("records")
    pairs: dict = {}
    for r in records:
        pairs.setdefault((r["_facet"], int(r["n"])), []).append(r)
    rows = []
    for (facet, n), ranked in sorted(pairs.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        best = ranked[0]
        mem = best.get("peak_mem_bytes")
        row = {"group": group.label, "facet": facet, "n": n, "fastest": best["variant"],
               "median ms": best["median_ms"], "memory MiB": np.nan if mem is None or pd.isna(mem) else mem / 2**20,
               "runner-up": "", "runner-up ms": np.nan, "margin": np.nan, "margin low": np.nan,
               "margin high": np.nan, "paired": False, "shaky": bool(best.get("shaky"))}
        if len(ranked) > 1:
            second = ranked[1]
            med, lo, hi, paired = paired_ratio(best, second)
            if med < 1.0:  # the rounds, paired, rank them the other way round: they decide, not the two medians
                best, second = second, best
                med, lo, hi = 1.0 / med, 1.0 / hi, 1.0 / lo
                mem = best.get("peak_mem_bytes")
                row.update({"fastest": best["variant"], "median ms": best["median_ms"],
                            "memory MiB": np.nan if mem is None or pd.isna(mem) else mem / 2**20})
            row.update({"runner-up": second["variant"], "runner-up ms": second["median_ms"], "margin": med,
                        "margin low": lo, "margin high": hi, "paired": paired,
                        "shaky": bool(best.get("shaky") or second.get("shaky"))})
        rows.append(row)
    return pd.DataFrame(rows, columns=OVERVIEW_COLUMNS)


def _num(x) -> str:
    from reports.tables import figures

    return "-" if x is None or pd.isna(x) else figures(x)


def overview_display(t: pd.DataFrame) -> pd.DataFrame:
    """The overview as the page shows it: the margin with its spread in one column; a margin
    whose spread reaches 1, or that is within judge.SAME_WITHIN (or a shaky pair), says the two are
    not told apart."""
    if t.empty:
        return t
    margin = []
    for m, lo, hi, shaky in zip(t["margin"], t["margin low"], t["margin high"], t["shaky"]):
        if pd.isna(m):
            margin.append("only one ran")
            continue
        text = f"{m:.2f}x ({lo:.2f}-{hi:.2f})"
        apart = beyond_same(m, lo, hi) != 0  # its spread clear of 1, and more than the 3 % the charts call equal
        if not apart or shaky:
            text += " not told apart" if not apart else " shaky"
        margin.append(text)
    out = pd.DataFrame({"facet": t["facet"], "n": t["n"], "fastest exact": t["fastest"],
                        "median ms": [_num(x) for x in t["median ms"]],
                        "peak MiB": [_num(x) for x in t["memory MiB"]], "runner-up": t["runner-up"],
                        "runner-up ms": [_num(x) for x in t["runner-up ms"]], "margin (spread)": margin})
    if out["facet"].nunique() == 1:
        out = out.drop(columns="facet")
    return out


def winner_grid(t: pd.DataFrame, style: dict) -> str:
    """The overview as one small chart, in HTML (nothing to render, sharp at any width): facets
    down, n across, each square in the fastest exact variant's colour with the margin over the
    runner-up written in it (hover: the two and their times), and a key of the colours."""
    import html

    from matplotlib.colors import to_hex

    if t.empty:
        return ""
    facets = list(dict.fromkeys(t["facet"]))
    ns = sorted(t["n"].unique())
    at = {(r["facet"], r["n"]): r for r in t.to_dict("records")}

    def colour(name):
        return to_hex(style.get(name, {}).get("color", "#888888"))

    head = "".join(f"<th>{n}</th>" for n in ns)
    body = []
    for f in facets:
        cells = []
        for n in ns:
            r = at.get((f, n))
            if r is None:
                cells.append("<td></td>")
                continue
            margin = "-" if pd.isna(r["margin"]) else f"{r['margin']:.2f}x"
            tip = f"{r['fastest']} {_num(r['median ms'])} ms" + (
                f"; {r['runner-up']} {_num(r['runner-up ms'])} ms" if r["runner-up"] else "; no runner-up")
            cells.append(f"<td class=win style='background:{colour(r['fastest'])}' title='{html.escape(tip)}'>"
                         f"{margin}</td>")
        body.append(f"<tr><th>{html.escape(f)}</th>{''.join(cells)}</tr>")
    key = " ".join(f"<span class=chip style='background:{colour(w)}'></span>{html.escape(w)}"
                   for w in sorted(set(t["fastest"])))
    return (f"<div class=tw><table class=winners><tr><th>fastest exact variant by facet and n (the figure: "
            f"the runner-up's time over the fastest's)</th>{head}</tr>{''.join(body)}</table></div>"
            f"<p class=muted>{key}</p>")


def not_run(df: pd.DataFrame) -> pd.DataFrame:
    """The variants that did not run here at all (every cell unsupported), each with its first
    reason: listed once above the charts, never drawn as a label in every panel.  A variant that
    ran and failed is not here: its cells are the failures'."""
    rows = []
    for name, g in df.groupby("variant", sort=True):
        if (g["status"] != "unsupported").any():
            continue
        for status, s in g.groupby("status", sort=True):
            reasons = s["reason"].replace("", np.nan).dropna()
            others = reasons.nunique() - 1
            rows.append({"variant": name, "status": status, "cells": len(s),
                         "reason": (reasons.iloc[0] if len(reasons) else "no reason given")
                         + (f" (and {others} other reason{'s' * (others > 1)} of this status)" if others > 0 else "")})
    return pd.DataFrame(rows, columns=["variant", "status", "cells", "reason"])
