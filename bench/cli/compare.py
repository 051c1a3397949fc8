"""``python -m bench compare A B``: the B/A time ratio of every matching cell, with a verdict
against noise, and a regression gate for CI."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.errors import UsageError
from bench.model import row
from bench.runs import judge


def _pct(text: str) -> float:
    try:
        value = float(str(text).removesuffix("%"))
    except ValueError:
        value = float("nan")
    if not 0 <= value < 100:
        raise UsageError(f"a percentage from 0 to 100 (e.g. 5), got {text!r}")
    return value / 100.0


def parse_regression(text: str | None) -> tuple[str, float] | None:
    """``--fail-on-regression``: ``PCT``, ``PCT%`` or ``METRIC:PCT%`` (metric median or min)."""

    if text is None:
        return None
    metric, _, pct = str(text).rpartition(":")
    metric = metric or "median"
    try:
        value = float(pct.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if metric not in ("median", "min") or not (value >= 0 and value < float("inf")):
        raise UsageError(f"--fail-on-regression takes PCT, PCT% or METRIC:PCT% with METRIC median or min and "
                         f"PCT a number >= 0 (e.g. median:5%), got {text!r}")
    return metric, value


def command(args):
    from bench.runs.store import require_run, writable_dir
    from reports.compare import compare_runs

    rule = parse_regression(args.fail_on_regression)
    if args.explain is not None and not args.explain.strip():
        raise UsageError("--explain takes words that name one cell, e.g. 'naive n=1024 causal fwd'; got nothing")
    require_run(args.run_b)
    out = writable_dir(args.out if args.out else Path(args.run_b) / "compare")
    m, regressions, warnings, chart, trust = compare_runs(args.run_a, args.run_b, out, rule, args.margin, args.fdr)
    for name, line in zip("AB", trust):
        print(f"trust {name}: {line}")
    for w in warnings:
        print(f"warning: the environments differ: {w}", file=sys.stderr)
    if m.empty:
        if args.explain is not None:
            raise UsageError(f"--explain {args.explain!r}: the two runs have no matching ok cell to explain (no cell "
                             f"has the same variant and case, with status ok, in both)")
        print("no matching ok cells between the two runs: no cell has the same variant and case, "
              "with status ok, in both", file=sys.stderr)
        return judge.GATE_EXIT["no match"] if rule else 0
    if args.explain is not None:
        return _explain(m, args)
    shaky, other = _print_verdicts(m, args, chart)
    _print_drift(m)
    if other:
        pairs = sorted({f"{a} in A, {b} in B" for a, b in zip(m["timer_a"], m["timer_b"]) if a != b})
        print(f"warning: {other} matching cell(s) were timed with different timers ({'; '.join(pairs)}): their "
              f"times measure different things and are not judged", file=sys.stderr)
    return _gate(m, regressions, rule, shaky, args.strict_trust)


def _print_verdicts(m, args, chart) -> tuple[int, int]:
    """Each matching cell's line and the counts of the verdicts; returns the shaky cells and those
    timed with another timer."""
    from tabulate import tabulate

    cols = ["variant", "dtype", "mask", "direction", "q_len", "median_ms_a", "median_ms_b", "ratio", "ratio_lo",
            "ratio_hi", "q", "verdict"]
    print(tabulate(m[cols], headers=["variant", "dtype", "mask", "dir", "n", "A ms", "B ms", "B/A", "95% lo",
                                     "95% hi", "q", "verdict"], showindex=False, floatfmt=".4g"))
    counts = m["verdict"].value_counts()
    shaky = int(counts.get("shaky", 0))
    other = int(counts.get("other timer", 0))
    apart = f", Other timer {other}" if other else ""
    print(f"Better {counts.get('faster', 0)}, Same {counts.get('same', 0)}, Worse {counts.get('slower', 0)}, "
          f"Unsure {counts.get('unsure', 0)}, Shaky {shaky}{apart} (of {len(m)} matching cells; faster or slower: a "
          f"change beyond {100 * args.margin:g}% at a false-discovery rate of {100 * args.fdr:g}%; chart: {chart})")
    return shaky, other


def _print_drift(m) -> None:
    """What the cells were judged against: each run's visits, or this machine's calibrated
    between-run drift and the run's own shift, or nothing (uncalibrated: no cell is called)."""
    known = m.attrs.get("drift")
    visited = m.attrs.get("visited", 0)
    if visited:
        unsure = int((m["verdict"] == "unsure").sum())
        print(f"note: {visited} of {len(m)} cells are judged from each run's visits (--visits: a cell timed in "
              f"several fresh processes, so its interval holds the between-run drift)"
              + ("" if visited == len(m) else "; the others, timed in one process per run, as below")
              + (f". {unsure} unsure: a change inside the runs' intervals; `python -m bench ab A_TREE B_TREE <the "
                 f"sweep's flags>` measures both builds in turns and finds smaller changes" if unsure else ""),
              file=sys.stderr)
    if visited == len(m):
        return
    if known is not None and known.get("default"):
        print(f"note: this machine's between-run drift is not calibrated: cells timed in one process per run are "
              f"judged against the largest drift measured on its kind of machine ({known['measured on']}: "
              f"{100 * known['run']:.0f}% for a run as a whole, {100 * known['cell']:.0f}% more for each cell), "
              f"which only a large change passes; `python -m bench ab . . <the sweep's flags>` (an A/A) calibrates "
              f"compare here, and `python -m bench ab A_TREE B_TREE <flags>` measures both builds in turns",
              file=sys.stderr)
        return
    if known is None:  # cells timed in one process per run: a calibration decides
        print("note: two separate runs differ by what changed between them (the process, the minute, the "
              "machine's load) as well as by the build; this machine's between-run drift is not calibrated, so no "
              "cell is called faster or slower. To tell: `python -m bench ab A_TREE B_TREE <the sweep's flags>` "
              "measures both builds in turns; `python -m bench ab . . <flags>` (an A/A) calibrates compare here.",
              file=sys.stderr)
        return
    shift = m.attrs.get("shift")
    print(f"note: between-run drift on this machine (an A/A ab of {known['cells']} cells x {known['repeats']} "
          f"repeats): {100 * known['run']:.1f}% for a run as a whole, {100 * known['cell']:.1f}% more for each "
          f"cell; each cell is judged against the run's own shift", file=sys.stderr)
    if shift:
        print(f"the run as a whole: B/A {shift['ratio']:.3g} over {shift['cells']} cells (within 3 sd of the "
              f"run-level drift: {shift['lo']:.3g}-{shift['hi']:.3g}): {shift['verdict']}"
              + (" (the machine's state between the runs can explain it)" if shift["verdict"] == "unsure" else ""))


def _gate(m, regressions, rule, shaky: int, strict_trust: bool) -> int:
    """The exit code (judge.GATE_EXIT): 1 for shaky cells under --strict-trust or a regression past the
    rule; with a rule, 4 when no judged cell regressed but some matched cells could not be judged
    (shaky within what their load explains, timed with another timer, or an interval that reaches past
    the rule), 0 only when every matched cell was judged; 0 without a rule."""
    if shaky and strict_trust:
        print(f"strict trust: {shaky} matching cell(s) are shaky (short of samples, contended or throttled) in A or "
              f"B; re-measure them (sweep --resume RUN --retry shaky) before comparing", file=sys.stderr)
        return 1
    if not rule:
        return 0
    from reports.compare import evidence_line

    if len(regressions):
        beyond = "beyond noise and load" if rule[0] == "median" else "in their fastest sample"
        print(f"{len(regressions)} cell(s) slower by more than {rule[1]:g}% {beyond} ({rule[0]}):", file=sys.stderr)
        for _, r in regressions.iterrows():
            print(f"  {evidence_line(r)}", file=sys.stderr)
        return judge.GATE_EXIT["regression"]
    unjudged = m[m["gate"] == "unjudged"]
    if len(unjudged):
        print(f"gate: {len(unjudged)} of {len(m)} matched cell(s) could not be judged against {rule[1]:g}% "
              f"(exit {judge.GATE_EXIT['unjudged']}: no judged cell regressed): {_unjudged_why(m, unjudged)}",
              file=sys.stderr)
        for _, r in unjudged.head(8).iterrows():
            print(f"  {evidence_line(r)}", file=sys.stderr)
        return judge.GATE_EXIT["unjudged"]
    print(f"gate: all {len(m)} matched cells judged, none slower by more than {rule[1]:g}% ({rule[0]})",
          file=sys.stderr)
    return judge.GATE_EXIT["clear"]


def _unjudged_why(m, unjudged) -> str:
    """Why the unjudged cells were not judged, by kind, with what would judge them."""
    why = []
    other = int(unjudged["other_timer"].sum())
    shaky = int((unjudged["verdict"] == "shaky").sum())
    single = m.attrs.get("drift") is None and int((~unjudged["other_timer"] & (unjudged["verdict"] != "shaky")).sum())
    wide = len(unjudged) - other - shaky - (single or 0)
    if shaky:
        why.append(f"{shaky} shaky within what their load could explain (sweep --resume RUN --retry shaky)")
    if other:
        why.append(f"{other} timed with another timer")
    if single:
        why.append(f"{single} timed in one process per run on a machine whose drift is not calibrated "
                   f"(`python -m bench ab . . <the sweep's flags>` calibrates it)")
    if wide:
        why.append(f"{wide} whose interval reaches past the rule without being a regression (more --visits or "
                   f"`python -m bench ab` narrows it)")
    return "; ".join(why)


def _explain(m, args) -> int:
    """``--explain CELL``: one cell's evidence, and the commands that measure it again in A and B."""
    from bench.features import repro
    from bench.runs import store
    from reports.compare import evidence_line

    words = args.explain.split()
    labels = [f"{r['variant']} {r['dtype']} b={r['batch']} h={r['heads']}/{r['kv_heads']} n={r['q_len']} "
              f"kv={r['kv_len']} d={repro.dims_text(r)} {r['mask']} {r['direction']}" for _, r in m.iterrows()]
    hits = [i for i, label in enumerate(labels) if all(w in label for w in words)]
    if len(hits) != 1:
        raise UsageError(f"--explain {args.explain!r}: {len(hits)} matching cells answer to it"
                         + (f" ({'; '.join(labels[i] for i in hits[:4])})" if hits else "")
                         + "; name one cell, e.g. 'naive n=1024 causal fwd'")
    r = m.iloc[hits[0]]
    print(evidence_line(r))
    for side, run in (("a", args.run_a), ("b", args.run_b)):
        samples = r[f"samples_ms_{side}"]
        if isinstance(samples, list):
            print(f"{side.upper()} samples (ms): " + ", ".join(f"{x:.4g}" for x in samples))
        cell = _measured_row(Path(run), r) or ({k: r[k] for k in row.IDENTITY} | {"budget_ms": None})
        out = f"runs/repro-{repro.slug(cell)}-{side.upper()}"  # A's and B's measured apart, never into one folder
        print(f"measure it again in {side.upper()}'s conditions: "
              f"{repro.command(cell, store.read_env(Path(run)).get('spec') or {}, out=out)}")
    return 0


def _measured_row(run: Path, cell) -> dict | None:
    """The run's own current row of the compared cell: the settings it was measured under
    (budget, threads, precision) come with it, as ``status --repro`` gives them."""
    from bench.runs import store

    def same(a, b) -> bool:
        blank = (None, "", "-")
        a, b = (None if x in blank or x != x else x for x in (a, b))
        return str(a) == str(b)
    return next((x for x in store.read_current(run) if all(same(x.get(k), cell[k]) for k in row.IDENTITY)), None)


def add_parser(sub) -> None:
    cp = sub.add_parser("compare", help="B/A time ratio per matching cell of two runs")
    cp.add_argument("run_a", metavar="RUN_A", help="the reference run folder")
    cp.add_argument("run_b", metavar="RUN_B", help="the run folder compared with it (B/A)")
    cp.add_argument("--fail-on-regression", dest="fail_on_regression", metavar="RULE",
                    help="exit 1 when a cell regressed: PCT, or median:PCT%% (B's first quartile more than "
                         "PCT%% above A's third), or min:PCT%% (B's fastest sample more than PCT%% above A's); "
                         "0 only when every matched cell was judged, 4 when some could not be (shaky, another "
                         "timer, uncalibrated) and none judged regressed, 3 when no cell matches")
    cp.add_argument("--strict-trust", dest="strict_trust", action="store_true",
                    help="exit 1 when a matching cell is noisy or contended in either run (by default such "
                         "cells are counted as Shaky and never judged a regression)")
    cp.add_argument("--out", metavar="DIR", help="where the table and chart go (default: RUN_B/compare)")
    cp.add_argument("--margin", type=_pct, default=judge.COMPARE_MARGIN, metavar="PCT",
                    help="the smallest change called faster or slower, in percent (default 5: two runs of one build "
                         "drift by a few percent)")
    cp.add_argument("--fdr", type=_pct, default=judge.COMPARE_FDR, metavar="PCT",
                    help="the false-discovery rate of the cells called faster or slower, in percent (default 5)")
    cp.add_argument("--explain", metavar="CELL",
                    help="one cell's evidence (samples, interval, q-value) and the commands that measure it again")
    cp.set_defaults(func=command)
