"""Run folders -> one tidy DataFrame: one row per (run, variant, case), failed cells kept."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench import store

FACET_COLS = ["device", "dtype", "direction", "mask", "window", "batch", "heads", "kv_heads",
              "head_dim", "kv"]
NUMERIC = ["median_ms", "iqr_ms", "q1_ms", "q3_ms", "min_ms", "mean_ms", "samples", "peak_mem_bytes",
           "flops", "tflops", "pct_peak", "max_abs_err", "grad_max_abs_err", "setup_ms", "compile_ms"]


def load_runs(run_dirs) -> tuple[pd.DataFrame, list[dict]]:
    """All rows of the given run folders, and each folder's env.json (with 'run' added)."""
    frames, envs = [], []
    for d in run_dirs:
        d = store.require_run(d)
        env = store.read_env(d) | {"run": d.name, "path": str(d)}
        envs.append(env)
        df = pd.DataFrame(store.read_rows(d))
        df["run"] = d.name
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return tidy(df), envs


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for col in NUMERIC:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df else np.nan
    df["window"] = df["window"].map(lambda w: "-" if pd.isna(w) else str(int(w)))
    df["kv"] = np.where(df["kv_len"] == df["q_len"], "self", df["kv_len"].astype(str))
    df["n"] = df["q_len"].astype(int)
    df["status"] = df["status"].fillna("error")
    df["reason"] = df["reason"].fillna("")
    return df


def varying_facets(df: pd.DataFrame) -> list[str]:
    return [c for c in FACET_COLS if c in df and df[c].astype(str).nunique() > 1]


def constant_facets(df: pd.DataFrame) -> dict:
    return {c: df[c].iloc[0] for c in FACET_COLS if c in df and df[c].astype(str).nunique() == 1}


def facet_groups(df: pd.DataFrame):
    """(label, sub-frame) per facet, in a stable order; the label names what varies."""
    cols = varying_facets(df)
    if not cols:
        yield "all cells", df
        return
    for key, g in df.groupby(cols, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        yield ", ".join(f"{c}={v}" for c, v in zip(cols, key) if not (c == "window" and v == "-")), g


def ran_here(g: pd.DataFrame) -> pd.DataFrame:
    """Drop variants whose every cell in this facet is 'unsupported' (a mask or direction the
    variant does not declare); they are listed with their reasons elsewhere."""
    keep = g.groupby("variant")["status"].transform(lambda s: not (s == "unsupported").all())
    return g[keep.astype(bool)]
