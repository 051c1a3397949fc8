"""``python -m bench gpu-check``: exercise every CUDA path on one NVIDIA GPU and end with a
short table.  Every variant x mask x fwd/bwd in bf16 and fp16 (with the reference check,
the L2-flushed CUDA-event timer, the memory pass and a profiled pass with CUDA activity),
a scaling sweep, profiler traces, the timer self-check against torch.utils.benchmark and
triton.testing.do_bench, and the report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tabulate import tabulate

from bench import store
from bench.errors import UsageError


def run_gpu_check(out: Path, seq_len: int = 2048) -> int:
    from bench.cli import main
    from bench.profile import profile_case
    from bench.registry import discover
    from bench.selfcheck import check_cell, default_cases
    from bench.timing import L2_FLUSH_BYTES

    if not torch.cuda.is_available():
        raise UsageError("gpu-check needs an NVIDIA GPU; torch.cuda.is_available() is False here")
    out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0)
    print(f"GPU: {torch.cuda.get_device_name()} (capability {props.major}.{props.minor}, "
          f"{props.total_memory / 2**30:.0f} GiB, L2 {l2 / 2**20:.0f} MiB; flush buffer "
          f"{L2_FLUSH_BYTES / 2**20:.0f} MiB{'' if L2_FLUSH_BYTES > l2 else ' - SMALLER THAN L2'})", flush=True)
    matrix = out / "matrix"
    common = ["--device", "cuda", "--heads", "8", "--head-dims", "64", "--batch", "2", "--window", "256",
              "--quiet"]
    rc = main(["sweep", "--out", str(matrix), "--seq-lens", str(seq_len), "--dtypes", "bf16,fp16",
               "--masks", "none,causal,window,padding", "--directions", "fwd,bwd", "--profile", *common])
    rc |= main(["sweep", "--out", str(out / "cross"), "--seq-lens", "1024", "--kv-lens", "3072",
                "--kv-heads", "2", "--dtypes", "bf16", "--masks", "none,causal,padding",
                "--directions", "fwd,bwd", *common])
    rc |= main(["sweep", "--out", str(out / "scaling"), "--seq-lens", "1024,2048,4096,8192,16384",
                "--variants", "naive,sdpa.flash,sdpa.efficient,sdpa.cudnn,xformers,flex.window,window.chunked",
                "--dtypes", "bf16", "--masks", "window", "--directions", "fwd", *common])
    registry = discover()
    for name in ("naive", "sdpa.flash"):
        from bench.case import Case

        case = Case("cuda", "bfloat16", 2, 8, 8, seq_len, seq_len, 64, "causal", None, "fwd")
        res = profile_case(registry[name], case, out)
        cats = ", ".join(f"{c} {s:.0f}%" for c, s in res["categories"].items() if s >= 1)
        print(f"profile {name}: {cats}; trace {res['trace'].name}")
    checks = [check_cell(registry[n], c, 200.0) for n, c in default_cases("cuda")]
    print(tabulate(pd.DataFrame(checks), headers="keys", showindex=False, floatfmt=".4g"))
    rows = store.read_rows(matrix) + store.read_rows(out / "cross")
    df = pd.DataFrame(rows)
    df["cell"] = [f"{m:.3g} ms" if s == "ok" else s for m, s in zip(df.get("median_ms"), df["status"])]
    df["where"] = df["dtype"].str.replace("float", "f") + " " + df["direction"]
    table = df.pivot_table(index=["variant", "mask"], columns="where", values="cell", aggfunc="first")
    print(f"\nstatus and median per cell at n={seq_len} (b=2, h=8, d=64):")
    print(tabulate(table.reset_index(), headers="keys", showindex=False))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in df["status"].value_counts().items()))
    return rc
