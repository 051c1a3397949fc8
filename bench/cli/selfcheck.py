"""``python -m bench selfcheck``: the harness's median next to torch.utils.benchmark's (and
triton's do_bench on a GPU), in interleaved rounds."""

from __future__ import annotations

from bench.cli.common import add_setting_flags, case_spec


def command(args):
    import sys

    from tabulate import tabulate

    from bench.model.parsers import positive

    budget = positive("milliseconds")(args.budget_ms, "--budget-ms")
    from bench.features.selfcheck import check_cell, default_cases, under_heaps
    from bench.model.registry import available

    if any(getattr(args, k) for k in ("variants", "seq_lens", "heads", "head_dims", "masks", "dtypes")):
        registry, spec = case_spec(args, {"seq_lens": "1024", "heads": "8", "head_dims": "64",
                                          "batch": "1", "masks": "none", "directions": "fwd"})
        cells = [(name, case) for case in spec.cases() for name in spec.variants]
    else:
        from bench.engine.discovery import discover
        from bench.model.specbuild import default_device

        registry = discover(args.plugin)
        cells = default_cases(registry, args.device or default_device())
    rows, runnable = [], []
    for name, case in cells:
        ok, why = available(registry[name], case, one_process=True)
        if not ok:
            print(f"{name} {case.label()}: unsupported: {why}")
            continue
        runnable.append((name, case))
    cpu = [c for c in runnable if c[1].device == "cpu"]
    if cpu:  # each heap in a process of its own (bench.features.selfcheck.under_heaps)
        rows += under_heaps(cpu, budget, list(getattr(args, "plugin", None) or ()))
    rows += [check_cell(registry[name], case, budget) for name, case in runnable if case.device != "cpu"]
    for r in rows:
        for tool in ("tub", "do_bench"):
            if f"ratio_{tool}" in r:
                r[f"spread_{tool}"] = f"{r[f'ratio_{tool}_lo']:.3f}-{r[f'ratio_{tool}_hi']:.3f}"
    headers = {"variant": "variant", "case": "case", "heap": "heap", "harness_ms": "harness median ms",
               "harness_iqr_ms": "IQR", "tub_ms": "torch.utils.benchmark ms", "ratio_tub": "ratio",
               "spread_tub": "per-round", "do_bench_ms": "do_bench ms", "ratio_do_bench": "ratio",
               "spread_do_bench": "per-round", "other_cpu": "other CPU (cores)", "contended": "contended"}
    table = [[r.get(k, "") for k in headers if any(k in x for x in rows)] for r in rows]
    print(tabulate(table, headers=[v for k, v in headers.items() if any(k in x for x in rows)],
                   floatfmt=".4g"))
    print(f"ratio = harness median / reference tool median (1.00 = same figure): the median of the "
          f"per-round ratios, the tools taking turns in {rows[0]['rounds'] if rows else 3} interleaved rounds")
    crossed = [r for r in rows if "default_process" in r]
    if crossed:
        print("heap: each CPU cell twice, each time both tools in one fresh process, under the heap the sweep's "
              "workers keep (fixed, --heap's default) and under glibc's own (system, as a default process has); "
              "the sweep's figure over a default process's (harness under fixed / torch.utils.benchmark under "
              "system): " + ", ".join(f"{r['variant']} {r['case']} {r['default_process']:.2f}" for r in crossed))
    if any(r.get("contended") for r in rows):
        print("warning: the machine was shared during the check (contended): both tools were hit alike, so "
              "their agreement says nothing about either; rerun on a quiet machine or with --threads",
              file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    sc = sub.add_parser("selfcheck", help="the harness's median next to torch.utils.benchmark's (and do_bench's)")
    add_setting_flags(sc, case_only=True)
    sc.add_argument("--budget-ms", dest="budget_ms", default="1000", help="timing budget per tool (ms)")
    sc.set_defaults(func=command)
