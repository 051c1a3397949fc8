"""An A/A check of ``compare``: the same sweep twice on an unchanged build, then compared.  Every
cell called faster or slower is a false discovery.  A plugin variant that runs naive and then
waits 10% of its own time more is in both runs, slowed in the second only: the share of its
cells called slower is the power to find a real 10% slowdown.

    python tests/benchmarks/aa_check.py [--pairs 3] [--busy]

``--busy`` runs a busy loop on one core throughout (a shared machine).  It prints, per pair, the
cells called faster or slower among the unchanged ones, the unchanged cells on which
``--fail-on-regression median:5%`` would fail, and the share of the slowed variant's cells called
slower; it asserts nothing.  The sweeps take the harness's defaults (``--visits 3``: compare
judges each cell from its visits).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["--variants", "naive,sdpa,chunked.online,slowed", "--seq-lens", "256,512,1024", "--heads", "4",
         "--head-dims", "32", "--masks", "none,causal", "--directions", "fwd", "--budget-ms", "100", "--device", "cpu",
         "--no-report", "--quiet", "--remeasure", "0"]
PLUGIN = '''
import os
import time

from bench import masks
from bench.registry import variant

SLOW = float(os.environ.get("AA_SLOWDOWN", "0"))


@variant("slowed", masks=(masks.ANY,), description="naive, then a wait of AA_SLOWDOWN times its own time")
def slowed(case):
    from variants.naive import naive

    inner = naive(case).fn

    def attention(q, k, v):
        t0 = time.perf_counter()
        out = inner(q, k, v)
        spent = time.perf_counter() - t0
        end = time.perf_counter() + SLOW * spent
        while time.perf_counter() < end:
            pass
        return out

    return attention
'''


def sweep(out: Path, plugin: Path, slowdown: float) -> None:
    env = {"AA_SLOWDOWN": str(slowdown), "PYTHONPATH": str(ROOT)}
    import os

    subprocess.run([sys.executable, "-m", "bench", "sweep", *SWEEP, "--plugin", str(plugin), "--out", str(out)],
                   check=True, cwd=ROOT, env=os.environ | env, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--busy", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from reports.compare import compare_runs

    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            plugin = tmp / "slowed.py"
            plugin.write_text(textwrap.dedent(PLUGIN))
            false, judged, found, slowed_cells, gates = 0, 0, 0, 0, 0
            for i in range(args.pairs):
                a, b = tmp / f"a{i}", tmp / f"b{i}"
                sweep(a, plugin, 0.0)
                sweep(b, plugin, 0.10)
                m, regressions = compare_runs(a, b, fail_pct=("median", 5.0))[:2]
                gate = int((regressions["variant"] != "slowed").sum()) if len(regressions) else 0
                gates += gate
                same = m[m["variant"] != "slowed"]
                slowed = m[m["variant"] == "slowed"]
                called = int(same["verdict"].isin(["faster", "slower"]).sum())
                hit = int((slowed["verdict"] == "slower").sum())
                print(f"pair {i + 1}: {called} of {len(same)} unchanged cells called faster or slower "
                      f"({int((same['verdict'] == 'shaky').sum())} shaky, not judged); the slowed variant: "
                      f"{hit} of {len(slowed)} cells called slower; --fail-on-regression median:5% would fail on "
                      f"{gate} unchanged cells")
                false, judged, found, slowed_cells = false + called, judged + len(same), found + hit, \
                    slowed_cells + len(slowed)
            print(f"all pairs: {false} of {judged} unchanged cells called faster or slower "
                  f"({100 * false / max(1, judged):.1f}%); {found} of {slowed_cells} slowed cells found "
                  f"({100 * found / max(1, slowed_cells):.0f}%); the gate failed on {gates} unchanged cells"
                  + (" (one busy loop throughout)" if args.busy else ""))
    finally:
        if loop is not None:
            loop.kill()


if __name__ == "__main__":
    main()
