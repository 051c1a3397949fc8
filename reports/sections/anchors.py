"""Published anchors (``--preset anchors``, bench.model.anchors): each ok GPU row at an anchor's
shape against the anchor's published figure, as published time / measured time, with the clocks,
the power limit and the driver it ran under, and whether it ran on the anchor's GPU model."""

from __future__ import annotations

import math

import pandas as pd

from bench.model.anchors import ANCHORS, Anchor, chips_in
from reports.sections import Section, SectionInput

NOTE = ("Each anchor is a shape at which a kernel's authors or users published a figure. The published figure is "
        "turned into the time it implies with its source's own way of counting the work (bench.model.anchors), and "
        "'measured / published' is that time over the measured median: the speed reached as a fraction of the "
        "anchor's (1.00 is as fast, above 1 faster). A ratio from another GPU model than the anchor's compares "
        "machines as much as kernels: the 'GPU' column says so. Figures from issue threads are one person's run; "
        "FlashMLA's are its README's ceilings.")
COLUMNS = ("anchor", "kernel", "published", "published on", "variant", "measured ms", "published ms",
           "measured / published", "GPU", "measured on", "driver", "power limit W", "SM clock MHz", "source", "note")


def _at(df: pd.DataFrame, a: Anchor) -> pd.DataFrame:
    """The ok GPU core rows at the anchor's shape."""
    if df.empty or "device" not in df:
        return df.iloc[0:0]
    keep = (df["device"] == "cuda") & (df["status"].astype(str) == "ok")
    for key, want in a.case_fields().items():
        if key not in df:
            if want is None:
                continue
            return df.iloc[0:0]
        col = df[key]
        if want is None:  # unset: missing, or as tidy shows it ('-')
            keep &= col.isna() | (col.astype(str) == "-")
        else:
            keep &= (col.astype(object) == want) | (col.astype(str) == str(want))
    for key, default in (("scope", "core"), ("mix", "none"), ("lengths", "fixed"), ("inputs", "normal")):
        if key in df:
            keep &= df[key].fillna(default).astype(str) == default
    return df[keep]


def _number(v, digits: int = 0):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else round(f, digits) if digits else int(round(f))


def _gpu(a: Anchor, device_name: str | None) -> str:
    if not device_name:
        return "unknown"
    return "same model" if a.chip.upper() in chips_in(device_name) else f"differs: published on {a.chip}"


def anchor_table(df: pd.DataFrame, envs: list[dict]) -> pd.DataFrame:
    """One line per (anchor, variant) measured at the anchor's shape, fastest first within an anchor."""
    by_run = {e.get("run"): e for e in envs}
    out = []
    for a in ANCHORS:
        for _, r in _at(df, a).iterrows():
            env = by_run.get(r.get("run"), {})
            measured = float(r["median_ms"])
            published = a.published_ms()
            clock = r.get("sm_clock_end_mhz") if pd.notna(r.get("sm_clock_end_mhz")) else r.get("sm_clock_start_mhz")
            out.append({"anchor": a.name, "kernel": a.kernel, "published": f"{a.figure:g} {a.unit}",
                        "published on": a.hardware, "variant": r["variant"], "measured ms": round(measured, 4),
                        "published ms": round(published, 4),
                        "measured / published": round(published / measured, 3) if measured > 0 else None,
                        "GPU": _gpu(a, env.get("device_name")), "measured on": env.get("device_name") or "-",
                        "driver": env.get("driver") or "-", "power limit W": _number(r.get("power_limit_w")),
                        "SM clock MHz": _number(clock), "source": a.source, "note": a.note})
    table = pd.DataFrame(out, columns=list(COLUMNS))
    if table.empty:
        return table
    order = {a.name: i for i, a in enumerate(ANCHORS)}
    table["_order"] = table["anchor"].map(order)
    return (table.sort_values(["_order", "measured / published"], ascending=[True, False])
            .drop(columns="_order").reset_index(drop=True))


def sections(ctx: SectionInput) -> list[Section]:
    """anchors.csv and the page's section (none when no row sits at an anchor's shape)."""
    table = anchor_table(ctx.df, ctx.envs)
    if table.empty:
        return []
    table.to_csv(ctx.folder / "anchors.csv", index=False)
    return [Section("anchors", "Against published figures", NOTE, table)]
