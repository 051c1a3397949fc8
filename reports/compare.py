"""``python -m bench compare RUN_A RUN_B``: B/A per matching cell, with a verdict that says its
confidence.

Every row keeps its raw samples, so each cell's B/A is the ratio of its two medians with a
bootstrap 95% interval (``bench.measure.stats.ratio_evidence``).  A cell is faster or slower when
the change beyond a margin (``judge.COMPARE_MARGIN``, 5%: two runs of one build drift by a few
percent) is significant after Benjamini-Hochberg's false-discovery control across the cells of
the comparison (``judge.COMPARE_FDR``, 5%); same when its interval lies within the margin either
way; unsure otherwise.  A cell shaky in either run is 'shaky', and one timed with different
timers in A and B (CUDA events against CUDA graphs) 'other timer': both are counted apart and
never a regression.  Rows without samples (older folders) fall back to their quartiles: faster
or slower when the interquartile ranges are apart, else unsure.  --fail-on-regression PCT flags a
slower cell whose interval's lower end is more than PCT% above 1 (quartiles: B's q1 over A's q3).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullFormatter

from bench.measure.stats import benjamini_hochberg, ratio_evidence, visit_evidence
from bench.model import row
from bench.runs import judge
from reports.charts import new_figure
from reports.frames import load_runs, with_peaks

ENV_KEYS = ("device", "device_name", "torch", "xformers", "cuda", "threads")


SHAKY = "shaky"  # the verdict of a cell shaky in either run: counted apart, never better or worse
OTHER_TIMER = "other timer"  # timed with different timers in A and B (CUDA events with a cold L2 against CUDA
# graphs, say): the times measure different things, so the cell is counted apart and never a regression
VERDICTS = ("faster", "same", "slower", "unsure", SHAKY, OTHER_TIMER)


def verdict(a: dict, b: dict) -> str:
    """The quartiles' verdict (rows without samples): apart, or unsure."""
    if b["q1_ms"] > a["q3_ms"]:
        return "slower"
    if b["q3_ms"] < a["q1_ms"]:
        return "faster"
    return "unsure"


def _samples(x) -> list | None:
    return list(x) if isinstance(x, (list, tuple)) and len(x) >= 2 else None


@dataclass(frozen=True)
class Drift:
    """This machine's between-run drift, one sd of a run's log median (bench.runs.drift, from an
    A/A ab): ``run``, what every cell of a run shares (the machine's state, the process), and
    ``cell``, what each cell moves by on top of it."""
    cell: float
    run: float


def _relative(e, shift: float, drift: Drift, margin: float):
    """A cell's evidence relative to the whole run's shift: log(B / A) - shift, its bootstrap spread
    widened by the cell's own drift (twice: two runs), as a normal test beyond ``margin``."""
    from statistics import NormalDist

    from bench.measure.stats import RatioEvidence

    z = NormalDist()
    rel = math.log(e.ratio) - shift
    se_boot = (math.log(e.hi) - math.log(e.lo)) / (2 * 1.959963984540054) if e.hi > e.lo > 0 else 0.0
    se = math.hypot(se_boot, drift.cell * math.sqrt(2))
    m = math.log1p(margin)
    return RatioEvidence(e.ratio, math.exp(shift + rel - 1.96 * se), math.exp(shift + rel + 1.96 * se),
                         1.0 - z.cdf((rel - m) / se), z.cdf((rel + m) / se), e.n_a, e.n_b)


RUN_Z = 3.0  # the run-level shift is one judgement that speaks for every cell at once: called only beyond 3 sd
# of the run-level drift (a false one would call them all changed; at 1.96 sd, one A/A pair in 20 did)


def run_shift(log_ratios: list[float], drift: Drift, margin: float) -> dict:
    """The whole run's shift (the median log ratio over the cells) and what it says: beyond RUN_Z sd
    of the run-level drift (twice: two runs) and the margin, B as a whole is slower or faster; else
    the machine's state between the runs can explain it."""
    from statistics import median

    shift = median(log_ratios)
    se = drift.run * math.sqrt(2)
    lo, hi = math.exp(shift - RUN_Z * se), math.exp(shift + RUN_Z * se)
    verdict = ("slower" if lo > 1 + margin else "faster" if hi < 1 / (1 + margin) else
               "same" if lo >= 1 / (1 + margin) and hi <= 1 + margin else "unsure")
    return {"ratio": math.exp(shift), "lo": lo, "hi": hi, "verdict": verdict, "cells": len(log_ratios)}


def compare_frames(a: pd.DataFrame, b: pd.DataFrame, margin: float = judge.COMPARE_MARGIN,
                   fdr: float = judge.COMPARE_FDR, drift: Drift | None = None) -> pd.DataFrame:
    """B/A per matching ok cell.  ``drift``: this machine's between-run drift (bench.runs.drift,
    from an A/A ab).  With it, what every cell shares (the median log ratio) is the whole run's
    shift, judged against the run-level drift (``m.attrs["shift"]``), and each cell is judged
    relative to it, against its own drift: a cell is slower when it moved more than the run did.
    Without it no cell is called faster or slower, only same or unsure (judge.between_runs)."""
    keys = list(row.IDENTITY)
    cols = [*row.SPREAD, "status", "shaky", "share", "timer", "samples_ms", "visit_medians_ms"]
    a, b = (x.assign(shaky=x["shaky"] if "shaky" in x else False, share=_shares(x),
                     timer=x["timer"].fillna("") if "timer" in x else "",
                     samples_ms=x["samples_ms"] if "samples_ms" in x else None,
                     visit_medians_ms=x["visit_medians_ms"] if "visit_medians_ms" in x else None) for x in (a, b))
    a = a[a["status"] == "ok"][keys + cols]  # load_runs keeps each cell's current row only
    b = b[b["status"] == "ok"][keys + cols]
    m = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if m.empty:
        return m
    m["ratio"] = m["median_ms_b"] / m["median_ms_a"]
    m["shaky"] = m["shaky_a"].astype(bool) | m["shaky_b"].astype(bool)
    m["other_timer"] = m["timer_a"].astype(str) != m["timer_b"].astype(str)
    evidence, visited = {}, set()
    for i, r in m.iterrows():
        if r["other_timer"]:
            continue
        va, vb = _samples(r["visit_medians_ms_a"]), _samples(r["visit_medians_ms_b"])
        if va and vb:  # visits in fresh processes: the runs measured their own between-run spread
            evidence[i] = visit_evidence(va, vb, margin)
            visited.add(i)
            continue
        sa, sb = _samples(r["samples_ms_a"]), _samples(r["samples_ms_b"])
        if sa and sb:
            seed = zlib.crc32(repr(tuple(r[k] for k in keys)).encode())  # the same cell, the same draws
            evidence[i] = ratio_evidence(sa, sb, margin, seed=seed)
    m.attrs["visited"] = len(visited)
    clean = {i for i in evidence if not m.loc[i, "shaky"]}  # a shaky cell's evidence is read apart (_beyond_load)
    within = {i: e for i, e in evidence.items() if i not in visited and i in clean}  # one process per cell and run
    if drift is not None and len(within) >= 3:
        shift = run_shift([math.log(e.ratio) for e in within.values()], drift, margin)
        m.attrs["shift"] = shift
        evidence |= {i: _relative(e, math.log(shift["ratio"]), drift, margin) for i, e in within.items()}
    elif drift is not None:  # too few cells for a shift of their own
        evidence |= {i: _relative(e, 0.0, drift, margin) for i, e in within.items()}
    shaky_evidence = {i: e for i, e in evidence.items() if i not in clean}
    shaky_evidence |= {i: _relative(e, 0.0, drift, margin) for i, e in shaky_evidence.items()
                       if i not in visited and drift is not None}
    judged = [i for i in evidence if i in clean]
    rejected, qvalues = benjamini_hochberg([evidence[i].p for i in judged], fdr)
    m["ratio_lo"] = m["ratio_hi"] = m["p"] = m["q"] = float("nan")
    verdicts = []
    for i, r in m.iterrows():
        if r["other_timer"]:
            verdicts.append(OTHER_TIMER)
        elif r["shaky"]:
            e = shaky_evidence.get(i)
            if e is not None:
                m.loc[i, ["ratio_lo", "ratio_hi", "p"]] = [e.lo, e.hi, e.p]
            verdicts.append(_beyond_load(r, e, margin, drift is not None or i in visited))
        elif i in evidence:
            k = judged.index(i)
            e = evidence[i]
            m.loc[i, ["ratio_lo", "ratio_hi", "p", "q"]] = [e.lo, e.hi, e.p, qvalues[k]]
            called = judge.compare_verdict(e, rejected[k], margin)
            verdicts.append(called if i in visited else
                            judge.with_run_shift(judge.between_runs(called, drift), m.attrs.get("shift")))
        else:
            verdicts.append(judge.between_runs(verdict({"q1_ms": r["q1_ms_a"], "q3_ms": r["q3_ms_a"]},
                                                       {"q1_ms": r["q1_ms_b"], "q3_ms": r["q3_ms_b"]}), drift))
    m["verdict"] = verdicts
    # a cell without samples has its quartiles; between two single processes they also move by the drift
    # (the cell's and the run's, in each of the two runs)
    widen = math.exp(1.96 * math.sqrt(2) * math.hypot(drift.cell, drift.run)) if drift is not None else 1.0
    factor = pd.Series([1.0 if i in visited else widen for i in m.index], index=m.index, dtype=float)
    lo = m["ratio_lo"].where(m["ratio_lo"].notna(), m["q1_ms_b"] / m["q3_ms_a"] / factor)
    hi = m["ratio_hi"].where(m["ratio_hi"].notna(), m["q3_ms_b"] / m["q1_ms_a"] * factor)
    bounds = [judge.load_bounded(x, y, sa, sb) for x, y, sa, sb in zip(lo, hi, _share(m["share_a"]),
                                                                       _share(m["share_b"]))]
    m["bound_lo"] = [x for x, _ in bounds]  # the interval widened by what each side's load can explain
    m["bound_hi"] = [y for _, y in bounds]
    m["slowdown_beyond_noise"] = m["bound_lo"] - 1.0
    return m


def _shares(x: pd.DataFrame) -> list:
    """Each row's load share (judge.load_share): 1 clean, the share of its cores for a contended one."""
    if x.empty:
        return []
    fields = [c for c in ("status", *row.FLAGS, "visit_se", "cpu_util", "other_cpu") if c in x]
    return [judge.load_share(r) for r in x[fields].to_dict("records")]


def _share(column) -> list:
    return [None if v is None or v != v else float(v) for v in column]


def _beyond_load(r, e, margin: float, can_call: bool) -> str:
    """A shaky cell's verdict: slower or faster where its change is larger than the two runs' load
    can explain (judge.load_bounded on its interval, or its quartiles without one), else shaky.
    ``can_call``: the interval holds the between-run drift (visits, or a drift to judge against)."""
    if e is not None:
        lo, hi = e.lo, e.hi
    else:
        lo, hi = r["q1_ms_b"] / r["q3_ms_a"], r["q3_ms_b"] / r["q1_ms_a"]
    low, high = judge.load_bounded(lo, hi, *(_share([r["share_a"], r["share_b"]])))
    if can_call and low > 1 + margin:
        return "slower"
    if can_call and high < 1 / (1 + margin):
        return "faster"
    return SHAKY


def evidence_line(r) -> str:
    """One cell's verdict with what supports it."""
    label = f"{r['variant']} {r['dtype']} {r['mask']} {r['direction']} n={r['q_len']}"
    text = f"{label}: {r['verdict']}, B/A {r['ratio']:.3g}"
    visits = [_samples(r.get(f"visit_medians_ms_{x}")) for x in "ab"]
    if all(visits) and r.get("ratio_lo") == r.get("ratio_lo") and r.get("ratio_lo") is not None:
        text += (f" (95% interval {r['ratio_lo']:.3g}-{r['ratio_hi']:.3g}, p {r['p']:.2g}, q {r['q']:.2g}; "
                 f"A {r['median_ms_a']:.4g} ms over {len(visits[0])} visits, B {r['median_ms_b']:.4g} ms over "
                 f"{len(visits[1])})")
    elif r.get("ratio_lo") == r.get("ratio_lo") and r.get("ratio_lo") is not None:
        text += (f" (95% interval {r['ratio_lo']:.3g}-{r['ratio_hi']:.3g}, p {r['p']:.2g}, q {r['q']:.2g}; "
                 f"A {r['median_ms_a']:.4g} ms of {len(r['samples_ms_a'])} samples, B {r['median_ms_b']:.4g} ms of "
                 f"{len(r['samples_ms_b'])})")
    else:
        text += (f" (quartiles: A {r['q1_ms_a']:.4g}-{r['q3_ms_a']:.4g} ms, B {r['q1_ms_b']:.4g}-"
                 f"{r['q3_ms_b']:.4g} ms)")
    return text


def env_differences(env_a: dict, env_b: dict) -> list[str]:
    return [f"{k}: {env_a.get(k)} vs {env_b.get(k)}" for k in ENV_KEYS if env_a.get(k) != env_b.get(k)]


def compare_runs(run_a, run_b, out: Path | None = None, fail_pct=None, margin: float = judge.COMPARE_MARGIN,
                 fdr: float = judge.COMPARE_FDR):
    """Returns (table, regressions, warnings, chart path, trust lines of A and B).
    ``fail_pct``: a percentage (the median rule) or (metric, percentage) with metric
    'median' (B's q1 over A's q3, beyond noise) or 'min' (B's fastest sample over A's).  With it,
    the table's ``gate`` column says per cell ``regression``, ``clear`` or ``unjudged``
    (``gate_cells``).  Until an A/A has calibrated this machine, single-process cells are judged
    against the largest drift measured on its kind of machine (``m.attrs["drift"]["default"]``)."""
    from bench.runs import drift as calibration
    from reports.trust import trust_line

    da, (env_a,) = load_runs([run_a])
    db, (env_b,) = load_runs([run_b])
    known = calibration.lookup(env_a) if calibration.key(env_a) == calibration.key(env_b) else None
    if known is None and env_a.get("device") == env_b.get("device"):
        known = calibration.largest(env_a)
    m = compare_frames(da, db, margin, fdr, drift=Drift(known["cell"], known["run"]) if known else None)
    m.attrs["drift"] = known
    warnings = env_differences(env_a, env_b)
    trust = [trust_line(with_peaks(da, [env_a]), [env_a]), trust_line(with_peaks(db, [env_b]), [env_b])]
    regressions = m.iloc[0:0]
    if fail_pct is not None and not m.empty:
        m["gate"] = gate_cells(m, fail_pct)
        regressions = m[m["gate"] == "regression"]
    chart = None
    if out is not None and not m.empty:
        out.mkdir(parents=True, exist_ok=True)
        m.to_csv(out / "compare.csv", index=False)
        chart = _chart(m, out / "compare.png", Path(run_a).name, Path(run_b).name)
    return m, regressions, warnings, chart, trust


def gate_cells(m: pd.DataFrame, fail_pct) -> list[str]:
    """--fail-on-regression's word on each matched cell (judge.gate_verdict): ``regression``, ``clear``
    or ``unjudged``.  The median rule reads the cell's interval widened by its load (a shaky cell whose
    change is larger than its load could explain is judged); the min rule B's fastest sample over A's,
    bounded the same way.  A cell timed with another timer is never judged."""
    metric, pct = fail_pct if isinstance(fail_pct, tuple) else ("median", float(fail_pct))
    gate = pct / 100.0
    out = []
    for _, r in m.iterrows():
        if r["other_timer"]:
            out.append("unjudged")
            continue
        if metric == "min":
            ratio = r["min_ms_b"] / r["min_ms_a"]
            lo, hi = judge.load_bounded(ratio, ratio, *_share([r["share_a"], r["share_b"]]))
            out.append("regression" if lo - 1.0 > gate else judge.gate_verdict("", lo, hi, gate))
            continue
        if not _can_clear(m, r):  # a single process's own interval says nothing of a rerun
            out.append("unjudged")
            continue
        out.append(judge.gate_verdict(r["verdict"], r["bound_lo"], r["bound_hi"], gate))
    return out


def _can_clear(m: pd.DataFrame, r) -> bool:
    """Whether the cell's interval holds what a rerun would see: its runs' visits, or a drift it was
    judged against (a single process's own interval, uncalibrated, clears nothing)."""
    visits = all(_samples(r.get(f"visit_medians_ms_{x}")) for x in "ab")
    return visits or m.attrs.get("drift") is not None


COMPARE_COLORS = {"faster": "#2e8b57", "slower": "#c0392b", "same": "#8c8c8c", "unsure": "#b0b0b0",
                  SHAKY: "#d9b44a", OTHER_TIMER: "#7f6fb0"}
COMPARE_COLUMNS = 4  # panels across: one per variant, however many cells each has


def _chart(m: pd.DataFrame, path: Path, name_a: str, name_b: str) -> Path:
    """B/A per cell with its interval (the bootstrap 95% interval of the ratio of medians; the
    quartiles' spread where the rows hold no samples), one panel per variant with n across and a
    line per mask and direction: its size follows the variants, not the cells."""
    import math

    m = m.sort_values(["variant", "mask", "direction", "q_len"]).reset_index(drop=True)
    lo = m["ratio_lo"].where(m["ratio_lo"].notna(), m["q1_ms_b"] / m["q3_ms_a"])
    hi = m["ratio_hi"].where(m["ratio_hi"].notna(), m["q3_ms_b"] / m["q1_ms_a"])
    m = m.assign(lo=lo.clip(upper=m["ratio"]), hi=hi.clip(lower=m["ratio"]))
    variants = sorted(m["variant"].unique())
    cols = min(COMPARE_COLUMNS, len(variants))
    rows = math.ceil(len(variants) / cols)
    fig, axes = new_figure(rows, cols, figsize=(3.3 * cols + 0.6, 2.7 * rows + 1.3), squeeze=False, sharey=True,
                           layout="constrained")
    for ax in axes.flat[len(variants):]:
        ax.set_axis_off()
    series = sorted({(r.mask, r.direction) for r in m.itertuples()})
    markers = {key: "osD^v<>phX*"[i % 11] for i, key in enumerate(series)}
    lo_all, hi_all = float(m["lo"].min()), float(m["hi"].max())
    for ax, name in zip(axes.flat, variants):
        g = m[m["variant"] == name]
        for key, s in g.groupby(["mask", "direction"], sort=True):
            ax.plot(s["q_len"], s["ratio"], color="#999999", lw=0.8, zorder=1)
            ax.errorbar(s["q_len"], s["ratio"], yerr=[s["ratio"] - s["lo"], s["hi"] - s["ratio"]], fmt="none",
                        ecolor="#555555", elinewidth=0.8, capsize=2, zorder=2)
            ax.scatter(s["q_len"], s["ratio"], c=[COMPARE_COLORS[v] for v in s["verdict"]], marker=markers[key],
                       s=30, zorder=3, edgecolors="#333333", linewidths=0.4)
        ax.axhline(1.0, color="#333333", lw=0.9)
        ax.axhspan(1 / (1 + judge.COMPARE_MARGIN), 1 + judge.COMPARE_MARGIN, color="#eeeeee", zorder=0)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ns = sorted(g["q_len"].unique())
        ax.set_xticks(ns, [str(int(n)) for n in ns], fontsize=7)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("n", fontsize=8)
    ticks = [t for t in (0.125, 0.25, 0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0, 4.0, 8.0)
             if lo_all / 1.15 <= t <= hi_all * 1.15] or [1.0]
    for ax in axes[:, 0]:
        ax.set_yticks(ticks, [f"{t:g}x" for t in ticks], fontsize=7)
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("time ratio B/A (< 1: B faster)", fontsize=8)
    axes.flat[0].set_ylim(min(ticks[0], lo_all) / 1.1, max(ticks[-1], hi_all) * 1.1)
    fig.suptitle(f"Run comparison, B/A per cell with its 95% interval (A = {name_a}, B = {name_b}; shaded: within "
                 f"the {100 * judge.COMPARE_MARGIN:.0f}% margin)", fontsize=10)
    handles = [Rectangle((0, 0), 1, 1, color=c, label=v) for v, c in COMPARE_COLORS.items()
               if v in set(m["verdict"])]
    handles += [Line2D([], [], color="#555555", marker=mk, ls="none", label=f"{mask}, {d}")
                for (mask, d), mk in markers.items()]
    fig.legend(handles=handles, fontsize=8, loc="outside lower center", ncol=min(6, len(handles)), frameon=False)
    fig.savefig(path, dpi=100)
    return path
