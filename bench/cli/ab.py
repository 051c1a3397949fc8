"""``python -m bench ab A B [sweep flags]``: did my change regress?  The same cells under two builds
(source trees, interpreters or plugin files) in turns, repeat after repeat (bench.features.ab)."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.cli.common import add_setting_flags, given_settings
from bench.errors import UsageError

RUN_ONLY = ("workers", "gpus", "shard", "shards", "sweep_id", "executor", "remeasure", "visits", "peak_age", "preset")


def add_parser(sub) -> None:
    p = sub.add_parser("ab", help="the same cells under two builds, taking turns: did my change regress?")
    p.add_argument("a", metavar="A", help="a source tree (a folder with bench/), a Python interpreter or a plugin file")
    p.add_argument("b", metavar="B", help="the other build, of the same kind or another")
    p.add_argument("--repeats", default=None,
                   help="pairs of fresh processes before the first look (default 3; 2 to 50); more follow while "
                        "cells are undecided and the budget lasts")
    p.add_argument("--budget-s", dest="budget_s", default=None, metavar="S",
                   help="the seconds ab may spend on repeats while cells are undecided (default 120; 0: the first "
                        "look only); it stops sooner when every cell is decided, and after 50 repeats")
    p.add_argument("--out", metavar="DIR", help="a new or empty folder (default: runs/<timestamp>-ab)")
    p.add_argument("--fail-on-regression", dest="fail_on_regression", metavar="PCT",
                   help="exit 1 when a cell is slower in B by more than PCT%% beyond its interval; 0 only when every "
                        "cell was judged (its interval's upper end within PCT%%), 4 when some could not be")
    p.add_argument("--margin", default=None, metavar="PCT",
                   help="the smallest change called, in percent (default 2: the builds take turns)")
    p.add_argument("--fdr", default="5", metavar="PCT",
                   help="the false-discovery rate over the cells and the looks, in percent (default 5)")
    add_setting_flags(p, skip=RUN_ONLY)
    p.set_defaults(func=command)


def command(args) -> int:
    from bench.engine.discovery import discover
    from bench.features import ab
    from bench.model.parsers import number
    from bench.model.specbuild import build_spec
    from bench.runs import judge, store

    first = number(2, ab.MAX_REPEATS, True)(args.repeats, "--repeats") if args.repeats is not None \
        else judge.AB_REPEATS
    budget = number(0, 86400, False)(args.budget_s, "--budget-s") if args.budget_s is not None else judge.AB_BUDGET_S
    margin = number(0, 100, False)(args.margin, "--margin") / 100 if args.margin is not None else judge.AB_MARGIN
    fdr = number(0.01, 50, False)(args.fdr, "--fdr") / 100
    gate = number(0, 1000, False)(args.fail_on_regression, "--fail-on-regression") / 100 \
        if args.fail_on_regression is not None else None
    sides = (ab.side("A", args.a), ab.side("B", args.b))
    given = given_settings(args)
    plugins = list(sides[0].plugins)  # the settings are checked here against A's variants (B's may share names)
    registry = discover(plugins)
    spec = build_spec(given | ({"plugins": plugins} if plugins else {}), registry)  # refused here, not in a side
    settings = {k: v for k, v in given.items() if k != "plugins"} | {"device": spec.device, "remeasure": 0,
                                                                                "visits": 1}
    settings |= {"batch_mix": list(spec.batch_mix)} if spec.batch_mix else {"seq_lens": list(spec.seq_lens)}
    if args.out and Path(args.out).is_dir() and any(Path(args.out).iterdir()):
        raise UsageError(f"--out {args.out}: not empty; ab measures into a new or empty folder")
    out = store.writable_dir(args.out) if args.out else store.new_run_dir(f"{spec.device}-ab", link_latest=False)
    same = (sides[0].python, sides[0].tree, sides[0].plugins) == (sides[1].python, sides[1].tree, sides[1].plugins)
    mode, why = ab.mode(sides)
    print(f"ab: mode {mode}: {why}")
    print(f"ab: {sides[0].describe()}; {sides[1].describe()}" + (" (the same build twice: an A/A check)" if same
                                                                     else ""))
    n_slices = len(ab.slices(settings))
    print(f"ab: {first} repeats x {n_slices} slices, then more while cells are undecided, for up to {budget:g} s "
          f"(looks at {', '.join(map(str, ab.looks(first)[:6]))}, ... repeats; the false-discovery rate {100 * fdr:g}% "
          f"is spent over the looks, a look at k of the K repeats the budget allows spending (k/K)^2 of it less what "
          f"the looks before spent, the last look the rest); folder {out}", flush=True)
    state = {"table": []}

    def decided(repeats: int, look: int, weights: list[float]) -> bool:
        cells = ab.rows_by_cell(out, repeats, n_slices)
        state["seen"] = state.get("seen", []) + [repeats]
        seen = state["seen"] if budget > 0 else None  # no budget: one look, which spends the whole rate
        state["table"] = ab.analyse(cells, margin, fdr, seen, weights) if cells else []
        state["cells"] = cells
        left = sum(r["verdict"] == "undecided" for r in state["table"])
        print(f"  look {look} at {repeats} repeats ({100 * weights[-1]:.0f}% of the rate): "
              f"{len(state['table']) - left} of {len(state['table'])} cells decided", file=sys.stderr, flush=True)
        return ab.all_decided(state["table"], gate)

    seq = ab.sequential(sides, settings, out, first, budget, decided,
                        progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    table, cells = state["table"], state.get("cells") or {}
    if not cells:
        print("ab: no cell was ok on both sides in every repeat", file=sys.stderr)
        return 1
    for r in table:
        r |= {"mode": mode, "pairs": list(seq["conditions"])}
    store.write_json(out, "ab.json", table, indent=2)
    store.write_json(out, "ab-run.json", {"mode": mode, "why": why, "margin": margin, "fdr": fdr,
                                          "gate": gate, "looks": seq["looks"], "weights": seq["weights"],
                                          "repeats": seq["repeats"],
                                          "stopped": seq["stopped"], "budget_s": budget, "wall_s": seq["wall_s"],
                                          "walls_s": seq["walls_s"], "conditions": seq["conditions"]}, indent=2)
    counts = _print_verdicts(table, ab.together(sides), seq["repeats"], margin, fdr, out)
    _print_power(table, seq, margin, fdr)
    if same:  # an A/A: what one run's figures drift by here, for compare of two separate runs
        from bench.runs import drift

        cell, run = ab.aa_drift(cells)
        env = store.read_env(ab.folder(out, 0, 0, "A"))
        drift.record(env, cell, run, len(cells), seq["repeats"])
        print(f"A/A: {counts['faster'] + counts['slower']} of {len(table)} cells called changed (false discoveries); "
              f"from one run to the next here, a run as a whole shifts by {100 * run:.1f}% and each cell by "
              f"{100 * cell:.1f}% more (one sd): compare of two runs on this machine now uses it")
    return _gate(table, gate)


def _print_power(table: list[dict], seq: dict, margin: float, fdr: float) -> None:
    """The sd of the log ratio per pair the run measured, and the power it reached for a 10% change."""
    from statistics import median

    from bench.features import ab

    sds = [r["sd"] for r in table if r["sd"] == r["sd"]]
    if not sds:
        return
    sd = median(sds)
    pairs = int(median(r["repeats"] for r in table))
    level = fdr * (seq["weights"][-1] if seq["budget_s"] > 0 else 1.0)
    need = ab.pairs_for(sd, margin, level)
    print(f"ab: {seq['repeats']} repeats in {seq['wall_s']:.0f} s (stopped: {seq['stopped']}); the sd of log(B/A) per "
          f"pair is {sd:.3f} (median over the cells), so {pairs} pairs find a true 10% change with probability "
          f"{ab.power(sd, pairs, margin, level):.0%} at the last look's level ({100 * level:.2g}%); 90% needs about "
          f"{need:.0f} pairs")


def _print_verdicts(table: list[dict], together: bool, repeats: int, margin: float, fdr: float, out: Path) -> dict:
    """Each cell's B/A and verdict, and the counts of the verdicts (returned)."""
    from tabulate import tabulate

    from bench.features import ab

    print(tabulate([[r["variant"], r["dtype"], r["mask"], r["direction"], r["q_len"], r["a_ms"], r["b_ms"], r["ratio"],
                     r["ratio_lo"], r["ratio_hi"], r["q"], r["verdict"]] for r in table],
                   headers=["variant", "dtype", "mask", "dir", "n", "A ms", "B ms", "B/A", "95% lo", "95% hi", "q",
                            "verdict"], floatfmt=".4g"))
    counts = {v: sum(r["verdict"] == v for r in table) for v in ab.VERDICTS}
    print(f"Better {counts['faster']}, Same {counts['same']}, Worse {counts['slower']}, Undecided "
          f"{counts['undecided']} "
          f"(of {len(table)} cells; B/A per "
          + (f"visit, {ab.TOGETHER_VISITS} in each of {repeats} repeats" if together else
             f"repeat, {repeats} repeats") + "; faster or slower: a change beyond "
          f"{100 * margin:g}% at a false-discovery rate of {100 * fdr:g}%; {out / 'ab.json'})")
    return counts


def _gate(table: list[dict], gate: float | None) -> int:
    """--fail-on-regression (bench.runs.judge.GATE_EXIT): 1, naming them, when cells are slower in B
    beyond their interval by more than the gate; 0 when every cell was judged (its interval's upper
    end within the gate); 4 when some could not be; 0 without a gate."""
    from bench.runs import judge

    if gate is None:
        return 0
    words = [judge.gate_verdict(r["verdict"], r["ratio_lo"], r["ratio_hi"], gate) for r in table]
    worse = [r for r, w in zip(table, words) if w == "regression"]
    if worse:
        print(f"{len(worse)} cell(s) slower in B by more than {100 * gate:g}% beyond their interval:", file=sys.stderr)
        for r in worse:
            print(f"  {_line(r)}", file=sys.stderr)
        return judge.GATE_EXIT["regression"]
    unjudged = [r for r, w in zip(table, words) if w == "unjudged"]
    if unjudged:
        print(f"gate: {len(unjudged)} of {len(table)} cell(s) could not be judged against {100 * gate:g}% (exit "
              f"{judge.GATE_EXIT['unjudged']}: none judged regressed; their intervals reach past it: a larger "
              f"--budget-s takes more pairs)", file=sys.stderr)
        for r in unjudged[:8]:
            print(f"  {_line(r)}", file=sys.stderr)
        return judge.GATE_EXIT["unjudged"]
    print(f"gate: all {len(table)} cells judged, none slower by more than {100 * gate:g}%", file=sys.stderr)
    return judge.GATE_EXIT["clear"]


def _line(r: dict) -> str:
    return (f"{r['variant']} {r['mask']} {r['direction']} n={r['q_len']}: {r['verdict']}, B/A {r['ratio']:.3g} "
            f"(95% {r['ratio_lo']:.3g}-{r['ratio_hi']:.3g}, q {r['q']:.2g}, {r['repeats']} pairs)")
