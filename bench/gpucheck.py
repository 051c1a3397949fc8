"""``python -m bench gpu-check``: exercise every CUDA path on one NVIDIA GPU and end with a
short table.  Every variant x mask x fwd/bwd in bf16 and fp16 (with the reference check,
the L2-flushed CUDA-event timer, the memory pass and a profiled pass with CUDA activity),
a cross-attention/GQA sweep, a scaling sweep, profiler traces, the timer self-check
against torch.utils.benchmark and triton.testing.do_bench, and the reports.

``--device cpu`` runs the same steps at a small size on the CPU: a dry run of the script
itself, so that only the CUDA calls are left for the GPU."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from tabulate import tabulate

from bench import store
from bench.case import Case
from bench.errors import UsageError

SCALING_VARIANTS = ["naive", "sdpa.flash", "sdpa.efficient", "sdpa.cudnn", "xformers", "flex.window",
                    "window.chunked"]


def _gpu_banner() -> None:
    from bench.timing import L2_FLUSH_BYTES

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0)
    print(f"GPU: {torch.cuda.get_device_name()} (capability {props.major}.{props.minor}, "
          f"{props.total_memory / 2**30:.0f} GiB, L2 {l2 / 2**20:.0f} MiB; flush buffer "
          f"{L2_FLUSH_BYTES / 2**20:.0f} MiB{'' if L2_FLUSH_BYTES > l2 else ' - SMALLER THAN L2'})", flush=True)


def run_gpu_check(out: Path, seq_len: int = 2048, device: str = "cuda", variants: list[str] | None = None) -> int:
    from bench.cli import main
    from bench.profile import profile_case
    from bench.registry import available, discover
    from bench.selfcheck import check_cell

    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("gpu-check needs an NVIDIA GPU; torch.cuda.is_available() is False here "
                             "(--device cpu runs the same steps on the CPU as a dry run)")
        _gpu_banner()
    out.mkdir(parents=True, exist_ok=True)
    registry = discover()
    names = variants or registry.names()
    pick = ["--variants", ",".join(names)]
    small = max(16, seq_len // 2)
    common = ["--device", device, "--heads", "8", "--head-dims", "64", "--batch", "2",
              "--window", str(max(8, seq_len // 8)), "--quiet"]
    if device == "cpu":  # a dry run: the steps, not the numbers
        common += ["--budget-ms", "10"]
    matrix = out / "matrix"
    rc = main(["sweep", "--out", str(matrix), "--seq-lens", str(seq_len), "--dtypes", "bf16,fp16",
               "--masks", "none,causal,window,padding", "--directions", "fwd,bwd", "--profile", *pick, *common])
    rc |= main(["sweep", "--out", str(out / "cross"), "--seq-lens", str(small), "--kv-lens", str(3 * small),
                "--kv-heads", "2", "--dtypes", "bf16", "--masks", "none,causal,padding",
                "--directions", "fwd,bwd", *pick, *common])
    scaling = [v for v in SCALING_VARIANTS if v in names] or names
    rc |= main(["sweep", "--out", str(out / "scaling"), "--variants", ",".join(scaling),
                "--seq-lens", ",".join(str(seq_len * f // 2) for f in (1, 2, 4, 8, 16)),
                "--dtypes", "bf16", "--masks", "window", "--directions", "fwd", *common])
    dtype = "bfloat16"
    checks = []
    for name in [n for n in ("naive", "sdpa.flash", "sdpa.math") if n in names] or names[:2]:
        case = Case(device, dtype, 2, 8, 8, seq_len, seq_len, 64, "causal", None, "fwd")
        if not available(registry[name], case)[0]:
            continue
        res = profile_case(registry[name], case, out)
        cats = ", ".join(f"{c} {s:.0f}%" for c, s in res["categories"].items() if s >= 1)
        print(f"profile {name}: {cats}; trace {res['trace'].name}")
        checks.append(check_cell(registry[name], case, 300.0 if device == "cuda" else 30.0))
    print(tabulate(pd.DataFrame(checks), headers="keys", showindex=False, floatfmt=".4g"))
    df = pd.DataFrame(store.read_rows(matrix) + store.read_rows(out / "cross"))
    df["cell"] = [f"{m:.3g} ms" if s == "ok" else s for m, s in zip(df["median_ms"], df["status"])]
    df["where"] = df["dtype"].str.replace("float", "f") + " " + df["direction"] + \
        df["kv_len"].ne(df["q_len"]).map({True: " cross+gqa", False: ""})
    table = df.pivot_table(index=["variant", "mask"], columns="where", values="cell", aggfunc="first")
    print(f"\nstatus and median per cell (b=2, h=8, d=64; n={seq_len}, cross: q={small} kv={3 * small}):")
    print(tabulate(table.reset_index(), headers="keys", showindex=False))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in df["status"].value_counts().items()))
    return rc
