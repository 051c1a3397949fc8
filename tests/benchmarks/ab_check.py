"""ab on this machine, with real sweeps, at ab's defaults (its first look, its budget) on 12 cells:
naive at n = 256, 512, 1024, masks none and causal, 4 and 8 heads of 64, float32 forward.

    python tests/benchmarks/ab_check.py --out DIR [--busy N] [--parts aa,aa-plugin,ab-plugin,naive,bench,aa-runs]

The parts:

- ``aa``: two clones of this tree (its last commit), A/A;
- ``aa-runs``: one clone twice (``ab T T``: two runs in turns, as ``ab . .`` is), A/A, with the
  between-run drift it records for ``compare`` (each cell's own, a run's common shift; one sd per run);
- ``aa-plugin``: two identical plugin files, A/A;
- ``ab-plugin``: a plugin variant, against a copy of it doing 10% more work;
- ``naive``: a clone whose ``variants/naive.py`` does 10% more work, against a clone of the tree;
- ``bench``: a clone whose harness (``bench/measure/timing.py``: the forward it times) does 10% more
  work, against a clone of the tree.

Every cell an A/A calls changed is a false discovery; the share of an A/B's cells called slower is
its power to find a real 10% slowdown.  ab runs from a clone of the tree (its last commit), so that
the working tree can change meanwhile.  ``--busy N`` runs N busy loops throughout (a shared
machine).  It prints each part's verdicts, sd of log(B/A) per pair, pairs and wall, writes them to
DIR/summary.json, and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[2]
CELLS = ["--seq-lens", "256,512,1024", "--heads", "4,8", "--head-dims", "64", "--masks", "none,causal", "--dtypes",
         "float32", "--directions", "fwd", "--device", "cpu"]
SLOWER = 0.10
PLUGIN = '''
import time

from bench import masks
from bench.registry import variant


@variant("candidate", masks=(masks.ANY,), description="naive, then {extra} of its own time more")
def candidate(case):
    from variants.naive import naive

    inner = naive(case).fn

    def attention(q, k, v):
        t0 = time.perf_counter()
        out = inner(q, k, v)
        end = time.perf_counter() + {extra} * (time.perf_counter() - t0)
        while time.perf_counter() < end:
            pass
        return out
    return attention
'''
SPIN = '''{indent}def _spun(call, extra={extra}):
{indent}    import time

{indent}    def spun(*args):
{indent}        t0 = time.perf_counter()
{indent}        out = call(*args)
{indent}        end = time.perf_counter() + extra * (time.perf_counter() - t0)
{indent}        while time.perf_counter() < end:
{indent}            pass
{indent}        return out
{indent}    return spun
'''
# where each clone does more: (file, the text it replaces, its replacement)
SLOWED = {
    "naive": ("variants/naive.py", "    return Prepared(attention, {\"materialised_bytes\"",
              SPIN.format(indent="    ", extra=SLOWER) + "    attention = _spun(attention)\n"
              "    return Prepared(attention, {\"materialised_bytes\""),
    "bench": ("bench/measure/timing.py", "    if direction == \"fwd\":\n        return forward\n",
              "    if direction == \"fwd\":\n" + SPIN.format(indent="        ", extra=SLOWER)
              + "        return _spun(forward)\n"),
}


def clone(out: Path, name: str, slowed: str | None = None) -> Path:
    """A clone of this tree's last commit under ``out``, with ``slowed``'s file made to do more."""
    path = out / name
    if not path.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True)
        if slowed:
            rel, old, new = SLOWED[slowed]
            f = path / rel
            text = f.read_text()
            if text.count(old) != 1:
                raise SystemExit(f"ab_check: {rel} no longer holds the line it slows; update SLOWED")
            f.write_text(text.replace(old, new))
    return path


def ab(driver: Path, out: Path, a: str, b: str, variants: str) -> dict:
    """One ab at its defaults; its rows, its run record and its wall."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "bench", "ab", a, b, "--variants", variants, *CELLS, "--out", str(out)]
    done = subprocess.run(cmd, cwd=driver, env=os.environ | {"PYTHONPATH": str(driver)}, capture_output=True, text=True)
    wall = time.monotonic() - t0
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    drift = re.search(r"shifts by ([\d.]+)% and each cell by ([\d.]+)%", done.stdout)
    if not (out / "ab.json").exists():
        raise SystemExit(f"ab_check: ab {a} {b} wrote no ab.json (exit {done.returncode}); see {out}.log")
    data = json.loads((out / "ab.json").read_text())
    run = json.loads((out / "ab-run.json").read_text()) if (out / "ab-run.json").exists() else {}
    return {"rows": data, "run": run, "wall_s": wall, "exit": done.returncode,
            "drift": {"run": float(drift.group(1)) / 100, "cell": float(drift.group(2)) / 100} if drift else None}


def summary(name: str, res: dict) -> dict:
    rows = res["rows"]
    verdicts = Counter(r["verdict"] for r in rows)
    sds = [r["sd"] for r in rows if r.get("sd") == r.get("sd") and r.get("sd") is not None]
    return {"part": name, "cells": len(rows), "verdicts": dict(verdicts),
            "sd_median": median(sds) if sds else None,
            "pairs_median": median(r["repeats"] for r in rows) if rows else 0,
            "ratios": [round(r["ratio"], 4) for r in rows], "mode": res["run"].get("mode"), "exit": res["exit"],
            "wall_s": round(res["wall_s"], 1), "drift": res["drift"],
            "repeats": res["run"].get("repeats"), "stopped": res["run"].get("stopped")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--busy", type=int, default=0, metavar="N", help="busy loops to run throughout")
    p.add_argument("--parts", default="aa,aa-plugin,naive,bench")
    args = p.parse_args()
    parts = args.parts.split(",")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    driver = clone(out, "tree-a")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    results = []
    try:
        for part in parts:
            if part == "aa":
                res = ab(driver, out / part, str(driver), str(clone(out, "tree-b")), "naive")
            elif part == "aa-runs":
                res = ab(driver, out / part, str(driver), str(driver), "naive")
            elif part in ("aa-plugin", "ab-plugin"):
                a, b = out / f"{part}-a.py", out / f"{part}-b.py"
                a.write_text(textwrap.dedent(PLUGIN.format(extra=0.0)))
                b.write_text(textwrap.dedent(PLUGIN.format(extra=SLOWER if part == "ab-plugin" else 0.0)))
                res = ab(driver, out / part, str(a), str(b), "candidate")
            elif part in SLOWED:
                res = ab(driver, out / part, str(driver), str(clone(out, f"tree-{part}", part)), "naive")
            else:
                raise SystemExit(f"ab_check: unknown part {part!r}; valid: aa, aa-runs, aa-plugin, ab-plugin, naive, "
                                 f"bench")
            s = summary(part, res)
            results.append(s)
            print(json.dumps(s), flush=True)
    finally:
        for loop in loops:
            loop.kill()
    (out / "summary.json").write_text(json.dumps({"busy": args.busy, "parts": results}, indent=1))
    for s in results:
        changed = s["verdicts"].get("faster", 0) + s["verdicts"].get("slower", 0)
        print(f"{s['part']}: {changed} of {s['cells']} changed ({s['verdicts']}), sd {s['sd_median']}, "
              f"{s['pairs_median']} pairs, {s['repeats']} repeats ({s['stopped']}), mode {s['mode']}, "
              f"{s['wall_s']:.0f} s" + (f"; drift per run: a run {s['drift']['run']:.3f}, a cell "
                                      f"{s['drift']['cell']:.3f}" if s["drift"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
