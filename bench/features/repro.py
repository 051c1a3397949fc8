"""The one command that measures a cell alone, again: its variant and case as flags, the
settings it was measured under (its row's budget, threads, precision), the run's other
settings (rounds, timer, the ceiling) and its plugins, into a fresh folder.  ``status RUN
--repro CELL`` prints it; compare's explanations cite it."""

from __future__ import annotations

import shlex

from bench.model.case import CASE_ADDED, CASE_DEFAULTS
from bench.model.spec import SETTINGS

WORKLOAD_FLAGS = tuple(f for f in CASE_ADDED if f in SETTINGS)  # case fields given by a flag of their own name


def cell_flags(row: dict) -> list[str]:
    """The case of ``row`` as ``sweep`` flags (its default workload fields left out)."""
    mix = row.get("mix") or CASE_DEFAULTS["mix"]
    flags = ["--variants", row["variant"], "--device", row["device"], "--dtypes", row["dtype"],
             "--heads", str(row["heads"]), "--kv-heads", str(row["kv_heads"]), "--head-dims", dims_text(row),
             "--masks", row["mask"], "--directions", row["direction"]]
    if mix != CASE_DEFAULTS["mix"]:  # the mix is the batch, its lengths and its alignment
        flags += ["--batch-mix", mix]
    else:
        flags[6:6] = ["--batch", str(row["batch"]), "--seq-lens", str(row["q_len"])]
        if row["kv_len"] != row["q_len"]:
            flags += ["--kv-lens", str(row["kv_len"])]
    window = row.get("window")
    if window not in (None, "", "-") and window == window:  # a report's frame writes "-" for none
        flags += ["--window", str(int(window))]
    for field in WORKLOAD_FLAGS:  # the later axes, each a setting of its own name
        value = row.get(field) or CASE_DEFAULTS[field]
        if value != CASE_DEFAULTS[field] and not (mix != CASE_DEFAULTS["mix"] and field == "align"):
            flags += ["--" + field.replace("_", "-"), str(value)]
    return flags


def dims_text(row: dict) -> str:
    """A row's head dims as --head-dims spells them: 64, or 192/128."""
    dv = row.get("head_dim_v")
    return f"{int(row['head_dim'])}/{int(dv)}" if dv not in (None, "", "-") and dv == dv else str(row["head_dim"])


def command(row: dict, spec: dict | None = None, out: str | None = None) -> str:
    """``python -m bench sweep ...`` measuring ``row``'s cell alone, under its settings."""
    spec = spec or {}
    flags = cell_flags(row)
    if row.get("budget_ms") is not None:
        flags += ["--budget-ms", f"{float(row['budget_ms']):g}"]
    if row.get("threads"):
        flags += ["--threads", str(int(row["threads"]))]
    if row.get("precision") is not None:
        flags += ["--precision", f"{100 * float(row['precision']):g}"]
    if row.get("heap") == "system":
        flags += ["--heap", "system"]
    for key, flag in (("rounds", "--rounds"), ("timer", "--timer"), ("ceiling_s", "--ceiling-s"),
                      ("timeout", "--timeout")):
        if spec.get(key) is not None and (key != "timer" or spec[key] != "events"):
            value = spec[key]
            flags += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for plugin in spec.get("plugins") or []:
        flags += ["--plugin", plugin]
    flags += ["--out", out or f"runs/repro-{slug(row)}"]
    return shlex.join(["python", "-m", "bench", "sweep", *flags])


def slug(row: dict) -> str:
    """A cell as a folder name."""
    return _slug(row)


def _slug(row: dict) -> str:
    text = f"{row['variant']}-{row['mask']}-{row['direction']}-n{row['q_len']}"
    return "".join(c if c.isalnum() or c in "-." else "_" for c in text)[:80]


def label(row: dict) -> str:
    """A cell in words, as ``status`` lists it."""
    kv = f" kv={row['kv_len']}" if row["kv_len"] != row["q_len"] else ""
    return (f"{row['variant']} {row['dtype']} b={row['batch']} h={row['heads']}/{row['kv_heads']} n={row['q_len']}"
            f"{kv} d={dims_text(row)} {row['mask']} {row['direction']}")
