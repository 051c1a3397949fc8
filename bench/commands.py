"""Sub-command parsers other than ``list`` (which lives in bench.cli)."""

from __future__ import annotations

from pathlib import Path


def _sweep(args):
    from bench.runner import prestart

    prestart()  # the worker imports torch while this process does the same
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
    a("--masks", help="masks with their parameters, e.g. none,causal,window:256,document:4,causal+softcap:50 "
                      "(python -m bench list --masks)")
    a("--window", help="sliding-window sizes for a bare window mask (window:256 names its own)")
    a("--directions", help="fwd, bwd, fwd+bwd")
    a("--device", help="cpu or cuda (default: cuda when present, else cpu)")
    a("--plugin", action="append", default=[], metavar="PATH",
      help="a Python file with more variants (repeatable)")


def add_subcommands(sub) -> None:
    sp = sub.add_parser("sweep", help="run a sweep and write a run folder and its report")
    add_case_flags(sp)
    sp.add_argument("--preset", help="quick, default, full or decode (default: default); sized per device")
    sp.add_argument("--config", metavar="FILE.toml", help="axis values and settings; flags override it")
    sp.add_argument("--out", metavar="DIR", help="run folder (default: runs/<timestamp>-<device>)")
    sp.add_argument("--resume", metavar="DIR", help="run only the cells DIR lacks, appending to it")
    sp.add_argument("--retry", metavar="STATUSES",
                    help="with --resume: measure again the cells whose row has one of these statuses, e.g. "
                         "crash,timeout,oom (the old rows stay in the file; reports use the newest)")
    sp.add_argument("--allow-env-change", dest="allow_env_change", action="store_true",
                    help="with --resume: go on although this machine's fingerprint differs from the run's "
                         "(the report marks the run mixed)")
    sp.add_argument("--timeout", help="seconds per cell before it is killed (default: 300 CPU, 120 GPU)")
    sp.add_argument("--budget-ms", dest="budget_ms",
                    help="timing budget per cell in ms (default: the preset's)")
    sp.add_argument("--threads", help="torch threads in the worker (default: torch's, one per core); fewer "
                    "than the cores leaves room for other processes on a shared machine")
    sp.add_argument("--precision", help="CPU: stop sampling when the 95%% CI of the median is within "
                    "+-PCT%% of it (default 2), or when the budget is spent")
    sp.add_argument("--rounds", help="interleaved rounds per case: its variants take turns, A B C A B C "
                    "(default 3)")
    sp.add_argument("--profile", action="store_true",
                    help="profile every ok cell once the timing is done (category shares in "
                         "profile.jsonl, a breakdown chart in the report)")
    sp.add_argument("--no-report", dest="no_report", action="store_true", help="skip the report")
    sp.add_argument("--strict", action="store_true",
                    help="exit 1 when any cell is error, crash, timeout, mismatch or oom, or unsupported "
                         "without a reason")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.set_defaults(func=_sweep)
    add_report_commands(sub)
    add_tool_commands(sub)


def _report(args):
    from bench.store import DEFAULT_ROOT, writable_dir
    from reports.build import build_report

    runs = args.runs or [str(DEFAULT_ROOT / "latest")]
    out = writable_dir(args.out) if args.out else None
    print(f"report: {build_report(runs, out)}")
    return 0


def parse_regression(text: str | None) -> tuple[str, float] | None:
    """``--fail-on-regression``: ``PCT``, ``PCT%`` or ``METRIC:PCT%`` (metric median or min)."""
    from bench.errors import UsageError

    if text is None:
        return None
    metric, _, pct = str(text).rpartition(":")
    metric = metric or "median"
    try:
        value = float(pct.strip().removesuffix("%"))
    except ValueError:
        value = float("nan")
    if metric not in ("median", "min") or not (value >= 0 and value < float("inf")):
        raise UsageError(f"--fail-on-regression takes PCT, PCT% or METRIC:PCT% with METRIC median or min and "
                         f"PCT a number >= 0 (e.g. median:5%), got {text!r}")
    return metric, value


def _compare(args):
    import sys

    from tabulate import tabulate

    from bench.store import require_run, writable_dir
    from reports.compare import compare_runs

    rule = parse_regression(args.fail_on_regression)
    require_run(args.run_b)
    out = writable_dir(args.out if args.out else Path(args.run_b) / "compare")
    m, regressions, warnings, chart = compare_runs(args.run_a, args.run_b, out, rule)
    for w in warnings:
        print(f"warning: the environments differ: {w}", file=sys.stderr)
    if m.empty:
        print("no matching ok cells between the two runs: no cell has the same variant and case, "
              "with status ok, in both", file=sys.stderr)
        return 3 if rule else 0
    cols = ["variant", "dtype", "mask", "direction", "q_len", "median_ms_a", "median_ms_b", "ratio", "verdict"]
    print(tabulate(m[cols], headers=["variant", "dtype", "mask", "dir", "n", "A ms", "B ms", "B/A", "verdict"],
                   showindex=False, floatfmt=".4g"))
    counts = m["verdict"].value_counts()
    print(f"Better {counts.get('faster', 0)}, Same {counts.get('within noise', 0)}, Worse {counts.get('slower', 0)} "
          f"(of {len(m)} matching cells; chart: {chart})")
    if rule and len(regressions):
        beyond = "beyond noise" if rule[0] == "median" else "in their fastest sample"
        print(f"{len(regressions)} cell(s) slower by more than {rule[1]:g}% {beyond} ({rule[0]})", file=sys.stderr)
        return 1
    return 0


def add_report_commands(sub) -> None:
    rp = sub.add_parser("report", help="(re)build the report of one or more run folders")
    rp.add_argument("runs", nargs="*", metavar="RUN",
                    help="run folders, one report for all of them (default: runs/latest)")
    rp.add_argument("--out", metavar="DIR", help="report folder (default: RUN/report)")
    rp.set_defaults(func=_report)
    cp = sub.add_parser("compare", help="B/A time ratio per matching cell of two runs")
    cp.add_argument("run_a", metavar="RUN_A", help="the reference run folder")
    cp.add_argument("run_b", metavar="RUN_B", help="the run folder compared with it (B/A)")
    cp.add_argument("--fail-on-regression", dest="fail_on_regression", metavar="RULE",
                    help="exit 1 when a cell regressed: PCT, or median:PCT%% (B's first quartile more than "
                         "PCT%% above A's third), or min:PCT%% (B's fastest sample more than PCT%% above A's); "
                         "exit 3 when no cell matches")
    cp.add_argument("--out", metavar="DIR", help="where the table and chart go (default: RUN_B/compare)")
    cp.set_defaults(func=_compare)


def _case_spec(args, defaults: dict):
    """Cases from the sweep's case flags, for single-cell commands (profile, selfcheck)."""
    from bench.registry import discover
    from bench.spec import build_spec, default_device

    given = {k: getattr(args, k, None) for k in ("seq_lens", "kv_lens", "heads", "kv_heads", "head_dims",
                                                 "batch", "dtypes", "masks", "window", "directions",
                                                 "device", "variants")}
    device = given["device"] or default_device()
    for k, v in defaults.items():
        if given.get(k) is None:
            given[k] = v
    if given["dtypes"] is None:
        given["dtypes"] = "float32" if device == "cpu" else "bfloat16"
    registry = discover(args.plugin)
    return registry, build_spec(given | {"device": device}, registry)


def _profile(args):
    from bench import store
    from bench.errors import UsageError

    names = [args.variant] if args.variant else [v for v in (args.variants or "").split(",") if v]
    if not names:
        raise UsageError("profile: give --variant NAME (or --variants A,B); `python -m bench list` names them")
    args.variants = ",".join(names)
    registry, spec = _case_spec(args, {"seq_lens": "1024", "heads": "8", "head_dims": "64", "batch": "1",
                                       "masks": None, "window": "256", "directions": "fwd"})
    out = store.writable_dir(args.out) if args.out else store.new_run_dir(f"{spec.device}-profile", link_latest=False)
    for name in spec.variants:
        _profile_variant(registry[name], spec, args, out)
    return 0


def _profile_variant(variant, spec, args, out) -> None:
    from tabulate import tabulate

    from bench.profile import profile_case
    from bench.registry import available

    if args.masks is None:
        spec.masks = [variant.default_mask]
    for case in spec.cases():
        ok, why = available(variant, case)
        if not ok:
            print(f"{variant.name} {case.label()}: unsupported: {why}")
            continue
        res = profile_case(variant, case, out, top=args.top)
        unit = "self CUDA time" if case.device == "cuda" else "self CPU time"
        print(f"\n{variant.name}  {case.label()}  ({res['active_steps']} profiled steps, by {unit})")
        print(tabulate([[r["name"][:70], r["category"], r["calls"], r["self_us"] / 1e3, r["share_pct"]]
                        for r in res["top"]], headers=["operator / kernel", "category", "calls", "self ms",
                                                       "share %"], floatfmt=".3f"))
        print("by category: " + ", ".join(f"{c} {s:.1f}%" for c, s in res["categories"].items() if s > 0))
        print(f"trace: {res['trace']}  (open in https://ui.perfetto.dev or chrome://tracing)")
        print(f"breakdown: {res['csv']}")


def _selfcheck(args):
    import math
    import sys

    from tabulate import tabulate

    from bench.errors import UsageError

    try:
        budget = float(args.budget_ms)
    except ValueError:
        budget = math.nan
    if not 0 < budget < math.inf:
        raise UsageError(f"--budget-ms takes a positive number of milliseconds, got {args.budget_ms!r}")
    from bench.registry import available
    from bench.selfcheck import check_cell, default_cases

    if any(getattr(args, k) for k in ("variants", "seq_lens", "heads", "head_dims", "masks", "dtypes")):
        registry, spec = _case_spec(args, {"seq_lens": "1024", "heads": "8", "head_dims": "64",
                                           "batch": "1", "masks": "none", "directions": "fwd"})
        cells = [(name, case) for case in spec.cases() for name in spec.variants]
    else:
        from bench.registry import discover
        from bench.spec import default_device

        registry = discover(args.plugin)
        cells = default_cases(args.device or default_device())
    rows = []
    for name, case in cells:
        ok, why = available(registry[name], case)
        if not ok:
            print(f"{name} {case.label()}: unsupported: {why}")
            continue
        rows.append(check_cell(registry[name], case, budget))
    for r in rows:
        for tool in ("tub", "do_bench"):
            if f"ratio_{tool}" in r:
                r[f"spread_{tool}"] = f"{r[f'ratio_{tool}_lo']:.3f}-{r[f'ratio_{tool}_hi']:.3f}"
    headers = {"variant": "variant", "case": "case", "harness_ms": "harness median ms",
               "harness_iqr_ms": "IQR", "tub_ms": "torch.utils.benchmark ms", "ratio_tub": "ratio",
               "spread_tub": "per-round", "do_bench_ms": "do_bench ms", "ratio_do_bench": "ratio",
               "spread_do_bench": "per-round", "other_cpu": "other CPU (cores)", "contended": "contended"}
    table = [[r.get(k, "") for k in headers if any(k in x for x in rows)] for r in rows]
    print(tabulate(table, headers=[v for k, v in headers.items() if any(k in x for x in rows)],
                   floatfmt=".4g"))
    print(f"ratio = harness median / reference tool median (1.00 = same figure): the median of the "
          f"per-round ratios, the tools taking turns in {rows[0]['rounds'] if rows else 3} interleaved rounds")
    if any(r.get("contended") for r in rows):
        print("warning: the machine was shared during the check (contended): both tools were hit alike, so "
              "their agreement says nothing about either; rerun on a quiet machine or with --threads",
              file=sys.stderr)
    return 0


def _export(args):
    from bench.export import export
    from bench.store import require_run

    print(f"wrote {export(require_run(args.run), Path(args.out) if args.out else None)}")
    return 0


def _gpu_check(args):
    from bench.errors import UsageError
    from bench.gpucheck import run_gpu_check, run_quick_check

    out = Path(args.out) if args.out else None
    if args.quick:
        return run_quick_check(out, args.device)
    try:
        seq_len = int(args.seq_len)
    except ValueError:
        raise UsageError(f"--seq-len takes a positive whole number, got {args.seq_len!r}") from None
    if seq_len < 16:
        raise UsageError(f"--seq-len takes a whole number of 16 or more, got {seq_len}")
    variants = [v for v in (args.variants or "").split(",") if v] or None
    return run_gpu_check(out, seq_len, args.device, variants)


def add_tool_commands(sub) -> None:
    pp = sub.add_parser("profile", help="torch.profiler breakdown of one variant: top ops, categories, trace")
    pp.add_argument("--variant", help="the variant to profile (or --variants A,B for several)")
    add_case_flags(pp)
    pp.add_argument("--out", metavar="DIR", help="folder for the trace and CSV (default: a new run folder)")
    pp.add_argument("--top", type=int, default=15, help="operators to print (default 15)")
    pp.set_defaults(func=_profile)
    sc = sub.add_parser("selfcheck", help="the harness's median next to torch.utils.benchmark's (and do_bench's)")
    add_case_flags(sc)
    sc.add_argument("--budget-ms", dest="budget_ms", default="1000", help="timing budget per tool (ms)")
    sc.set_defaults(func=_selfcheck)
    ep = sub.add_parser("export", help="write a run in another tool's format")
    ep.add_argument("run", metavar="RUN", help="the run folder to export")
    ep.add_argument("--format", choices=("pytest-benchmark",), default="pytest-benchmark")
    ep.add_argument("--out", metavar="FILE", help="default: RUN/pytest-benchmark.json")
    ep.set_defaults(func=_export)
    gp = sub.add_parser("gpu-check", help="exercise every CUDA path on one NVIDIA GPU; ends with PASS or FAIL")
    gp.add_argument("--out", metavar="DIR",
                    help="a new or empty folder (default: a fresh runs/<timestamp>-gpu-check-...)")
    gp.add_argument("--quick", action="store_true",
                    help="the device acceptance check: five verdicts in about five minutes on an H200")
    gp.add_argument("--seq-len", dest="seq_len", default="2048")
    gp.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same steps at a small size, a dry run of the script itself")
    gp.add_argument("--variants", help="comma-separated subset (default: all)")
    gp.set_defaults(func=_gpu_check)
