"""``python -m bench status SWEEP``: the jobs of a sweep submitted with --executor, their
states and the cells each shard has done."""

from __future__ import annotations


def add_parser(sub) -> None:
    sp = sub.add_parser("status", help="the jobs of a sweep run with --executor: states and cells done")
    sp.add_argument("sweep", metavar="SWEEP", help="the sweep id (a folder under runs/) or the sweep folder")
    sp.set_defaults(func=command)


def command(args) -> int:
    from tabulate import tabulate

    from bench.engine import jobs, store

    folder = jobs.find_sweep(args.sweep, store.DEFAULT_ROOT)
    record = jobs.read_sweep(folder)
    states = jobs.job_states(record)
    print(f"sweep {record['sweep_id']} ({record['executor']}, submitted {record['submitted']}): {folder}")
    print(tabulate([[s["shard"], s["job_id"], s["state"], f"{s['cells_done']}/{s['cells']}", s["folder"]]
                    for s in states], headers=["shard", "job", "state", "cells", "folder"]))
    done = sum(s["cells_done"] for s in states)
    total = sum(s["cells"] for s in states)
    print(f"{done} of {total} cells measured")
    if done == total:
        print(f"all measured: python -m bench merge {' '.join(s['folder'] for s in states)} --out {folder}/merged")
    return 0
