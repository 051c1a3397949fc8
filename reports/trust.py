"""Whether a report's numbers can be trusted: the trust box's state and its line, the worst
contended cell, and what a folder made by several invocations says about its conditions.  The
decision itself is ``bench.runs.judge.trust``; this module words it for the report."""

from __future__ import annotations

import pandas as pd

from bench.runs import judge


def _unreliable_peaks(ok: pd.DataFrame) -> list[str]:
    """The dtypes whose matmul peak a cell exceeded (frames.with_peaks marks them)."""
    if "peak_unreliable" not in ok:
        return []
    return sorted(set(ok.loc[ok["peak_unreliable"].fillna(False).astype(bool), "dtype"]))


def conclusions(groups, scaling: pd.DataFrame | None, cross: pd.DataFrame | None) -> judge.Conclusions:
    """What the report states (the winners of its overviews, its time exponents, its crossovers)
    and which of those rest on shaky cells (bench.runs.judge.winner_at_risk, exponent_at_risk;
    a crossover is found from clean cells only, so none is at risk)."""
    stated, risky = {"winners": 0, "exponents": 0, "crossovers": 0}, {"winners": 0, "exponents": 0, "crossovers": 0}
    for part in groups or ():
        t = part.overview
        if t is None or t.empty:
            continue
        for m, lo, hi, shaky in zip(t["margin"], t["margin low"], t["margin high"], t["shaky"]):
            said, at_risk = judge.winner_at_risk(m, lo, hi, bool(shaky))
            stated["winners"] += said
            risky["winners"] += at_risk
    if scaling is not None and not scaling.empty and "time_exp" in scaling:
        for r in scaling.to_dict("records"):
            said, at_risk = judge.exponent_at_risk(r["time_exp"], r["time_exp_lo"], r["time_exp_hi"],
                                                   r.get("weighted_down") or "")
            stated["exponents"] += said
            risky["exponents"] += at_risk
    stated["crossovers"] = 0 if cross is None else len(cross)
    return judge.Conclusions(stated, risky)


def run_trust(df, envs, said: judge.Conclusions | None = None) -> judge.Trust:
    """The trust state of the report's rows (``bench.runs.judge.trust``: the one place it is decided);
    ``said``: the report's conclusions, which then decide whether to read it with care."""
    ok = df[df["status"] == "ok"]
    cols = [c for c in ("status", *judge.FLAGS, "visit_se", "reference_skipped", "median_ms", "samples", "number")
            if c in df]
    return judge.trust(df[cols].to_dict("records"), [e["run"] for e in envs if e.get("mixed_env")],
                       _unreliable_peaks(ok), said)


def trust_state(df, envs, said: judge.Conclusions | None = None) -> tuple[str, str, str]:
    """(css class, heading, main reason) of the trust box: clean, read with care, or do not use."""
    t = run_trust(df, envs, said)
    return t.state, t.heading, t.reason


def trust_line(df, envs, lead: bool = True, said: judge.Conclusions | None = None) -> str:
    """One line: can these numbers be trusted?  Counts of ok, noisy and contended cells,
    and whether every dtype's matmul peak held; the main reason is the trust box's heading.
    ``lead``: open with the verdict; without it (under the box's heading, which says it), open
    with the remedies alone when there are some."""
    t = run_trust(df, envs, said)
    ok = df[df["status"] == "ok"]
    loads = "; ".join(f"load average {e.get('loadavg_start', ['?'])[0]} at the start, "
                      f"{(e.get('loadavg_end') or ['?'])[0]} at the end" for e in envs if e.get("loadavg_start"))
    run = envs[0].get("path") if len(envs) == 1 else None  # one run: its own folder in the commands
    care = t.state == "care" and t.shaky
    remedies = "; ".join(judge.remedy(f, run) for f, n in t.counts.items() if n) if care else ""
    opening = f"{t.verdict}: " if lead else (f"remedies: {remedies}. Counts: " if remedies else "")
    text = (f"{opening}{t.ok} ok cells, {t.clean} clean, {t.few_samples} with too few samples for an "
            f"interval, {t.noisy} noisy, {t.contended} contended"
            + (f", {t.throttled} throttled (NVML reported a clock slowdown: throttled_why says which)"
               if t.throttled else "")
            + " (shaky cells are hollow in charts and marked * in tables; fits take every ok cell, by its "
              "weight)")
    if said is not None:
        text += (f"; {said.total} conclusions stated ({', '.join(f'{n} {k}' for k, n in said.stated.items())}), "
                 f"{said.risky} resting on shaky cells")
    worst = worst_contended(ok)
    if worst:
        text += f"; worst: {worst}"
    if t.unchecked:
        text += (f"; {t.unchecked} ok cells timed unchecked (their float64 reference could not be computed: "
                 f"reference_skipped says why)")
    bad_peaks = _unreliable_peaks(ok)
    if bad_peaks:
        text += f"; the matmul peak is unreliable for {', '.join(bad_peaks)} (marked † in % of peak)"
    heap = heap_words(envs)
    if heap:
        text += f"; {heap}"
    mixed = [f"{e['run']}: {', '.join(e['mixed_env'])}" for e in envs if e.get("mixed_env")]
    if mixed:
        text += "; MIXED RUN, resumed on a machine that differs (" + "; ".join(mixed) + ")"
    history = "; ".join(h for e in envs if (h := invocations(e)))
    return text + (f"; {history}" if history else f"; {loads}" if loads else "") + "."


HEAP_WORDS = {
    "fixed": "CPU heap fixed (each worker's glibc mmap threshold fixed and its heap never trimmed, so every worker "
             "times in one state; a default process can pay page faults on large buffers that these figures do "
             "not: selfcheck prints both, bench/measure/README.md)",
    "system": "CPU heap system (glibc's own, as a default process has: a large buffer's page faults are in the "
              "figures)",
}


def heap_words(envs) -> str:
    """What the trust box says of the C heap the CPU runs' workers timed under (--heap; a run from
    before the setting: fixed, the only heap its workers had)."""
    heaps = sorted({e.get("heap") or "fixed" for e in envs if e.get("device") == "cpu"})
    if len(heaps) > 1:
        return "CPU heaps differ between the runs (" + ", ".join(f"{e.get('run')}: {e.get('heap') or 'fixed'}"
                                                                  for e in envs if e.get("device") == "cpu") + ")"
    return HEAP_WORDS.get(heaps[0], "") if heaps else ""


def worst_contended(ok: pd.DataFrame) -> str:
    """The contended cell timed with the smallest share of its cores, and what it measured."""
    bad = ok[ok["contended"]] if "contended" in ok else ok.iloc[0:0]
    if bad.empty:
        return ""
    rows = bad.to_dict("records")
    r = min(rows, key=judge.severity)
    return f"{r['variant']} at n={int(r['n'])} ({r.get('contended_why') or 'contended'})"


CONDITIONS_DIFFER = (1.0, 0.2)  # load averages further apart than this, or peaks by more than this share


def invocations(env: dict) -> str:
    """A run folder made by several invocations (a resume, a retry): each one's load and
    peak, and whether the folder mixes conditions; '' for a folder of one invocation."""
    history = [h for h in env.get("history") or [] if isinstance(h, dict)]
    if len(history) < 2:
        return ""
    parts, loads, peaks = [], [], []
    for i, h in enumerate(history, start=1):
        start, end = (h.get("loadavg_start") or [None])[0], (h.get("loadavg_end") or [None])[0]
        peak = h.get("peaks_end") or {}
        parts.append(f"#{i} load {start if start is not None else '?'}->{end if end is not None else '?'}"
                     + (", peak " + ", ".join(f"{d} {v:.3g}" for d, v in peak.items()) if peak else ""))
        loads += [x for x in (start, end) if x is not None]
        peaks += [v for v in peak.values() if v]
    text = f"{env.get('run', 'this run')}: {len(history)} invocations ({'; '.join(parts)})"
    load_gap, peak_gap = CONDITIONS_DIFFER
    if (loads and max(loads) - min(loads) > load_gap) or (peaks and max(peaks) > (1 + peak_gap) * min(peaks)):
        text += ", which ran under different conditions: the folder mixes them"
    return text
