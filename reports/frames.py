"""Run folders -> one tidy DataFrame: one row per (run, variant, case), failed cells kept."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.measure.flops import DIRECTION_FACTOR
from bench.model import row
from bench.model.axes import placed
from bench.model.case import CASE_ADDED, CASE_DEFAULTS, CASE_FIELDS
from bench.runs import judge, store

FACET_COLS = placed(["run", "model", "hardware", "device", "scope", "ffn", "ranks", "dtype", "direction", "mask",
                     "window",
                     "align", "lengths", "mix", "batch", "heads", "kv_heads", "head_dims", "kv"], "facet_after")
# the order every table and chart names its facets in: the run's (run, model, hardware), then each case field's
# but the length (the x axis); head_dims and kv are made of case fields (CASE_FACETS)
RUN_FACETS = ("run", "model", "hardware")
MADE_OF = {"head_dims": ("head_dim", "head_dim_v"), "kv": ("kv_len",)}
CASE_FACETS = tuple(c for f in FACET_COLS if f not in RUN_FACETS for c in MADE_OF.get(f, (f,)))  # as case fields
NUMERIC = [*row.NUMERIC, "compile_ms", "prep_ms", "compile_warm_ms", "step_median_ms", "step_steady_ms",
           "step_prep_ms", "recompiles", "steps"]  # the row's numeric columns, and its extras' setup and step figures
FLAGS = list(row.FLAGS)
DECODE_MAX_Q = 16  # a query this short against a longer cache is decode: drawn against the cache length


def load_runs(run_dirs) -> tuple[pd.DataFrame, list[dict]]:
    """All rows of the given run folders, and each folder's env.json (with 'run' added)."""
    frames, envs = [], []
    for d in run_dirs:
        d = store.require_run(d)
        name = d.resolve().name  # runs/latest is the run it points at
        env = store.read_env(d) | {"run": name, "path": str(d)}
        envs.append(env)
        # a cell measured again (--retry) is its newest row; the file keeps both
        df = with_profile(pd.DataFrame(store.read_current(d)), store.read_rows(d, name=store.PROFILE))
        df["run"] = name
        df["model"] = (env.get("spec") or {}).get("model") or "-"  # sweep --model: the model its shapes are
        devices = env.get("worker_devices") or {}
        if len(set(devices.values())) > 1 and "worker" in df:  # workers on different hardware: never one curve
            df["hardware"] = df["worker"].map(devices)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return tidy(df), envs


def with_profile(df: pd.DataFrame, profiled: list[dict]) -> pd.DataFrame:
    """The share_* columns of ``sweep --profile``'s pass (profile.jsonl) beside their cells."""
    if not profiled or df.empty:
        return df
    keys = ["variant", *CASE_FIELDS]
    prof = pd.DataFrame(profiled).drop_duplicates(keys, keep="last")
    cols = [c for c in prof if c.startswith("share_") or c == "profile_error"]
    df = df.drop(columns=[c for c in cols if c in df])
    for k in keys:  # window is None (NaN) for most masks: merge on a comparable form
        prof[k] = prof[k].astype(object).where(prof[k].notna(), None) if k in prof else None
        df[k] = df[k].astype(object).where(df[k].notna(), None)
    return df.merge(prof[keys + cols], on=keys, how="left")


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for col in ("variant", *CASE_FIELDS, "status", "reason"):  # an empty run still has its columns
        if col not in df:
            df[col] = pd.Series(dtype=object)
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df else np.nan
    for col in CASE_ADDED:  # rows from before the field existed were measured with its default
        if CASE_DEFAULTS[col] is not None:  # pandas 2 refuses fillna(None); a None default is what is there
            df[col] = df[col].fillna(CASE_DEFAULTS[col])
    df["window"] = df["window"].map(lambda w: "-" if pd.isna(w) else str(int(w)))
    # the head dims as --head-dims spells them: 64, or 192/128 with v's apart (MLA)
    df["head_dims"] = ["-" if pd.isna(d) else f"{int(d)}/{int(v)}" if v is not None and not pd.isna(v) else str(int(d))
                       for d, v in zip(df["head_dim"], df["head_dim_v"])]
    # decode (a few new tokens against a longer KV cache): the cache length is the x-axis, the
    # query length the facet; otherwise n is the query length and a cross-attention kv_len a facet
    decode = (df["q_len"] <= DECODE_MAX_Q) & (df["kv_len"] > df["q_len"]) & (df["mix"] == "none")
    df["decode"] = decode
    df["kv"] = np.where(decode, "q=" + df["q_len"].astype(str),
                        np.where((df["kv_len"] == df["q_len"]) | (df["mix"] != "none"), "self",
                                 df["kv_len"].astype(str)))
    df["n"] = np.where(decode, df["kv_len"], df["q_len"]).astype(int)
    # time per real token: a ragged batch of mean length n holds batch x n tokens, as a fixed one does
    df["us_per_token"] = df["median_ms"] * 1e3 / (df["batch"].astype(float) * df["q_len"].astype(float))
    df["status"] = df["status"].fillna("error")
    df["reason"] = df["reason"].fillna("")
    for col in FLAGS:
        df[col] = df[col].map(lambda x: bool(x) if isinstance(x, (bool, np.bool_)) else False) if col in df else False
    # shaky: an ok cell whose figure is not to be trusted as it stands (drawn hollow, starred, weighed down in fits),
    # as bench.runs.judge decides it
    judged = ["status", *FLAGS, *(["visit_se"] if "visit_se" in df else [])]
    df["shaky"] = [judge.shaky(r) for r in df[judged].to_dict("records")] if len(df) else False
    if "round_medians_ms" not in df:
        df["round_medians_ms"] = None
    return df


def with_peaks(df: pd.DataFrame, envs: list[dict]) -> pd.DataFrame:
    """% of peak against the peak each run's env.json holds at its end (the better of the
    measurements at the start and at the end of the sweep); ``peak_unreliable`` where a
    cell still went above it."""
    df = df.copy()
    if "approximate" in df:  # run folders from before approximations went without TFLOP/s
        df.loc[df["approximate"].fillna(False).astype(bool), "tflops"] = np.nan
    peaks = {e["run"]: e.get("peaks_tflops") or {} for e in envs}
    env_of = {e["run"]: e for e in envs}
    df["pct_peak"] = [store.pct_peak(t if pd.notna(t) else None, d, env_of.get(r, {})) for t, r, d in
                      zip(df["tflops"], df["run"], df["dtype"])]
    df["pct_peak"] = pd.to_numeric(df["pct_peak"], errors="coerce")
    above = {(r, d) for r, d, p in zip(df["run"], df["dtype"], df["pct_peak"]) if pd.notna(p) and p > 100.0}
    # from the rows, as env.json's peak_unreliable was at the sweep's end (so an older run whose
    # flag came from an approximation's exact-equivalent rate reads right)
    df["peak_unreliable"] = [(r, d) in above for r, d in zip(df["run"], df["dtype"])]
    # the roofline: arithmetic intensity (FLOPs per byte of the minimum traffic), the
    # bandwidth share, and the share of whichever ceiling binds at that intensity
    bandwidth = {e["run"]: e.get("peak_gbps") for e in envs}
    moved = pd.to_numeric(df.get("bytes"), errors="coerce")
    if "materialised_bytes" in df:  # what a variant writes and reads beyond the minimum (naive: its scores)
        extra = pd.to_numeric(df["materialised_bytes"], errors="coerce") * df["direction"].map(DIRECTION_FACTOR)
        moved = moved + extra.fillna(0.0)
    if "traffic_bytes" in df:  # rows of older folders: the whole traffic, as the variant modelled it
        moved = pd.to_numeric(df["traffic_bytes"], errors="coerce").fillna(moved)
    df["intensity"] = df["flops"] / moved
    gbps = pd.to_numeric(df["gbps"], errors="coerce") if "gbps" in df else pd.Series(np.nan, index=df.index)
    df["pct_bw"] = [100.0 * g / bandwidth[r] if pd.notna(g) and bandwidth.get(r) else np.nan
                    for g, r in zip(gbps, df["run"])]
    roofs, bounds = [], []
    for ai, r, d in zip(df["intensity"], df["run"], df["dtype"]):
        peak, bw = peaks.get(r, {}).get(d), bandwidth.get(r)
        if not (peak and bw and pd.notna(ai)):
            roofs.append(np.nan)
            bounds.append("")
            continue
        memory_roof = ai * bw / 1e3  # TFLOP/s the bandwidth allows at this intensity
        roofs.append(min(peak, memory_roof))
        bounds.append("memory" if memory_roof < peak else "compute")
    df["roof_tflops"] = roofs
    df["bound"] = bounds
    df["pct_roof"] = 100.0 * df["tflops"] / df["roof_tflops"]
    return df


def timed_together(a, b) -> bool:
    """True when rows ``a`` and ``b`` were timed in the same interleaved rounds (one
    ``interleave_id``): only then does round i of one pair with round i of the other.  A cell
    measured again alone (``--retry``, the end-of-sweep re-measurement) has an id of its own."""
    ia, ib = a.get("interleave_id"), b.get("interleave_id")
    return isinstance(ia, str) and ia == ib


def paired_ratio(a, b) -> tuple[float, float, float, bool]:
    """b / a per interleaved round (a, b: rows of one case from one run): the median ratio
    and its spread (min, max over the rounds), and whether it was paired.  Rows not timed
    together, or without matching rounds, fall back to the medians, with the spread from the
    quartiles."""
    ra, rb = a.get("round_medians_ms"), b.get("round_medians_ms")
    if timed_together(a, b) and isinstance(ra, list) and isinstance(rb, list) and len(ra) == len(rb) and len(ra) > 1:
        ratios = sorted(y / x for x, y in zip(ra, rb) if x > 0)
        if ratios:
            return float(np.median(ratios)), ratios[0], ratios[-1], True

    def q(row, key):
        x = row.get(key)
        return row["median_ms"] if x is None or pd.isna(x) else x

    med = b["median_ms"] / a["median_ms"]
    return med, q(b, "q1_ms") / q(a, "q3_ms"), q(b, "q3_ms") / q(a, "q1_ms"), False


def speedups(df: pd.DataFrame, baseline: str | None) -> pd.DataFrame:
    """``speedup`` (baseline time / variant time, the median over the interleaved rounds),
    ``speedup_lo`` and ``speedup_hi`` (its spread), per ok row with an ok baseline row of the
    same case in the same run."""
    df = df.copy()
    df["speedup"] = df["speedup_lo"] = df["speedup_hi"] = np.nan
    if not baseline or df.empty:
        return df
    ok = df[df["status"] == "ok"]
    key = [c for c in ["run", *CASE_FIELDS] if c in df]
    fields = ["median_ms", "q1_ms", "q3_ms", "round_medians_ms", "interleave_id"]
    base = ok[ok["variant"] == baseline]
    # one comparable key per row (window and head_dim_v are NaN for most rows)

    def keys(frame):
        return list(zip(*(frame[c].astype(object).where(frame[c].notna(), None) for c in key)))

    by_case = dict(zip(keys(base), base[[f for f in fields if f in base]].to_dict("records")))
    index, values = [], []
    for i, k, r in zip(ok.index, keys(ok), ok[[f for f in fields if f in ok]].to_dict("records")):
        b = by_case.get(k)
        if b is None:
            continue
        # time ratio variant / baseline -> speedup baseline / variant: invert and swap the ends
        med, lo, hi, _ = paired_ratio(b, r)
        index.append(i)
        values.append((1 / med, 1 / hi, 1 / lo))
    if index:
        df.loc[index, ["speedup", "speedup_lo", "speedup_hi"]] = np.array(values, dtype=float)
    return df


def varying_facets(df: pd.DataFrame) -> list[str]:
    cols = [c for c in FACET_COLS if c in df and df[c].astype(str).nunique() > 1]
    if "kv_heads" in cols and "heads" in cols and (df["kv_heads"] == df["heads"]).all():
        cols.remove("kv_heads")  # plain multi-head attention: kv_heads says what heads says
    return cols


FACET_DEFAULTS = {c: CASE_DEFAULTS[c] for c in CASE_ADDED if c in FACET_COLS} | {"model": "-"}  # unsaid


def constant_facets(df: pd.DataFrame) -> dict:
    return {c: df[c].iloc[0] for c in FACET_COLS if c in df and df[c].astype(str).nunique() == 1
            and FACET_DEFAULTS.get(c) != df[c].iloc[0]}


def natural(value) -> tuple:
    """A sort key that puts numbers in numeric order, also inside text: kv=4096 before kv=16384,
    q=4 before q=16."""
    import re

    return tuple((0, float(part), "") if part.replace(".", "", 1).isdigit() else (1, 0.0, part)
                 for part in re.split(r"(\d+(?:\.\d+)?)", str(value)) if part)


def x_label(df: pd.DataFrame) -> str:
    """What n is on a chart's x-axis: the sequence length, or for decode the KV cache length."""
    decode = df["decode"].astype(bool) if "decode" in df else pd.Series(False, index=df.index)
    if len(decode) and decode.all():
        return "KV cache length (keys)"
    return "sequence length n (tokens)" if not decode.any() else "n: sequence length, or the cache length (decode)"


def facet_groups(df: pd.DataFrame):
    """(label, sub-frame) per facet, in a stable order; the label names what varies."""
    cols = varying_facets(df)
    if not cols:
        yield "all cells", df
        return
    groups = [(k if isinstance(k, tuple) else (k,), g) for k, g in df.groupby(cols, sort=False, dropna=False)]
    for key, g in sorted(groups, key=lambda kg: tuple(natural(v) for v in kg[0])):
        yield ", ".join(str(v) if c == "kv" and str(v).startswith("q=") else f"{c}={v}"  # decode: q=1
                        for c, v in zip(cols, key) if not (c == "window" and v == "-")), g


def facet_labels(df: pd.DataFrame) -> pd.Series:
    """Each row's facet label, as ``facet_groups`` names its group (without grouping)."""
    cols = varying_facets(df)
    if not cols:
        return pd.Series("all cells", index=df.index)
    parts = []
    for c in cols:
        v = df[c].astype(str)
        if c == "kv":
            parts.append(np.where(v.str.startswith("q="), v, "kv=" + v))
        elif c == "window":
            parts.append(np.where(v == "-", "", "window=" + v))
        else:
            parts.append((c + "=" + v).to_numpy())
    return pd.Series([", ".join(p for p in row if p) for row in zip(*parts)], index=df.index)


def ran_here(g: pd.DataFrame) -> pd.DataFrame:
    """Drop variants whose every cell in this facet is 'unsupported' (a mask or direction the
    variant does not declare); they are listed with their reasons elsewhere."""
    keep = g.groupby("variant")["status"].transform(lambda s: not (s == "unsupported").all())
    return g[keep.astype(bool)]
