"""ab on this machine, with real sweeps: an A/A of this tree against itself, an A/A of two identical
plugin files, and two plugin files of which the second does 10% more work (A/B).  Every cell an A/A
calls changed is a false discovery; the share of the A/B's cells called slower is the power to find
a real 10% slowdown.

    python tests/benchmarks/ab_check.py --out DIR [--repeats 5] [--busy] [--parts aa,aa-plugin,ab]

The A/A is the 18-cell sweep of the trust issue (naive, sdpa, chunked.online; n = 256, 512, 1024;
none and causal; 4 heads of 64; float32 forward); the A/B times one plugin variant over the same
lengths and masks.  ``--busy`` runs a busy loop on one core throughout.  It prints the rates and
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CELLS = ["--seq-lens", "256,512,1024", "--heads", "4", "--head-dims", "64", "--masks", "none,causal", "--dtypes",
         "float32", "--directions", "fwd", "--device", "cpu"]
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


def ab(out: Path, a: str, b: str, repeats: int, *flags: str) -> list[dict]:
    subprocess.run([sys.executable, "-m", "bench", "ab", a, b, *flags, *CELLS, "--repeats", str(repeats), "--out",
                    str(out)], check=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "ab.json").read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--busy", action="store_true")
    p.add_argument("--parts", default="aa,aa-plugin,ab",
                   help="aa (the tree twice), aa-plugin (two identical plugin files), ab (the 10%% slower one)")
    args = p.parse_args()
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    try:
        aa = ab(out / "aa", str(ROOT), str(ROOT), args.repeats, "--variants", "naive,sdpa,chunked.online") \
            if "aa" in parts else None
        slowed = same_files = None
        if "aa-plugin" in parts:  # two files of identical content: together in one sweep, as the A/B is
            a, b = out / "first.py", out / "second.py"
            a.write_text(textwrap.dedent(PLUGIN.format(extra=0.0)))
            b.write_text(textwrap.dedent(PLUGIN.format(extra=0.0)))
            same_files = ab(out / "aap", str(a), str(b), args.repeats, "--variants", "candidate")
        if "ab" in parts:
            a, b = out / "same.py", out / "slower.py"
            a.write_text(textwrap.dedent(PLUGIN.format(extra=0.0)))
            b.write_text(textwrap.dedent(PLUGIN.format(extra=0.1)))
            slowed = ab(out / "ab", str(a), str(b), args.repeats, "--variants", "candidate")
    finally:
        if loop:
            loop.kill()
    if aa is not None:
        called = sum(r["verdict"] in ("faster", "slower") for r in aa)
        print(f"A/A (this tree twice, {args.repeats} repeats): {called} of {len(aa)} cells called changed")
    if same_files is not None:
        called = sum(r["verdict"] in ("faster", "slower") for r in same_files)
        print(f"A/A (two identical plugin files together, {args.repeats} repeats): {called} of {len(same_files)} cells "
              f"called changed; ratios " + ", ".join(f"{r['ratio']:.3f}" for r in same_files))
    if slowed is not None:
        found = sum(r["verdict"] == "slower" for r in slowed)
        print(f"A/B (a plugin variant doing 10% more work): {found} of {len(slowed)} cells called slower; ratios "
              + ", ".join(f"{r['ratio']:.3f} ({r['ratio_lo']:.3f}-{r['ratio_hi']:.3f}, {r['repeats']} pairs)"
                          for r in slowed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
