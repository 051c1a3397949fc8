"""``python -m bench profile``: torch.profiler's breakdown of one or more variants on one case:
the top operators, the time by category, a trace."""

from __future__ import annotations

from bench.cli.common import add_setting_flags, case_spec
from bench.errors import UsageError


def command(args):
    from bench.model.parsers import number
    from bench.runs import store

    args.top = number(1, 10_000, True)(args.top, "--top")  # a count: never a negative slice
    names = [args.variant] if args.variant else [v for v in (args.variants or "").split(",") if v]
    if not names:
        raise UsageError("profile: give --variant NAME (or --variants A,B); `python -m bench list` names them")
    registry, spec = case_spec(args, {"seq_lens": "1024", "heads": "8", "head_dims": "64", "batch": "1",
                                      "window": "256", "directions": "fwd"}, variants=names)
    out = store.writable_dir(args.out) if args.out else store.new_run_dir(f"{spec.device}-profile", link_latest=False)
    for name in spec.variants:
        _profile_variant(registry[name], spec, args, out)
    return 0


def _profile_variant(variant, spec, args, out) -> None:
    from tabulate import tabulate

    from bench.features.profile.profiler import profile_case
    from bench.model.registry import available

    if args.masks is None:  # each variant on its own default mask
        spec = spec.replace(masks=[variant.default_mask])
    for case in spec.cases():
        ok, why = available(variant, case, one_process=True)
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


def add_parser(sub) -> None:
    pp = sub.add_parser("profile", help="torch.profiler breakdown of one variant: top ops, categories, trace")
    pp.add_argument("--variant", help="the variant to profile (or --variants A,B for several)")
    add_setting_flags(pp, case_only=True)
    pp.add_argument("--out", metavar="DIR", help="folder for the trace and CSV (default: a new run folder)")
    pp.add_argument("--top", default="15", help="operators to print, 1 to 10,000 (default 15)")
    pp.set_defaults(func=command)
