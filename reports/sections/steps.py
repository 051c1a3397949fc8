"""The report's cost per step (``--steps K``): per variant and case, the kernel's median beside
what a step of fresh batches costs (its preparation, its recompiles, the wall time), and a
chart of step time against kernel time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from reports.sections import Section, SectionInput

NOTE = ("--steps K: after its timing, each ok cell ran K steps, each with a freshly drawn batch (a ragged batch's "
        "new lengths, its number of tokens varying; other cases their same structure), set up again and called once, "
        "timed by the wall clock. kernel: the cell's median. prep: the median preparation per step (block mask, bias, "
        "offsets). recompiles: graphs compiled during the steps. recompile share: the time of the steps that "
        "recompiled beyond their kernel and prep, over all the steps' time. step: the median step of the second "
        "half (steady state). compile cold / warm: the case's first compile in the worker, and the same case again "
        "after torch._dynamo.reset() with inductor's caches warm.")


def _share(r) -> float:
    steps, flags = r.get("step_ms"), r.get("step_recompiles")
    if not isinstance(steps, list) or not isinstance(flags, list) or not steps:
        return np.nan
    base = (r.get("median_ms") or 0.0) + (r.get("step_prep_ms") or 0.0)
    extra = sum(max(0.0, s - base) for s, f in zip(steps, flags) if f)
    return extra / sum(steps)


def steps_table(df: pd.DataFrame) -> pd.DataFrame:
    if "step_steady_ms" not in df or df["step_steady_ms"].isna().all():
        return pd.DataFrame()
    ok = df[(df["status"] == "ok") & df["step_steady_ms"].notna()]
    cols = {c: ok[c] if c in ok else np.nan for c in ("compile_ms", "compile_warm_ms")}
    t = pd.DataFrame({
        "variant": ok["variant"], "n": ok["n"], "mask": ok["mask"], "lengths": ok["lengths"],
        "direction": ok["direction"], "kernel ms": ok["median_ms"], "prep ms": ok["step_prep_ms"],
        "recompiles": [f"{int(r)} of {int(k)}" for r, k in zip(ok["recompiles"], ok["steps"])],
        "recompile share %": [100 * _share(r) for r in ok.to_dict("records")],
        "step ms": ok["step_steady_ms"], "step / kernel": ok["step_steady_ms"] / ok["median_ms"],
        "compile cold ms": cols["compile_ms"], "compile warm ms": cols["compile_warm_ms"]})
    return t.sort_values(["lengths", "mask", "direction", "n", "variant"]).round(3)


def steps_chart(df: pd.DataFrame, out: Path, style: dict) -> Path | None:
    """Steady step time against kernel time, one point per cell, with the line step = kernel:
    the distance above it is what a step pays beyond the kernel."""
    from reports.charts import new_figure, save_figure

    if "step_steady_ms" not in df:
        return None
    ok = df[(df["status"] == "ok") & df["step_steady_ms"].notna() & df["median_ms"].notna()]
    if ok.empty:
        return None
    fig, ax = new_figure(figsize=(6.5, 4.5))
    for name, g in ok.groupby("variant"):
        st = style.get(name, {"color": "#555555", "marker": "o"})
        ax.scatter(g["median_ms"], g["step_steady_ms"], color=st["color"], marker=st["marker"], label=name, s=30)
    lo = float(min(ok["median_ms"].min(), ok["step_steady_ms"].min())) / 2
    hi = float(max(ok["median_ms"].max(), ok["step_steady_ms"].max())) * 2
    ax.plot([lo, hi], [lo, hi], color="#888888", lw=1, ls="--", label="step = kernel")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("kernel median (ms)", fontsize=9)
    ax.set_ylabel("steady step, wall (ms)", fontsize=9)
    ax.set_title("What a step costs beyond the kernel (--steps)", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    return save_figure(fig, out)[0]


def sections(ctx: SectionInput) -> list[Section]:
    """steps.csv and the page's section (none without --steps rows)."""
    table = steps_table(ctx.df)
    if table.empty:
        return []
    table.to_csv(ctx.folder / "steps.csv", index=False)
    chart = steps_chart(ctx.df, ctx.charts_dir / "steps", ctx.style)
    return [Section("steps", "Cost per step", NOTE, table, [chart] if chart else [], "step against kernel")]
