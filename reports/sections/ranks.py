"""The report's context-parallel part (``--ranks``): for each variant and world size P, the step's
time (its slowest rank's), each rank's, the time in communication and its share, the fastest rank's
wait for the slowest, the bytes each rank sent and its peak memory, against n; the scaling
efficiency against P = 1; and from which n the compute outweighs the communication."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from reports.sections import Section, SectionInput

NOTE = " ".join((
    "--ranks P: a cell split over P processes of one torch.distributed group (gloo on the CPU, NCCL on CUDA),",
    "each holding 1/P of the sequence. step: the slowest rank's time per step (each sample starts at a barrier);",
    "per rank: each rank's median. comm: the time inside the collectives of the slowest rank at each step (on the",
    "CPU a clock around each blocking collective, which includes waiting for the peer in it; for an exchange",
    "overlapped with a block's compute, as cp.ring's, the wait for it after the compute); comm share: comm over",
    "the step; wait: the step less the fastest rank's own time (the imbalance). sent: the bytes a rank sent per",
    "step (the most of any rank). peak: the largest rank's peak memory. efficiency: the P = 1 step of the same",
    "variant over P times this step (1 is perfect scaling). On a CPU with fewer cores than ranks x threads the",
    "cells are contended (shaky): their correctness and bytes hold, their times do not scale."))
MIB = 1 << 20


def _largest(values) -> float:
    return max(values) if isinstance(values, (list, tuple)) and values and all(
        isinstance(v, (int, float)) for v in values) else np.nan


def _keys(df: pd.DataFrame) -> list[str]:
    return [c for c in ("device", "dtype", "mask", "direction", "heads", "head_dim", "batch") if c in df]


def ranks_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per ok context-parallel cell (a row with rank figures), with its efficiency."""
    if "rank_median_ms" not in df or df["rank_median_ms"].isna().all():
        return pd.DataFrame()
    ok = df[(df["status"] == "ok") & df["rank_median_ms"].notna()].copy()
    if ok.empty:
        return pd.DataFrame()
    keys = _keys(ok)
    base = ok[ok["ranks"] == 1].set_index(["variant", *keys, "q_len"])["median_ms"]
    eff = []
    for r in ok.to_dict("records"):
        one = base.get(tuple([r["variant"], *(r[k] for k in keys), r["q_len"]]), np.nan)
        eff.append(float(one) / (r["ranks"] * r["median_ms"]) if not pd.isna(one) and r["median_ms"] else np.nan)
    t = pd.DataFrame({
        "variant": ok["variant"], "mask": ok["mask"], "direction": ok["direction"], "n": ok["q_len"],
        "ranks": ok["ranks"], "step ms": ok["median_ms"],
        "per rank ms": [" / ".join(f"{x:.3g}" for x in v) for v in ok["rank_median_ms"]],
        "comm ms": ok.get("comm_ms", np.nan), "comm share %": 100 * ok.get("comm_share", np.nan),
        "wait ms": ok.get("wait_ms", np.nan), "sent MiB": ok.get("bytes_sent", np.nan) / MIB,
        "collective ms": ok.get("collective_ms", np.nan), "hidden %": 100 * ok.get("comm_hidden", np.nan),
        "peak MiB per rank": [_largest(v) / MIB for v in ok.get("rank_peak_mem_bytes", [np.nan] * len(ok))],
        "efficiency": eff, "contended": ok.get("contended", False).fillna(False).astype(bool)})
    return t.sort_values(["mask", "direction", "variant", "ranks", "n"]).round(3).reset_index(drop=True)


def hides_from(table: pd.DataFrame) -> list[str]:
    """For each variant, mask, direction and P > 1: the n from which its communication is under half
    its step at every measured n beyond (or that it is not, at any n measured)."""
    out = []
    multi = table[table["ranks"] > 1].dropna(subset=["comm share %"])
    for (variant, mask, direction, ranks), g in multi.groupby(["variant", "mask", "direction", "ranks"]):
        g = g.sort_values("n")
        under = list(g["comm share %"] < 50)
        start = next((i for i in range(len(under)) if all(under[i:])), None)
        where = f"from n={int(g['n'].iloc[start])}" if start is not None else \
            f"at no n measured (up to {int(g['n'].max())})"
        out.append(f"{variant} {mask} {direction}, {ranks} ranks: communication under half the step {where}")
    return out


def ranks_chart(table: pd.DataFrame, out: Path, style: dict, mask: str, direction: str) -> Path | None:
    """Step time, per-rank peak memory and communication share against n: a line per variant and P."""
    from reports.charts import new_figure, save_figure

    g = table[(table["mask"] == mask) & (table["direction"] == direction)]
    if g.empty:
        return None
    fig, axes = new_figure(1, 3, figsize=(13, 4))
    dashes = ["-", "--", ":", "-."]
    for (variant, ranks), s in g.groupby(["variant", "ranks"]):
        s = s.sort_values("n")
        st = style.get(variant, {"color": "#555555", "marker": "o"})
        kw = dict(color=st["color"], marker=st["marker"], ls=dashes[int(math.log2(max(1, ranks))) % len(dashes)],
                  label=f"{variant} P={ranks}", ms=4)
        axes[0].plot(s["n"], s["step ms"], **kw)
        axes[1].plot(s["n"], s["peak MiB per rank"], **kw)
        if ranks > 1:
            axes[2].plot(s["n"], s["comm share %"], **kw)
    for ax, label in zip(axes, ("step (ms, slowest rank)", "peak memory per rank (MiB)", "communication share (%)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("n", fontsize=9)
        ax.set_ylabel(label, fontsize=9)
    axes[0].set_yscale("log")
    axes[2].axhline(50, color="#888888", lw=1, ls="--")
    axes[0].legend(fontsize=7, frameon=False)
    fig.suptitle(f"Context parallelism: {mask}, {direction}", fontsize=10)
    return save_figure(fig, out)[0]


def sections(ctx: SectionInput) -> list[Section]:
    """ranks.csv and the page's section (none without rank rows)."""
    table = ranks_table(ctx.df)
    if table.empty:
        return []
    table.to_csv(ctx.folder / "ranks.csv", index=False)
    charts = [c for (mask, direction), _ in table.groupby(["mask", "direction"])
              if (c := ranks_chart(table, ctx.charts_dir / f"ranks_{mask}_{direction}".replace("+", "_"), ctx.style,
                                   mask, direction))]
    note = NOTE + (" " + "; ".join(hides_from(table)) + "." if hides_from(table) else "")
    return [Section("ranks", "Context parallelism", note, table, charts,
                    "step time, per-rank memory and communication share against n, per world size")]
