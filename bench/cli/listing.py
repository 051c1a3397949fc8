"""``python -m bench list``: the registered variants, their capabilities and whether they run
here; ``--masks``: the masks and score mods a sweep can use; ``--models``: the published model
shapes ``sweep --model`` takes; ``--anchors``: the published figures ``sweep --anchors`` times
against."""

from __future__ import annotations

import json

from bench.cli.common import yn


def add_parser(sub) -> None:
    lp = sub.add_parser("list", help="the registered variants, their capabilities and availability")
    lp.add_argument("--format", choices=("table", "json"), default="table")
    lp.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="check availability on this device (default: cuda if present, else cpu)")
    lp.add_argument("--plugin", action="append", default=[], metavar="PATH",
                    help="a Python file with more variants (repeatable)")
    lp.add_argument("--masks", action="store_true",
                    help="list the masks and score mods (built-in and plugins') instead of the variants")
    lp.add_argument("--models", action="store_true",
                    help="list the published model shapes sweep --model takes, with their sources")
    lp.add_argument("--anchors", action="store_true",
                    help="list the published figures sweep --anchors (and, on a GPU, --preset anchors) times against, "
                         "with their shapes, hardware and sources")
    lp.set_defaults(func=command)


def command(args) -> int:
    from tabulate import tabulate

    from bench.engine.discovery import discover

    if args.models:
        return _list_models(args)
    if args.anchors:
        return _list_anchors(args)
    reg = discover(args.plugin)
    if args.masks:
        return _list_masks(args, reg)
    rows = []
    for v in reg:
        ok, why = availability_on_this_machine(v, args.device)
        bwd_ok, bwd_why = availability_on_this_machine(v, args.device, direction="bwd") if v.backward else (False, "")
        # what a sweep here would record: the declared backward only where it runs here
        rows.append(v.capabilities() | {"available": ok, "reason": why, "backward_here": ok and bwd_ok,
                                        "backward_reason": "" if bwd_ok else bwd_why})
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    table = [[r["name"] + (" *" if r["baseline"] else "") + (" ~" if r["approximate"] else ""), ",".join(r["devices"]),
              ",".join(d.replace("float", "f") for d in r["dtypes"]),
              ",".join(r["masks"] + [f"+{m}" for m in r["score_mods"]]), yn(r["cross"]), yn(r["gqa"]),
              yn(r["backward_here"]) if r["backward"] == r["backward_here"] or not r["available"] else "not here",
              "yes" if r["available"] else "no", r["reason"] or r["description"]]
             for r in rows]
    print(tabulate(table, headers=["variant", "devices", "dtypes", "masks", "cross", "gqa", "bwd",
                                   "available", "description / reason unavailable"],
                   maxcolwidths=[None] * 8 + [70]))
    print(f"\n{len(rows)} variants, {sum(r['available'] for r in rows)} available on "
          f"{rows and _device_label(args.device)}; * marks the baseline, ~ an approximate variant (its error is "
          f"measured, held to its own budget)")
    return 0


def _list_masks(args, reg) -> int:
    """The masks and score mods a sweep can use (built-in, then plugins'), and who computes them."""
    from tabulate import tabulate

    from bench.model import masks

    rows = []
    for d in masks.catalogue().values():
        takes = [v.name for v in reg if (d.kind == "mask" and (masks.ANY in v.masks or d.name in v.masks))
                 or (d.kind == "score_mod" and (masks.ANY in v.score_mods or d.name in v.score_mods
                                                or (d.additive and masks.ADDITIVE in v.score_mods))
                     and (v.sinks or not d.sink))]
        rows.append({"name": d.name, "kind": "learned sink" if d.sink else d.kind.replace("_", " "), "params": d.params,
                     "ranges": {k: r.text() for k, r in d.ranges.items()},
                     "spelling": d.signature(), "variants": takes, "description": d.description,
                     "source": d.module})
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=list))
        return 0
    print(tabulate([[r["spelling"], r["kind"], ", ".join(f"{k} {v}" for k, v in r["ranges"].items()) or "-",
                     r["description"], ", ".join(r["variants"])] for r in rows],
                   headers=["name:parameters (defaults)", "kind", "valid values", "definition", "variants"],
                   maxcolwidths=[34, None, 24, 56, 30]))
    print("\nSpell one in --masks as name:value (positional) or name:key=value; join terms with +: masks "
          "joined are unioned, score mods apply in order, e.g. --masks causal,document:4,sink:4+window:256,"
          "causal+softcap:50")
    return 0


def _list_models(args) -> int:
    """The published model shapes ``sweep --model`` takes."""
    from tabulate import tabulate

    from bench.model.models import MODELS

    rows = [m.row() | {"note": m.note} for m in MODELS.values()]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(tabulate([{k: v for k, v in r.items() if k != "note"} for r in rows], headers="keys",
                   maxcolwidths=[None, None, None, None, 30, None, 24, 44]))
    for r in rows:
        if r["note"]:
            print(f"\n{r['model']}: {r['note']}")
    print("\nsweep --model NAME sets the heads, KV heads, head dims, masks and dtype; the preset gives the lengths, "
          "and flags override the model (--model gemma2-9b --masks causal+softcap:50); --total-tokens T keeps the "
          "tokens per cell fixed: batch = T // n.")
    return 0


def _list_anchors(args) -> int:
    """The published anchors: each shape, its figure, the hardware and the source."""
    from tabulate import tabulate

    from bench.model.anchors import ANCHORS

    rows = [{"anchor": a.name, "kernel": a.kernel,
             "shape": f"{a.batch}x{a.heads}/{a.kvh}x{a.q_len}/{a.kv}x{a.head_dim}"
                      f"{f'/{a.head_dim_v}' if a.head_dim_v else ''}",
             "mask": a.mask if a.align == "top-left" else f"{a.mask} {a.align}", "direction": a.direction,
             "dtype": a.dtype, "figure": f"{a.figure:g} {a.unit}", "hardware": a.hardware,
             "published ms": round(a.published_ms(), 4), "source": a.source, "note": a.note} for a in ANCHORS]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    print(tabulate([{k: v for k, v in r.items() if k not in ("note", "source")} for r in rows], headers="keys"))
    print("\nshape: batch x heads/KV heads x q/kv tokens x head dim. published ms: the time the figure implies at the "
          "shape, counted as its source counts (bench.model.anchors). Sources:")
    for source in dict.fromkeys(r["source"] for r in rows):
        print(f"  {source}: {', '.join(r['anchor'] for r in rows if r['source'] == source)}")
    print("\nsweep --anchors NAME,... (or all), or --preset anchors, on a GPU; the report gives measured / published.")
    return 0


def _device_label(device):
    from bench.model.specbuild import default_device

    return device or default_device()


def availability_on_this_machine(v, device: str | None = None, direction: str = "fwd") -> tuple[bool, str]:
    """Availability for a representative case of ``v`` on ``device``: the variant's own
    first mask and dtype, ``direction``, at a modest size."""
    from bench.model.case import Case
    from bench.model.registry import available
    from bench.model.specbuild import default_device

    device = device or default_device()
    dtype = "float32" if device == "cpu" else "bfloat16"
    if dtype not in v.dtypes:
        dtype = v.dtypes[0]
    mask = v.default_mask
    case = Case(device=device, dtype=dtype, batch=1, heads=8, kv_heads=8, q_len=256, kv_len=256,
                head_dim=64, mask=mask, window=64 if mask == "window" else None, direction=direction)
    return available(v, case)
