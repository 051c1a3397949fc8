"""The errors correct kernels make against the float64 reference: what the tolerances in
bench/measure/correctness.py are set above.

    python tests/benchmarks/reference_errors.py [--seq-lens 256,1024,2048] [--variants naive,sdpa.math,chunked.online]

For each dtype, length, mask (none, causal) and variant, a forward and backward on the CPU
(batch 1, 2 heads, d = 64): the output's relative Frobenius error and 1 - cosine, and the
worst gradient's.  It measures; it asserts nothing.
"""

from __future__ import annotations

import argparse

from tabulate import tabulate

from bench.api import discover
from bench.case import Case
from bench.measure.bound import bind_variant
from bench.measure.correctness import run_and_check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-lens", default="256,1024,2048")
    ap.add_argument("--variants", default="naive,sdpa.math,chunked.online")
    args = ap.parse_args()
    registry = discover(entry_points=False)
    table = []
    for dtype in ("bfloat16", "float16", "float32"):
        for n in (int(x) for x in args.seq_lens.split(",")):
            for mask in ("none", "causal"):
                for name in args.variants.split(","):
                    case = Case("cpu", dtype, 1, 2, 2, n, n, 64, mask, None, "fwd+bwd")
                    bound = bind_variant(registry[name], case)
                    with bound.scope():
                        r = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out)
                    table.append([dtype, n, mask, name, f"{r.rel_err:.2e}", f"{1 - r.cosine:.1e}",
                                  f"{r.grad_rel_err:.2e}", f"{1 - r.grad_cosine:.1e}", r.ok])
    print(tabulate(table, headers=["dtype", "n", "mask", "variant", "out rel err", "out 1-cos", "grad rel err",
                                   "grad 1-cos", "ok"], tablefmt="github"))


if __name__ == "__main__":
    main()
