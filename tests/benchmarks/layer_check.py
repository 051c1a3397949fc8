"""What the float64 layer check of a large layer cell costs, checked on its last queries
(bench.scopes.layer_run.check_rows) and whole, in two processes of their own:

    python tests/benchmarks/layer_check.py [--scope block] [--heads 4] [--seq-len 8192] [--head-dim 16]

Each prints the check's verdict, its wall time (the variant's own checked call included: naive,
forward and backward) and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def one(args, rows: bool) -> None:
    import torch

    from bench.api import discover
    from bench.case import Case
    from bench.scopes import layer_run

    torch.set_num_threads(args.threads)
    case = Case(batch=1, heads=args.heads, kv_heads=args.heads, head_dim=args.head_dim, q_len=args.seq_len,
                kv_len=args.seq_len, mask="causal", scope=args.scope, direction="fwd+bwd",
                ffn="none" if args.scope == "block" else f"mlp:{4 * args.heads * args.head_dim}")
    if not rows:
        layer_run.check_rows = lambda c: None
    bound = layer_run.bind_layer(discover(entry_points=False)["naive"], case)
    t0 = time.perf_counter()
    with bound.scope():
        result = bound.check()
    sliced = layer_run.check_rows(case) if rows else None
    what = f"last {sliced.stop - sliced.start} queries" if sliced else "every query"
    print(f"{what:>20}: {'ok' if result.ok else result.reason}, {time.perf_counter() - t0:.1f} s, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scope", default="block", choices=("block", "encoder", "decoder"))
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", choices=("rows", "whole"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        one(args, args.one == "rows")
        return 0
    for how in ("rows", "whole"):
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", how], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
