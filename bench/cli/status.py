"""``python -m bench status RUN``: where a run stands.

RUN is a run folder (``runs/latest``, a path), a sweep id (a run under runs/ whose env.json
names it, or a sweep folder of jobs submitted with --executor) or a sweep folder.  For a run
folder: its cells measured against its spec's, by status, the shaky ones by reason, its trust
state, and the command that measures the rest; ``--repro CELL`` prints the command that
measures one cell alone (CELL: its number in the listing ``--cells`` prints, or words that
name one cell, such as ``naive n=1024 causal``).  For a sweep of jobs: each job's state and the
cells its shard has done, and the merge command once every shard is done."""

from __future__ import annotations

import shlex
from pathlib import Path

from bench.errors import UsageError


def add_parser(sub) -> None:
    sp = sub.add_parser("status", help="where a run or a sweep of jobs stands: cells done, failed, shaky; "
                                       "--repro CELL: the command that measures one cell again")
    sp.add_argument("sweep", metavar="RUN", help="a run folder (runs/latest), a sweep id, or a sweep folder")
    sp.add_argument("--cells", action="store_true", help="list every cell, numbered, with its status")
    sp.add_argument("--repro", metavar="CELL", help="print the command that measures this cell alone")
    sp.set_defaults(func=command)


def command(args) -> int:
    from bench.features.shards import jobs
    from bench.runs import store

    target = _find(args.sweep, store.DEFAULT_ROOT)
    if (target / jobs.SWEEP_FILE).is_file():
        if args.repro or args.cells:
            raise UsageError(f"{args.sweep} is a sweep of jobs: give --repro and --cells a shard's run folder "
                             f"(one of its shard-i-of-N folders, or its merged run)")
        return _jobs(target)
    return _run(target, args)


def _find(name: str, root: Path) -> Path:
    """A run folder or a sweep folder, from its path or a sweep id."""
    from bench.features.shards import jobs
    from bench.runs import store

    path = Path(name)
    if path.is_dir() and ((path / store.RESULTS).exists() or (path / store.ENV).exists()
                          or (path / jobs.SWEEP_FILE).exists()):
        return path
    if (Path(root) / name / jobs.SWEEP_FILE).is_file():
        return Path(root) / name
    # runs/latest is a link to one of them, not a run of its own
    runs = sorted({p.parent.resolve(): p.parent for p in Path(root).glob(f"*/{store.ENV}")
                   if not p.parent.is_symlink() and store.read_env(p.parent).get("sweep_id") == name}.values())
    if len(runs) == 1:
        return runs[0]
    if len(runs) > 1:
        raise UsageError(f"sweep {name!r} is in {len(runs)} run folders ({', '.join(map(str, runs))}): give one")
    known = sorted({store.read_env(p.parent).get("sweep_id") or p.parent.name for p in Path(root).glob("*/env.json")})
    raise UsageError(f"no run or sweep {name!r}: give a run folder (runs/latest), a sweep id or a sweep folder; "
                     f"known under {root}/: {', '.join(known) or 'none'}")


def _run(folder: Path, args) -> int:
    from tabulate import tabulate

    from bench.engine.discovery import discover
    from bench.engine.sweep import spec_cells
    from bench.features import repro
    from bench.model.spec import spec_from_dict
    from bench.runs import judge, store

    env = store.read_env(folder)
    rows = store.read_current(folder)
    saved = env.get("spec") or {}
    wanted = None
    if saved:
        try:
            spec = spec_from_dict(saved)
            wanted = {store.cell_key(n, c) for n, c in spec_cells(spec, discover(spec.plugins))}
        except Exception:  # a plugin gone since: the rows still say what was measured
            wanted = None
    if args.repro:
        row = _pick(rows, args.repro)
        print(repro.command(row, saved))
        return 0
    if args.cells:
        print(tabulate([[i, repro.label(r), r["status"], ", ".join(judge.shaky_flags(r)) or ""]
                        for i, r in enumerate(rows, start=1)], headers=["#", "cell", "status", "shaky"]))
        return 0
    counts: dict = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    done = len({store.cell_key(r["variant"], r) for r in rows} & wanted) if wanted else len(rows)
    total = len(wanted) if wanted else len(rows)
    t = judge.trust(rows)
    print(f"run {folder} (sweep {env.get('sweep_id', '?')}, {env.get('device', '?')})")
    print(f"{done} of {total} cells measured: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"shaky: {t.shaky} of {t.ok} ok cells ({judge.reasons_text(t.counts)}); trust: {t.heading}: {t.reason}")
    bad = judge.failures(rows)
    for line in bad[:10]:
        print(f"  failed: {line}")
    if len(bad) > 10:
        print(f"  ... and {len(bad) - 10} more (--cells lists every one)")
    if wanted and done < total:
        print(f"the rest: python -m bench sweep --resume {shlex.quote(str(folder))}")
    if t.shaky:
        print(f"measure the shaky ones again: python -m bench sweep --resume {shlex.quote(str(folder))} --retry shaky")
    print(f"one cell alone: python -m bench status {shlex.quote(str(folder))} --repro N (--cells numbers them)")
    return 0


def _pick(rows: list[dict], cell: str) -> dict:
    """The cell ``cell`` names: its number in ``--cells``, or words every one of which is in its label."""
    from bench.features import repro
    from bench.model.digits import is_digits

    if is_digits(cell):
        i = int(cell)
        if not 1 <= i <= len(rows):
            raise UsageError(f"--repro {cell}: the run has cells 1 to {len(rows)} (status RUN --cells lists them)")
        return rows[i - 1]
    words = cell.split()
    hits = [r for r in rows if all(w in repro.label(r).split() or w in repro.label(r) for w in words)]
    if len(hits) != 1:
        shown = "; ".join(repro.label(r) for r in hits[:5])
        raise UsageError(f"--repro {cell!r}: {len(hits)} cells match" + (f" ({shown})" if hits else "")
                         + "; name one cell, or give its number from status RUN --cells")
    return hits[0]


def _jobs(folder: Path) -> int:
    from tabulate import tabulate

    from bench.features.shards import jobs

    record = jobs.read_sweep(folder)
    states = jobs.job_states(record)
    print(f"sweep {record['sweep_id']} ({record['executor']}, submitted {record['submitted']}): {folder}")
    print(tabulate([[s["shard"], s["job_id"], s["state"], f"{s['cells_done']}/{s['cells']}", s["folder"]]
                    for s in states], headers=["shard", "job", "state", "cells", "folder"]))
    done = sum(s["cells_done"] for s in states)
    total = sum(s["cells"] for s in states)
    print(f"{done} of {total} cells measured")
    if done == total:
        out = folder / "merged"
        n = 2
        while out.exists() and any(out.iterdir()):  # merge writes a new folder: name one that is free
            out = folder / f"merged-{n}"
            n += 1
        print(f"all measured: python -m bench merge {' '.join(shlex.quote(s['folder']) for s in states)} "
              f"--out {shlex.quote(str(out))}")
    return 0
