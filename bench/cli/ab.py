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
                   help="pairs of fresh processes, the unit the interval is taken over (default 5; 2 to 50)")
    p.add_argument("--out", metavar="DIR", help="a new or empty folder (default: runs/<timestamp>-ab)")
    p.add_argument("--fail-on-regression", dest="fail_on_regression", metavar="PCT",
                   help="exit 1 when a cell is slower in B by more than PCT%% beyond its interval")
    p.add_argument("--margin", default=None, metavar="PCT",
                   help="the smallest change called, in percent (default 2: the builds take turns)")
    p.add_argument("--fdr", default="5", metavar="PCT", help="the false-discovery rate, in percent (default 5)")
    add_setting_flags(p, skip=RUN_ONLY)
    p.set_defaults(func=command)


def command(args) -> int:
    from bench.engine import judge, store
    from bench.engine.discovery import discover
    from bench.features import ab
    from bench.model.parsers import number
    from bench.model.specbuild import build_spec

    repeats = number(2, 50, True)(args.repeats, "--repeats") if args.repeats is not None else judge.AB_REPEATS
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
    print(f"ab: {sides[0].describe()}; {sides[1].describe()}" + (" (the same build twice: an A/A check)" if same
                                                                     else ""))
    print(f"ab: {repeats} repeats x {len(ab.slices(settings))} slices, the two sides in turns; folder {out}",
          flush=True)
    ab.run(sides, settings, out, repeats, progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    cells = ab.rows_by_cell(out, repeats, len(ab.slices(settings)))
    if not cells:
        print("ab: no cell was ok on both sides in every repeat", file=sys.stderr)
        return 1
    table = ab.analyse(cells, margin, fdr)
    store.write_json(out, "ab.json", table, indent=2)
    counts = _print_verdicts(table, ab.together(sides), repeats, margin, fdr, out)
    if same:  # an A/A: what one run's figures drift by here, for compare of two separate runs
        from bench.engine import drift

        cell, run = ab.aa_drift(cells)
        env = store.read_env(ab.folder(out, 0, 0, "A"))
        drift.record(env, cell, run, len(cells), repeats)
        print(f"A/A: {counts['faster'] + counts['slower']} of {len(table)} cells called changed (false discoveries); "
              f"from one run to the next here, a run as a whole shifts by {100 * run:.1f}% and each cell by "
              f"{100 * cell:.1f}% more (one sd): compare of two runs on this machine now uses it")
    return _gate(table, gate)


def _print_verdicts(table: list[dict], together: bool, repeats: int, margin: float, fdr: float, out: Path) -> dict:
    """Each cell's B/A and verdict, and the counts of the verdicts (returned)."""
    from tabulate import tabulate

    from bench.features import ab

    print(tabulate([[r["variant"], r["dtype"], r["mask"], r["direction"], r["q_len"], r["a_ms"], r["b_ms"], r["ratio"],
                     r["ratio_lo"], r["ratio_hi"], r["q"], r["verdict"]] for r in table],
                   headers=["variant", "dtype", "mask", "dir", "n", "A ms", "B ms", "B/A", "95% lo", "95% hi", "q",
                            "verdict"], floatfmt=".4g"))
    counts = {v: sum(r["verdict"] == v for r in table) for v in ("faster", "same", "slower", "unsure")}
    print(f"Better {counts['faster']}, Same {counts['same']}, Worse {counts['slower']}, Unsure {counts['unsure']} "
          f"(of {len(table)} cells; B/A per "
          + (f"visit, {ab.TOGETHER_VISITS} in each of {repeats} repeats" if together else
             f"repeat, {repeats} repeats") + "; faster or slower: a change beyond "
          f"{100 * margin:g}% at a false-discovery rate of {100 * fdr:g}%; {out / 'ab.json'})")
    return counts


def _gate(table: list[dict], gate: float | None) -> int:
    """--fail-on-regression: 1, naming them, when cells are slower in B beyond their interval by
    more than the gate; else 0."""
    worse = [r for r in table if gate is not None and r["verdict"] == "slower" and r["ratio_lo"] - 1.0 > gate]
    if not worse:
        return 0
    print(f"{len(worse)} cell(s) slower in B by more than {100 * gate:g}% beyond their interval:", file=sys.stderr)
    for r in worse:
        print(f"  {r['variant']} {r['mask']} {r['direction']} n={r['q_len']}: B/A {r['ratio']:.3g} "
              f"(95% {r['ratio_lo']:.3g}-{r['ratio_hi']:.3g}, q {r['q']:.2g})", file=sys.stderr)
    return 1
