"""The quick preset on this machine: quiet, next to busy loops, and with fewer threads.

    python tests/benchmarks/quick_preset.py [--out DIR] [--conditions quiet,quiet-no-report,busy2,...]

Runs ``python -m bench sweep --preset quick`` once per condition, one after another:

- ``quiet``: as a user would, with the report;
- ``quiet-no-report``, ``quiet-threads1``: the sweep alone (``--no-report``), with the
  default threads and with one: the references for the medians, by thread count;
- ``busy2``: next to two busy loops (``python -c "while True: pass"``) that this script
  starts before the sweep and kills after it, with no end-of-sweep re-measurement
  (``--no-report --remeasure 0``): how many cells the flags catch;
- ``busy2-halfway``: the same two loops, killed halfway through the sweep (once half of
  the quiet sweep's rows are written), with the default end-of-sweep re-measurement
  (``--no-report``);
- ``busy2-halfway-threads2``: the same with ``--threads 2`` (what auto would not choose
  under the loops);
- ``busy1-threads1``: next to one busy loop, with ``--threads 1`` (``--no-report``);
- ``busy1``, ``busy1-threads2``: next to one busy loop, with ``--threads auto`` and with 2 threads
  (``--no-report``): the contended cases timed again in place, and no idle wait.

Every sweep runs with ``--trace-spans``: after the table, each condition's largest spans (where its
wall went, bench/measure/README.md) and what it re-timed or re-measured, or why not.

Prints one line per condition: the command's wall time (from outside), the cells' wall
time and the timed samples, the projection and its error (the sweep's timing line), the ok
cells flagged contended and noisy (first rows), the cells whose newest row is clean at the
end, and, for each cell ok in both, how its median compares with the quiet sweep's of
the same thread count.
Nothing else of yours should run meanwhile.  It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tabulate import tabulate

CONDITIONS = {  # name: (flags, busy loops, stop the loops halfway)
    "quiet": ([], 0, False),
    "quiet-no-report": (["--no-report"], 0, False),
    "quiet-threads1": (["--no-report", "--threads", "1"], 0, False),
    "busy2": (["--no-report", "--remeasure", "0"], 2, False),
    "busy2-halfway": (["--no-report"], 2, True),
    "busy2-halfway-threads2": (["--no-report", "--threads", "2"], 2, True),
    "busy1-threads1": (["--no-report", "--threads", "1"], 1, False),
    "busy1": (["--no-report"], 1, False),
    "busy1-threads2": (["--no-report", "--threads", "2"], 1, False),
}
REFERENCE = "quiet-no-report"  # the halfway conditions stop their loops at half of its rows
LAST = re.compile(r"timed samples: ([\d.]+) s, (\d+)% of the cells' ([\d.]+) s wall and (\d+)% of the command's"
                  r".*?(?:projected ([\d.]+) s, ([\d.]+)x of it measured)?$")


def _key(r: dict) -> tuple:
    return tuple(r.get(k) for k in ("variant", "dtype", "batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim",
                                    "mask", "window", "direction"))


def run(name: str, out: Path, half_rows: int) -> dict:
    extra, loops, halfway = CONDITIONS[name]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
    done = threading.Event()

    def stop():
        for p in busy:
            p.kill()
            p.wait()

    def stop_halfway():  # once half the cells have their rows
        results = out / name / "results.jsonl"
        while not done.wait(0.2):
            if results.exists() and results.read_bytes().count(b"\n") >= half_rows:
                break
        stop()

    timer = threading.Thread(target=stop_halfway) if halfway else None
    try:
        time.sleep(1.0 if busy else 0)  # the loops are running before the sweep starts
        if timer:
            timer.start()
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "bench", "sweep", "--preset", "quick", "--device", "cpu",
                               "--out", str(out / name), "--trace-spans", *extra], capture_output=True, text=True)
        wall = time.perf_counter() - t0
    finally:
        done.set()
        if timer:
            timer.join()
        stop()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the sweep exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    m = next((m for line in proc.stdout.splitlines() if (m := LAST.search(line))), None)
    if m is None:
        raise SystemExit(f"{name}: the sweep printed no timed-samples line:\n{proc.stdout[-1000:]}")
    rows = [json.loads(line) for line in (out / name / "results.jsonl").read_text().splitlines() if line.strip()]
    first, newest = {}, {}
    for r in rows:
        first.setdefault(_key(r), r)
        newest[_key(r)] = r
    ok = [r for r in first.values() if r["status"] == "ok"]
    return {"name": name, "wall": wall, "m": m, "ok": ok, "newest": newest, "visits": _visits(out / name, rows),
            "warned": "cells were timed while the CPU was shared" in proc.stderr,
            "remeasured": [line for line in proc.stdout.splitlines()
                           if line.startswith(("re-measured", "re-timed")) or "not measured again" in line],
            "spans": json.loads((out / name / "spans.json").read_text())}


def _visits(run: Path, rows: list[dict]) -> str:
    """Later visits against the first: the geometric mean of visit / first over every cell, and
    over the first case each visit's process timed."""
    path = run / "visits.jsonl"
    if not path.exists():
        return "-"
    first = {(r.get("interleave_id"), r["variant"]): r for r in rows if r["status"] == "ok" and r.get("median_ms")}
    every, opening, seen = [], [], {}
    for line in path.read_text().splitlines():
        v = json.loads(line)
        r = first.get((v.get("of"), v.get("variant")))
        if r is None or not v.get("median_ms"):
            continue
        x = math.log(v["median_ms"] / r["median_ms"])
        every.append(x)
        if seen.setdefault(v.get("visit"), v.get("of")) == v.get("of"):
            opening.append(x)
    if not every:
        return "-"
    return f"{math.exp(statistics.mean(every)):.3f}; first case {math.exp(statistics.mean(opening)):.3f}"


def _row(res: dict, quiet: dict | None) -> list:
    m, ok, newest = res["m"], res["ok"], res["newest"]
    contended = sum(bool(r.get("contended")) for r in ok)
    noisy = sum(bool(r.get("noisy")) for r in ok)
    ended_ok = [r for r in newest.values() if r["status"] == "ok"]
    clean = sum(1 for r in ended_ok if not r.get("contended"))
    projected = f"{float(m[5]):.0f} s ({m[6]}x)" if m[5] else "-"
    versus = "-"
    if quiet is not None and quiet is not res:
        base = {k: r for k, r in quiet["newest"].items() if r["status"] == "ok"}
        versus_name = quiet["name"]
        ratios = [r["median_ms"] / base[k]["median_ms"] for k, r in newest.items()
                  if r["status"] == "ok" and k in base and base[k]["median_ms"]]
        if ratios:
            within = sum(1 for x in ratios if abs(x - 1) <= 0.10)
            versus = (f"{100 * within / len(ratios):.0f}% within 10% (median ratio {statistics.median(ratios):.2f}; "
                      f"{versus_name})")
    return [res["name"], f"{res['wall']:.1f} s", f"{float(m[3]):.1f} s", f"{float(m[1]):.1f} s ({m[2]}% / {m[4]}%)",
            projected, f"{contended} of {len(ok)}" + (" (warning)" if res["warned"] else ""), f"{noisy} of {len(ok)}",
            f"{clean} of {len(ended_ok)} ({100 * clean / max(1, len(ended_ok)):.0f}%)", versus, res["visits"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="keep the run folders under DIR/<timestamp>/ (default: a temporary folder)")
    ap.add_argument("--conditions", default=",".join(CONDITIONS),
                    help=f"comma-separated, of {', '.join(CONDITIONS)} (default: all, in that order)")
    args = ap.parse_args()
    names = [c.strip() for c in args.conditions.split(",") if c.strip()]
    bad = [c for c in names if c not in CONDITIONS]
    if bad:
        print(f"error: --conditions: unknown {', '.join(bad)}; valid: {', '.join(CONDITIONS)}", file=sys.stderr)
        raise SystemExit(2)
    if any(CONDITIONS[n][2] for n in names) and REFERENCE not in names:
        names.insert(0, REFERENCE)  # the halfway condition stops its loops at half of this one's time
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S") if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results, quiet = [], None
        for name in names:
            res = run(name, out, half_rows=(len(quiet["newest"]) // 2 if quiet else 104))
            results.append(res)
            if name == REFERENCE:
                quiet = res

    def reference(res):  # the quiet run of the same thread count
        threads = {r.get("threads") for r in res["ok"]}
        return next((q for q in results if q["name"].startswith("quiet") and q is not res
                     and {r.get("threads") for r in q["ok"]} == threads), None)

    print(tabulate([_row(r, reference(r)) for r in results],
                   headers=["condition", "command wall", "cells' wall", "timed (of cells / of command)", "projected",
                            "contended (first rows)", "noisy", "clean at the end", "medians vs a quiet run",
                            "later visits / first"],
                   tablefmt="github"))
    for r in results:
        top = r["spans"]["spans"]
        print(f"\n{r['name']}: {r['spans']['wall_s']:.1f} s wall, {r['spans']['timed_s']:.1f} s timed samples "
              f"({r['spans']['wall_s'] / max(r['spans']['timed_s'], 1e-9):.2f}x)")
        for row in top[:8] + [x for x in top[8:] if "look at the load" in x["span"] or x["span"] == "untraced"]:
            print(f"  {row['span']:<62} {row['s']:7.2f} s  x{row['count']}")
        for line in r["remeasured"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
