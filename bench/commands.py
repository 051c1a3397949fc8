"""Sub-command parsers other than ``list`` (which lives in bench.cli)."""

from __future__ import annotations


def _sweep(args):
    from bench.sweep import run_sweep

    return run_sweep(args)


def add_case_flags(p, with_lists: bool = True) -> None:
    """The sweep's axis flags: comma-separated lists, e.g. --seq-lens 512,1024."""
    a = p.add_argument
    a("--variants", help="comma-separated variant names (default: all registered)")
    a("--seq-lens", dest="seq_lens", help="query lengths, e.g. 512,1024,2048")
    a("--kv-lens", dest="kv_lens", help="key/value lengths for cross-attention (default: = seq len)")
    a("--heads", help="query heads")
    a("--kv-heads", dest="kv_heads", help="key/value heads for GQA (must divide heads; default: = heads)")
    a("--head-dims", dest="head_dims", help="head dimensions")
    a("--batch", help="batch sizes")
    a("--dtypes", help="float32, float16, bfloat16 (fp32, fp16, bf16 accepted)")
    a("--masks", help="none, causal, window, padding")
    a("--window", help="sliding-window sizes for the window mask")
    a("--directions", help="fwd, bwd, fwd+bwd")
    a("--device", help="cpu or cuda (default: cuda when present, else cpu)")
    a("--plugin", action="append", default=[], metavar="PATH",
      help="a Python file with more variants (repeatable)")


def add_subcommands(sub) -> None:
    sp = sub.add_parser("sweep", help="run a sweep and write a run folder and its report")
    add_case_flags(sp)
    sp.add_argument("--preset", help="quick, default or full (default: default); sized per device")
    sp.add_argument("--config", metavar="FILE.toml", help="axis values and settings; flags override it")
    sp.add_argument("--out", metavar="DIR", help="run folder (default: runs/<timestamp>-<device>)")
    sp.add_argument("--resume", metavar="DIR", help="run only the cells DIR lacks, appending to it")
    sp.add_argument("--timeout", help="seconds per cell before it is killed (default: 300 CPU, 120 GPU)")
    sp.add_argument("--budget-ms", dest="budget_ms",
                    help="timing budget per cell in ms (default: the preset's)")
    sp.add_argument("--profile", action="store_true",
                    help="add a separate profiled pass per cell (category shares as columns)")
    sp.add_argument("--no-report", dest="no_report", action="store_true", help="skip the report")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(func=_sweep)
