"""The quick preset on this machine: quiet, next to busy loops, and with fewer threads.

    python tests/benchmarks/quick_preset.py [--out DIR] [--conditions quiet,quiet-no-report,busy2,busy1-threads1]

Runs ``python -m bench sweep --preset quick`` once per condition, one after another:

- ``quiet``: as a user would, with the report;
- ``quiet-no-report``: the sweep alone (``--no-report``);
- ``busy2``: next to two busy loops (``python -c "while True: pass"``) that this script
  starts before the sweep and kills after it (``--no-report``);
- ``busy1-threads1``: next to one busy loop, with ``--threads 1`` (``--no-report``).

Prints one line per condition: the command's wall time (from outside), the cells' wall
time and the timed samples (the sweep's last line), the ok cells flagged contended and
noisy, and whether the contention warning was printed.  Nothing else of yours should run
meanwhile.  It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

CONDITIONS = {
    "quiet": ([], 0),
    "quiet-no-report": (["--no-report"], 0),
    "busy2": (["--no-report"], 2),
    "busy1-threads1": (["--no-report", "--threads", "1"], 1),
}
LAST = re.compile(r"timed samples: ([\d.]+) s, (\d+)% of the cells' ([\d.]+) s wall and (\d+)% of the command's")


def run(name: str, out: Path) -> list:
    extra, loops = CONDITIONS[name]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(loops)]
    try:
        time.sleep(1.0 if busy else 0)  # the loops are running before the sweep starts
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "bench", "sweep", "--preset", "quick", "--device", "cpu",
                               "--out", str(out / name), *extra], capture_output=True, text=True)
        wall = time.perf_counter() - t0
    finally:
        for p in busy:
            p.kill()
            p.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: the sweep exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    m = LAST.search(proc.stdout.splitlines()[-1] if proc.stdout.strip() else "")
    if m is None:
        raise SystemExit(f"{name}: the sweep's last line is not the timed-samples line:\n{proc.stdout[-1000:]}")
    rows = [json.loads(line) for line in (out / name / "results.jsonl").read_text().splitlines() if line.strip()]
    ok = [r for r in rows if r["status"] == "ok"]
    contended = sum(bool(r.get("contended")) for r in ok)
    noisy = sum(bool(r.get("noisy")) for r in ok)
    warned = "cells were timed while the CPU was shared" in proc.stderr
    return [name, f"{wall:.1f} s", f"{float(m[3]):.1f} s", f"{float(m[1]):.1f} s ({m[2]}% / {m[4]}%)",
            f"{contended} of {len(ok)}" + (" (warning)" if warned else ""), f"{noisy} of {len(ok)}"]


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
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S") if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        table = [run(name, out) for name in names]
    print(tabulate(table, headers=["condition", "command wall", "cells' wall", "timed (of cells / of command)",
                                   "contended", "noisy"], tablefmt="github"))


if __name__ == "__main__":
    main()
