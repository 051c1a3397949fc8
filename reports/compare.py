"""``python -m bench compare RUN_A RUN_B``: B/A per matching cell with a noise-aware verdict.

A cell is 'within noise' when the two interquartile ranges overlap; otherwise it is
'faster' or 'slower'; a cell noisy or contended in either run is 'shaky', and one timed with
different timers in A and B (``timer``: CUDA events against CUDA graphs) is 'other timer':
both are counted apart and never a regression.  --fail-on-regression PCT flags a cell as a regression when it is
slower and its B/A ratio exceeds 1 + PCT/100 even after the spreads are allowed for,
i.e. B's q1 / A's q3 > 1 + PCT/100.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullFormatter

from bench.model import row
from reports.charts import new_figure
from reports.frames import load_runs, with_peaks

ENV_KEYS = ("device", "device_name", "torch", "xformers", "cuda", "threads")


SHAKY = "shaky"  # the verdict of a cell noisy or contended in either run: counted apart, never better or worse
OTHER_TIMER = "other timer"  # timed with different timers in A and B (CUDA events with a cold L2 against CUDA
# graphs, say): the times measure different things, so the cell is counted apart and never a regression


def verdict(a: dict, b: dict) -> str:
    if b["q1_ms"] > a["q3_ms"]:
        return "slower"
    if b["q3_ms"] < a["q1_ms"]:
        return "faster"
    return "within noise"


def compare_frames(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    keys = list(row.IDENTITY)
    cols = [*row.SPREAD, "status", "shaky", "timer"]
    a, b = (x.assign(shaky=x["shaky"] if "shaky" in x else False,
                     timer=x["timer"].fillna("") if "timer" in x else "") for x in (a, b))
    a = a[a["status"] == "ok"][keys + cols]  # load_runs keeps each cell's current row only
    b = b[b["status"] == "ok"][keys + cols]
    m = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if m.empty:
        return m
    m["ratio"] = m["median_ms_b"] / m["median_ms_a"]
    m["shaky"] = m["shaky_a"].astype(bool) | m["shaky_b"].astype(bool)
    m["other_timer"] = m["timer_a"].astype(str) != m["timer_b"].astype(str)
    m["verdict"] = [OTHER_TIMER if r.other_timer else SHAKY if r.shaky else
                    verdict({"q1_ms": r.q1_ms_a, "q3_ms": r.q3_ms_a}, {"q1_ms": r.q1_ms_b, "q3_ms": r.q3_ms_b})
                    for r in m.itertuples()]
    m["slowdown_beyond_noise"] = m["q1_ms_b"] / m["q3_ms_a"] - 1.0
    return m


def env_differences(env_a: dict, env_b: dict) -> list[str]:
    return [f"{k}: {env_a.get(k)} vs {env_b.get(k)}" for k in ENV_KEYS if env_a.get(k) != env_b.get(k)]


def compare_runs(run_a, run_b, out: Path | None = None, fail_pct=None):
    """Returns (table, regressions, warnings, chart path, trust lines of A and B).
    ``fail_pct``: a percentage (the median rule) or (metric, percentage) with metric
    'median' (B's q1 over A's q3, beyond noise) or 'min' (B's fastest sample over A's).  A
    cell shaky in either run is never a regression: its verdict is 'shaky'."""
    from reports.page import trust_line

    da, (env_a,) = load_runs([run_a])
    db, (env_b,) = load_runs([run_b])
    m = compare_frames(da, db)
    warnings = env_differences(env_a, env_b)
    trust = [trust_line(with_peaks(da, [env_a]), [env_a]), trust_line(with_peaks(db, [env_b]), [env_b])]
    regressions = m.iloc[0:0]
    if fail_pct is not None and not m.empty:
        metric, pct = fail_pct if isinstance(fail_pct, tuple) else ("median", float(fail_pct))
        clean = m[~m["shaky"] & ~m["other_timer"]]
        if metric == "min":
            regressions = clean[clean["min_ms_b"] / clean["min_ms_a"] - 1.0 > pct / 100.0]
        else:
            regressions = clean[(clean["verdict"] == "slower") & (clean["slowdown_beyond_noise"] > pct / 100.0)]
    chart = None
    if out is not None and not m.empty:
        out.mkdir(parents=True, exist_ok=True)
        m.to_csv(out / "compare.csv", index=False)
        chart = _chart(m, out / "compare.png", Path(run_a).name, Path(run_b).name)
    return m, regressions, warnings, chart, trust


def _chart(m: pd.DataFrame, path: Path, name_a: str, name_b: str) -> Path:
    colors = {"faster": "#2e8b57", "slower": "#c0392b", "within noise": "#8c8c8c", SHAKY: "#d9b44a",
              OTHER_TIMER: "#7f6fb0"}
    m = m.sort_values(["variant", "mask", "direction", "q_len"]).reset_index(drop=True)
    labels = [f"{r.variant} {r.mask} {r.direction} n={r.q_len}" for r in m.itertuples()]
    fig, ax = new_figure(figsize=(9, max(2.5, 0.24 * len(m) + 1.2)), layout="constrained")
    ax.barh(range(len(m)), m["ratio"] - 1.0, left=1.0, color=[colors[v] for v in m["verdict"]])
    ax.axvline(1.0, color="#333333", lw=1)
    ax.set_xscale("log", base=2)  # 0.5x and 2x sit equally far from 1
    lo, hi = float(m["ratio"].min()), float(m["ratio"].max())
    ticks = [t for t in (0.125, 0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0, 8.0) if lo / 1.3 <= t <= hi * 1.3] or [1.0]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(len(m) - 0.5, -0.5)
    ax.set_yticks(range(len(m)), labels, fontsize=7)
    ax.set_xlabel(f"time ratio B/A  (A = {name_a}, B = {name_b}; < 1 is faster)")
    fig.suptitle("Run comparison: median time ratio per cell (verdict from the IQRs)", fontsize=11)
    handles = [Rectangle((0, 0), 1, 1, color=c, label=v) for v, c in colors.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=4, frameon=False)
    fig.savefig(path, dpi=130)
    return path
