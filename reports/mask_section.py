"""The masks of a run: their pictures, densities and FLOPs, and time against density.

Pictures come from the run folder's masks.json (written by the sweep from the definitions,
plugin masks included); for a run without one they are drawn again from ``bench.model.masks``
where the mask is still defined.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from bench.model.case import Case
from bench.runs import maskfile, store
from reports.charts import figure_legend, new_figure, save_figure
from reports.frames import facet_groups

DENSITY_FACETS_DROPPED = ("mask", "window", "mask_label")


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """A ``mask_label`` column (the spelling, the window size in brackets) and a numeric ``density``
    (from the row, or from the definition for rows written before rows carried it)."""
    df = df.copy()
    df["mask_label"] = [maskfile.label(m, w) for m, w in zip(df["mask"], df["window"])]
    if "density" not in df:
        df["density"] = np.nan
    df["density"] = pd.to_numeric(df["density"], errors="coerce")
    missing = df["density"].isna()
    for i in df.index[missing]:
        try:
            v = df.at[i, "head_dim_v"] if "head_dim_v" in df else None
            case = Case.from_dict({**df.loc[i].to_dict(), "window": None if df.at[i, "window"] == "-"
                                   else int(df.at[i, "window"]), "head_dim_v": None if v is None or pd.isna(v)
                                   else int(v)})
            from bench.model import masks  # torch: only for rows of folders from before rows carried it

            df.at[i, "density"] = masks.density(case)
        except (ValueError, TypeError, KeyError):
            pass
    if "block_sparsity" in df:
        df["block_sparsity"] = pd.to_numeric(df["block_sparsity"], errors="coerce")
    return df


def pictures(df: pd.DataFrame, envs: list[dict]) -> dict:
    """{mask label: masks.json entry} for every mask in ``df``."""
    out: dict = {}
    for env in envs:
        if env.get("path"):
            out.update(store.read_masks(Path(env["path"])))
    for label, g in df.groupby("mask_label", sort=False):
        if label in out:
            continue
        row = g.iloc[0]
        try:
            out[label] = maskfile.picture(Case(mask=row["mask"], window=None if row["window"] == "-"
                                            else int(row["window"]), batch=int(row["batch"])))
        except (ValueError, TypeError):
            continue  # a plugin's mask that is no longer defined here: no picture
    return {k: v for k, v in out.items() if k in set(df["mask_label"])}


def mask_table(df: pd.DataFrame, pics: dict) -> pd.DataFrame:
    """Per mask: its definition, and per n the density, the exact forward GFLOP of one cell and
    the share of blocks FlexAttention's block mask skips."""
    rows = []
    for label, g in df.groupby("mask_label", sort=True):
        pic = pics.get(label, {})
        terms = pic.get("terms") or []
        definition = "; ".join(f"{t['name']}"
                               + (f" ({', '.join(f'{k}={_fmt(v)}' for k, v in t['params'].items())})"
                                  if t["params"] else "") + f": {t['description']}" for t in terms)
        row = {"mask": label}
        for n, gn in g.groupby("n", sort=True):
            row[f"density n={n}"] = _first(gn["density"], "{:.3f}")
            fwd = gn["flops"] / gn["direction"].map({"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5})
            row[f"GFLOP n={n}"] = _first(pd.to_numeric(fwd, errors="coerce") / 1e9, "{:.3g}")
            if "block_sparsity" in gn and gn["block_sparsity"].notna().any():
                row[f"flex skips n={n}"] = _first(gn["block_sparsity"], "{:.0f}%")
        rows.append(row | {"definition": definition})  # last: the one column that wraps
    table = pd.DataFrame(rows).fillna("")
    order = ["mask"] + sorted([c for c in table if " n=" in c], key=lambda c: (c.split(" n=")[0] != "density",
                                                                               c.split(" n=")[0],
                                                                               int(c.split(" n=")[1])))
    return table[order + ["definition"]] if rows else table


def _fmt(v) -> str:
    return "/".join(map(str, v)) if isinstance(v, list) else f"{v:g}" if isinstance(v, float) else str(v)


def _first(s: pd.Series, fmt: str) -> str:
    s = s.dropna()
    return fmt.format(float(s.iloc[0])) if len(s) else ""


def pattern_chart(pics: dict, out: Path) -> list[Path]:
    """Each mask's keep pattern (query rows down, keys across) at the length where it shows (four times
    its largest size in tokens, at least 256), with its density there."""
    items = [(k, v) for k, v in sorted(pics.items()) if v.get("rows")]
    if not items:
        return []
    cols = min(5, len(items))
    rows = math.ceil(len(items) / cols)
    width = max(2.5 * cols, 6.5)  # the title fits however few masks there are
    fig, axes = new_figure(rows, cols, figsize=(width, 2.75 * rows + 0.9), squeeze=False, layout="constrained")
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, (label, pic) in zip(axes.flat, items):
        keep = maskfile.unpack(pic["rows"])
        n = pic["size"]
        ax.imshow(keep, cmap="Blues", vmin=0, vmax=1.25, interpolation="nearest", aspect="equal",
                  extent=(-0.5, n - 0.5, n - 0.5, -0.5))
        ax.set_axis_on()
        ax.set_xticks([0, n - 1], ["0", str(n - 1)], fontsize=7)
        ax.set_yticks([0, n - 1], ["0", str(n - 1)], fontsize=7)
        ax.set_title(f"{label}\nn = {n}, density {pic['density']:.2f}", fontsize=9)
    sizes = sorted({pic["size"] for _, pic in items})
    at = f"n = {sizes[0]}" if len(sizes) == 1 else "the length where each shows (4x its largest size)"
    fig.suptitle(f"Mask patterns at {at}\n(query rows down, keys across; blue = kept; batch element 0)", fontsize=11)
    return save_figure(fig, out)


NEAR = 0.04  # masks closer than this in density share one label on the top axis (else the labels overlap)


def _near_labels(densities: list[float], labels: list[str]) -> tuple[list[float], list[str]]:
    """Labels for sorted densities, those within NEAR of the previous one joined with ' / '."""
    at, names = [], []
    for d, name in zip(densities, labels):
        if at and d - at[-1] < NEAR:
            names[-1] += f" / {name}"
        else:
            at.append(d)
            names.append(name)
    return at, names


def density_chart(df: pd.DataFrame, out: Path, style: dict) -> list[Path]:
    """Median time against mask density at one n per facet (the largest n measured with two
    masks or more): a variant that exploits sparsity falls as density falls."""
    ok = df[(df["status"] == "ok") & df["density"].notna() & df["median_ms"].notna()]
    if ok.empty or ok["mask_label"].nunique() < 2:
        return []
    panels = []
    base = ok.drop(columns=[c for c in DENSITY_FACETS_DROPPED if c in ok]).assign(mask="*", window="-")
    for label, g in facet_groups(base):
        g = ok.loc[g.index]
        counts = g.groupby("n")["mask_label"].nunique()
        ns = counts[counts >= 2].index
        if len(ns):
            n = int(max(ns))
            panels.append((label, n, g[g["n"] == n]))
    if not panels:
        return []
    from reports.groups import MAX_FACETS

    dropped = max(0, len(panels) - MAX_FACETS)
    panels = panels[:MAX_FACETS]
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = new_figure(rows, cols, figsize=(7 * cols, 4.8 * rows + 0.8), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(panels):]:
        ax.set_axis_off()
    for ax, (label, n, g) in zip(axes.flat, panels):
        for name, v in g.groupby("variant", sort=True):
            v = v.sort_values("density")
            st = style.get(name, {"color": "gray", "marker": "o", "lw": 1.5, "z": 3})
            shaky = v["shaky"].to_numpy(dtype=bool) if "shaky" in v else np.zeros(len(v), bool)
            # points, not lines: neighbouring densities are different masks, not steps of one axis
            ax.scatter(v["density"][~shaky], v["median_ms"][~shaky], color=st["color"], marker=st["marker"],
                       zorder=st["z"] + 0.1, s=36, label=name)
            ax.scatter(v["density"][shaky], v["median_ms"][shaky], facecolors="white", edgecolors=st["color"],
                       marker=st["marker"], zorder=st["z"] + 0.1, s=28)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _pos: f"{y:g}" if f"{y:g}"[0] in "25" else ""))
        ax.set_xlim(-0.02, 1.05)
        ax.set_xlabel("density: fraction of (query, key) pairs kept", fontsize=9)
        ax.set_ylabel("median time per call (ms, log)", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        top = ax.secondary_xaxis("top")
        marks = g.drop_duplicates("mask_label").sort_values("density")
        for d in marks["density"].unique():
            ax.axvline(d, color="#bbbbbb", lw=0.6, zorder=1)
        at, names = _near_labels(marks["density"].tolist(), marks["mask_label"].tolist())
        top.set_xticks(at, names, rotation=50, ha="left", fontsize=7)
        ax.set_title(f"n = {n}" + ("" if label == "all cells" else f"; {label}"), fontsize=9)
    figure_legend(fig, list(axes.flat[:len(panels)]))
    more = f"\nthe first {len(panels)} facets of {len(panels) + dropped}" if dropped else ""
    fig.suptitle("Time vs mask density at fixed n\n(a variant that exploits sparsity gets faster to the left; "
                 "hollow = shaky)" + more, fontsize=10)
    return save_figure(fig, out)
