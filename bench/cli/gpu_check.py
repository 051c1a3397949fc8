"""``python -m bench gpu-check``: exercise every CUDA path on one NVIDIA GPU.

Full (for a person with a GPU and time): every variant x mask x fwd/bwd in bf16 and fp16
(with the reference check, the L2-flushed CUDA-event timer, the memory pass and a profiled
pass with CUDA activity), a cross-attention/GQA sweep, a mixed serving batch (--batch-mix, every
variant that takes one, fwd and bwd), scaling sweeps (causal for naive and
SDPA, window for the windowed variants), profiler traces, the timer self-check against
torch.utils.benchmark and triton.testing.do_bench, and the reports.

``--quick``: the device acceptance check, seven verdicts in about five minutes on an H200,
each printed and written to quick-check.json as it is reached (bench/README.md "On a GPU" lists
them): the variant matrix (the compiled variants' part last), the best SDPA backend against
its share of the measured matmul peak and the kernels each ran, memory exponents, timer
agreement, a profiler trace, NVML's fields with CUDA-graph timing on a sub-0.1 ms cell forward
and backward, and the ragged (SDPA's nested tensors) and paged (flex) workloads.

Both end with one ``PASS`` or ``FAIL: ...`` line and exit non-zero on a failure.
``--device cpu`` runs the same steps at small sizes on the CPU: a rehearsal of the script
itself, with the thresholds that only a GPU can meet relaxed (QUICK["cpu"]); the full
check's matrix there takes one dtype, and its scaling sweeps draw no report.  Every run
writes into a fresh timestamped folder (or the ``--out`` given).  With more than one GPU,
the full check also runs a sweep with one worker per GPU (``--gpus all``).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench.errors import UsageError
from bench.model.case import FP8, Case
from bench.model.registry import CHECKS
from bench.runs import store
from bench.runs.judge import acceptance

SCALING_MASKS = ("causal", "window")  # the full check's scaling sweeps: the variants that declare scaling-MASK


def taking(registry, step: str, names=None) -> list[str]:
    """The variants (of ``names``, or all) that declare they take part in the check's ``step``
    (``variant(..., checks=(...))``; the steps are ``bench.model.registry.CHECKS``), in the registry's
    order."""
    assert step in CHECKS, step
    return [n for n in (registry.names() if names is None else names)
            if n in registry and step in registry[n].traits.checks]


GPU_TIMEOUT_S = 300.0  # a cold flex forward+backward compile takes 20-35 s on its own

QUICK = {  # the quick check's sizes per device (its thresholds are bench.runs.judge's)
    "cuda": dict(n=1024, big=dict(batch=4, heads=16, q_len=8192, kv_len=8192, head_dim=128),
                 scaling=[1024, 2048, 4096, 8192], scaling_heads=16, scaling_dim=128,
                 timer=dict(batch=1, heads=16, q_len=4096, kv_len=4096, head_dim=128), budget_ms=50.0,
                 dtype="bfloat16"),
    "cpu": dict(n=64, big=dict(batch=1, heads=4, q_len=512, kv_len=512, head_dim=64),
                scaling=[1024, 2048, 4096], scaling_heads=2, scaling_dim=64,
                timer=dict(batch=1, heads=4, q_len=256, kv_len=256, head_dim=64), budget_ms=20.0,
                dtype="float32"),
}


def _gpu_banner() -> None:
    import torch

    from bench.measure.timing import L2_FLUSH_BYTES

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0)
    print(f"GPU: {torch.cuda.get_device_name()} (capability {props.major}.{props.minor}, "
          f"{props.total_memory / 2**30:.0f} GiB, L2 {l2 / 2**20:.0f} MiB; flush buffer "
          f"{L2_FLUSH_BYTES / 2**20:.0f} MiB{'' if L2_FLUSH_BYTES > l2 else ' - SMALLER THAN L2'})", flush=True)


def _prepare(out: Path | None, device: str, label: str) -> Path:
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("gpu-check needs an NVIDIA GPU; torch.cuda.is_available() is False here "
                             "(--device cpu runs the same steps on the CPU as a dry run)")
        _gpu_banner()
    if out is None:
        return store.new_run_dir(f"{label}-{device}", link_latest=False)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: exists and is not empty; gpu-check measures into a fresh folder "
                         f"(leave --out out for a new timestamped one)")
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclass(frozen=True)
class Step:
    """One sweep of a check, as data: the folder it writes under the check's folder and its
    settings (the keys a TOML config or ``parse_values`` takes).  ``run`` measures it through the
    Python API (bench.api) and ``spec`` is what the projection prices."""
    folder: str
    settings: dict
    report: bool = False  # draw its report (the full check on a GPU)

    def spec(self, registry, common: dict, here: bool = True):
        from bench.api import build_spec, parse_values

        return build_spec(parse_values(common | self.settings), registry, here=here)

    def run(self, out: Path, registry, common: dict) -> tuple[bool, list[dict]]:
        """(ran to the end, its rows); a refused setting is printed, not raised."""
        from bench.api import SweepOptions, build_report, run_sweep

        run_dir = out / self.folder
        try:
            spec = self.spec(registry, common)
            run_sweep(spec, run_dir, SweepOptions(progress=False, given=common | self.settings, keep_workers=True,
                                                  command=f"gpu-check step {self.folder}"))
        except UsageError as exc:
            print(f"error: {self.folder}: {exc}", flush=True)
            return False, store.read_rows(run_dir) if run_dir.exists() else []
        if self.report:
            build_report([run_dir])
        return True, store.read_rows(run_dir)


def _start(out: Path | None, device: str, label: str):
    """The check's fresh folder and the registry of every installed variant."""
    from bench.engine.discovery import discover

    out = _prepare(out, device, label)
    print(f"{label} folder: {out}", flush=True)
    return out, discover()


def _exit_code(checks: list[tuple[str, bool, str]]) -> int:
    from tabulate import tabulate

    print(tabulate([[name, "ok" if ok else "FAIL", detail] for name, ok, detail in checks],
                   headers=["check", "result", "detail"], maxcolwidths=[None, None, 100]))
    failed = [name for name, ok, _ in checks if not ok]
    print("PASS" if not failed else "FAIL: " + "; ".join(failed))
    return 1 if failed else 0


def full_steps(names: list[str], seq_len: int, device: str, registry) -> list[Step]:
    """The full check's sweeps: the matrix, cross-attention with GQA, a mixed batch, and the scaling
    sweeps."""
    small = max(16, seq_len // 2)
    lengths = [seq_len * f // 2 for f in (1, 2, 4, 8, 16)]
    gpu = device == "cuda"
    steps = [Step("matrix", dict(variants=names, seq_lens=[seq_len], dtypes=["bf16", "fp16"] if gpu else ["bf16"],
                                 masks=["none", "causal", "window", "padding"], directions=["fwd", "bwd"]), True),
             Step("cross", dict(variants=names, seq_lens=[small], kv_lens=[3 * small], kv_heads=[2], dtypes=["bf16"],
                                masks=["none", "causal", "padding"], directions=["fwd", "bwd"]), True)]
    # a mixed serving batch (two prompts, a chunk against a cache, eight decodes) through every variant that takes
    # one packed (the quick check's five minutes hold no more: tests/model/test_mix.py checks the same paths on the CPU)
    mix = f"2x({small // 4}/{small // 4})+1x({max(2, small // 16)}/{small})+8x(1/{small})"
    steps.append(Step("mix", dict(variants=names, batch_mix=[mix], batch=None, kv_heads=[2], dtypes=["bf16"],
                                  masks=["none", "causal", "window"], directions=["fwd", "bwd"]), gpu))
    for mask in SCALING_MASKS:
        chosen = taking(registry, f"scaling-{mask}", names)
        if chosen:  # the CPU rehearsal draws no scaling report: the GPU's is the one
            steps.append(Step(f"scaling-{mask}", dict(variants=chosen, seq_lens=lengths, dtypes=["bf16"], masks=[mask],
                                                      directions=["fwd"]), gpu))
    return steps


def run_gpu_check(out: Path | None, seq_len: int = 2048, device: str = "cuda",
                  variants: list[str] | None = None) -> int:
    import pandas as pd
    import torch
    from tabulate import tabulate

    from bench.features.profile.profiler import profile_case
    from bench.features.selfcheck import check_cell
    from bench.model.registry import available

    out, registry = _start(out, device, "gpu-check")
    names = variants or registry.names()
    common = dict(device=device, heads=[8], head_dims=[64], batch=[2], window=[max(8, seq_len // 8)],
                  timeout=GPU_TIMEOUT_S, visits=1, **({"budget_ms": 10.0} if device == "cpu" else {}))
    steps = full_steps(names, seq_len, device, registry)
    ran, rows = {}, {}
    for step in steps:
        ran[step.folder], rows[step.folder] = step.run(out, registry, common)
    matrix, cross, mixed = rows["matrix"], rows["cross"], rows["mix"]
    scaling_rows = [r for step in steps if step.folder.startswith("scaling") for r in rows[step.folder]]
    checks, timer_rows = [], []
    if device == "cuda" and torch.cuda.device_count() > 1:  # one worker per GPU, cases dealt out
        n_gpus = torch.cuda.device_count()
        step = Step("workers", dict(variants=names, gpus="all", seq_lens=[seq_len * f // 2 for f in (1, 2, 4, 8, 16)],
                                    dtypes=["bf16"], masks=["causal"], directions=["fwd"]))
        whole, spread = step.run(out, registry, common)
        used = sorted({r.get("worker") for r in spread})
        keys = [(r["variant"], r["q_len"]) for r in spread]
        whole = whole and len(used) == n_gpus and len(keys) == len(set(keys))
        detail = f"rows from {', '.join(map(str, used))}; {len(keys)} rows, {len(set(keys))} cells"
        checks.append((f"one worker per GPU ({n_gpus})", whole, detail))
    dims = dict(batch=1, heads=16, head_dim=128) if device == "cuda" else dict(batch=1, heads=8, head_dim=64)
    n_timer = 4096 if device == "cuda" else seq_len  # cells of 0.5 ms and more on a GPU: a 3% verdict needs it
    for name in taking(registry, "profile", names) or names[:2]:
        case = Case(device, "bfloat16", q_len=n_timer, kv_len=n_timer, mask="causal", kv_heads=dims["heads"], **dims)
        if not available(registry[name], case)[0]:
            continue
        res = profile_case(registry[name], case, out)
        cats = ", ".join(f"{c} {s:.0f}%" for c, s in res["categories"].items() if s >= 1)
        print(f"profile {name}: {cats}; trace {res['trace'].name}")
        timer_rows.append(check_cell(registry[name], case, 300.0 if device == "cuda" else 30.0))
    print(tabulate(pd.DataFrame(timer_rows), headers="keys", showindex=False, floatfmt=".4g"))
    df = pd.DataFrame(matrix + cross)
    df["cell"] = [f"{m:.3g} ms" if s == "ok" else s for m, s in zip(df["median_ms"], df["status"])]
    df["where"] = df["dtype"].str.replace("float", "f") + " " + df["direction"] + \
        df["kv_len"].ne(df["q_len"]).map({True: " cross+gqa", False: ""})
    from reports.tables import cell_pivot

    small = max(16, seq_len // 2)
    table = cell_pivot(df, ["variant", "mask"], "where", "cell")
    print(f"\nstatus and median per cell (b=2, h=8, d=64; n={seq_len}, cross: q={small} kv={3 * small}):")
    print(tabulate(table.reset_index(), headers="keys", showindex=False))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in df["status"].value_counts().items()))
    bad = acceptance.failed_cells(matrix + cross + mixed + scaling_rows)
    checks.append(("every cell ok, or unsupported with a reason", not bad,
                   f"{len(bad)} failed: {bad[0]}" if bad else f"{len(df) + len(mixed) + len(scaling_rows)} cells"))
    ok_mixed = sorted({r["variant"] for r in mixed if r["status"] == "ok"})
    checks.append(("a mixed batch runs through a packed kernel", bool(ok_mixed),
                   f"ok: {', '.join(ok_mixed)}" if ok_mixed else "no variant ran the mixed batch"))
    stopped = [f for f, ok in ran.items() if not ok]
    checks.append(("every sweep ran to the end", not stopped, "refused: " + ", ".join(stopped) if stopped else
                   ", ".join(ran)))
    return _exit_code(checks)


def _fit(ns, ys) -> float:
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if n and y and y > 0]
    if len({x for x, _ in pts}) < 2:
        return math.nan
    return statistics.linear_regression([x for x, _ in pts], [y for _, y in pts]).slope


def quick_common(device: str) -> dict:
    q = QUICK[device]
    return dict(device=device, timeout=GPU_TIMEOUT_S, budget_ms=q["budget_ms"], dtypes=[q["dtype"]], visits=1)


def quick_steps(registry, device: str) -> dict[str, Step]:
    """The quick check's sweeps by verdict, as data: ``run_quick_check`` runs them and
    ``quick_projection`` prices the very same ones."""
    q, big = QUICK[device], QUICK[device]["big"]
    compiled = [n for n in registry.names() if registry[n].compiles and not registry[n].shard]
    matrix = dict(seq_lens=[q["n"]], heads=[8], head_dims=[64], batch=[2], window=[q["n"] // 4],
                  masks=["none", "causal", "window", "padding"], directions=["fwd", "bwd"])
    # sub-0.1 ms cells forward and backward: NVML's columns, and the CUDA-graph cross-check of both (a
    # backward is captured with its forward on the capturing stream); with a ragged batch beside the
    # fixed one, through SDPA's nested tensors (no host sync in the call, so it can be captured too)
    ragged = dict(variants=taking(registry, "tiny"), heads=[8], head_dims=[64], batch=[4], masks=["none"])
    tiny = dict(ragged, seq_lens=[128], lengths=["fixed", "lognormal:0.5"], directions=["fwd", "bwd"])
    steps = {
        # (the context-parallel variants run on their process group in --extra's ranks step)
        "matrix": Step("matrix", dict(variants=[n for n in registry.names() if not registry[n].compiles
                                                and not registry[n].shard], **matrix)),
        "peak": Step("peak", dict(variants=[v for v in registry.names() if registry[v].traits.peak_share],
                                  seq_lens=[big["q_len"]], heads=[big["heads"]],
                                  head_dims=[big["head_dim"]], batch=[big["batch"]], masks=["none"],
                                  directions=["fwd"])),
        "scaling": Step("scaling", dict(variants=[v for v in registry.names()
                                                  if registry[v].traits.memory_exponent(device)],
                                        seq_lens=q["scaling"], heads=[q["scaling_heads"]], head_dims=[q["scaling_dim"]],
                                        batch=[1], masks=["causal"], directions=["fwd"])),
    }
    if device == "cuda":  # the CPU has no NVML and no CUDA graphs
        steps["tiny"] = Step("tiny", tiny)
        steps["tiny-graph"] = Step("tiny-graph", dict(tiny, timer="graph"))
    else:  # the ragged batch alone, as the tiny sweeps hold it on a GPU
        steps["tiny"] = Step("tiny", dict(ragged, seq_lens=[q["n"]], lengths=["lognormal:0.5"], directions=["fwd"]))
    if device == "cuda" and taking(registry, "paged"):  # a paged cache read in place: its own pages only
        steps["paged"] = Step("paged", dict(variants=taking(registry, "paged"), seq_lens=[4], kv_lens=[4 * q["n"]],
                                            heads=[8], kv_heads=[2], head_dims=[64], batch=[4], kv_layout=["paged:16"],
                                            masks=["causal"], directions=["fwd"]))
    if compiled:  # last, so that the verdicts above are written whatever happens here; the CPU rehearsal
        # compiles for one mask (each compile takes seconds there, and the script is what it rehearses)
        masks_compiled = matrix["masks"] if device == "cuda" else ["causal"]
        steps["matrix-compiled"] = Step("matrix-compiled", dict(matrix, variants=compiled, masks=masks_compiled))
    return steps


def extra_steps(registry, device: str) -> dict[str, Step]:
    """``gpu-check --quick --extra``: the cheapest cell of each path the quick check does not reach,
    each a sweep of its own with its own verdict (every cell ok, or unsupported with a reason)."""
    q = QUICK[device]
    n = q["n"]
    base = dict(heads=[8], head_dims=[64], batch=[2], directions=["fwd"])
    steps = {
        # a learned sink from the log-sum-exp, forward and backward
        "sinks": Step("sinks", dict(base, variants=taking(registry, "sinks"), seq_lens=[n],
                                    masks=["causal+learned_sink"], directions=["fwd", "bwd"])),
        "mla": Step("mla", dict(base, variants=taking(registry, "mla"),
                                seq_lens=[n], head_dims=["192/128"], masks=["causal"])),
        "mix": Step("mix", dict(variants=taking(registry, "mix"), heads=[8], kv_heads=[2], head_dims=[64], batch=None,
                                batch_mix=[f"1x({n // 4}/{n // 4})+1x({n // 16}/{n})+4x(1/{n})"], masks=["causal"],
                                directions=["fwd"])),  # nested q != kv, and the block-diagonal masks
        "cross-gqa": Step("cross-gqa", dict(base, variants=taking(registry, "cross-gqa"), seq_lens=[n // 4],
                                            kv_lens=[n], kv_heads=[2], masks=["causal"],
                                            align=["bottom-right"])),  # causal_lower_right
        "ragged": Step("ragged", dict(base, variants=taking(registry, "ragged"), seq_lens=[n // 4],
                                      batch=[4], lengths=["lognormal:0.5"], masks=["none"])),
    }
    if device == "cuda":  # torch 2.11's flex decode with a large GQA group, and a paged cache of 64
        steps["decode-gqa"] = Step("decode-gqa", dict(variants=taking(registry, "decode-gqa"), seq_lens=[64],
                                                      kv_lens=[4 * n], heads=[32], kv_heads=[8], head_dims=[64],
                                                      batch=[1], masks=["causal"], align=["bottom-right"],
                                                      directions=["fwd"]))
        steps["paged-64"] = Step("paged-64", dict(variants=taking(registry, "paged-64"), seq_lens=[4],
                                                  kv_lens=[4 * n], heads=[8], kv_heads=[2], head_dims=[64], batch=[4],
                                                  kv_layout=["paged:64"], masks=["causal"], directions=["fwd"]))
    # the layer scopes, each forward and backward, around the plainest cores (a cell's three visits: the ab check)
    steps["layers"] = Step("layers", dict(base, variants=taking(registry, "layers"), seq_lens=[n // 4],
                                          masks=["causal"], scope=["block", "encoder", "decoder"],
                                          directions=["fwd", "bwd"]))
    if device == "cuda":  # a layer backward under the graph timer, fp8 in each variant that takes it, an anchor
        steps["layer-graph"] = Step("layer-graph", dict(base, variants=taking(registry, "layer-graph"),
                                                        seq_lens=[n // 4], masks=["causal"], scope=["block"],
                                                        directions=["bwd"], timer="graph"))
        steps["fp8"] = Step("fp8", dict(base, variants=[v for v in registry.names() if FP8 in registry[v].dtypes],
                                        seq_lens=[n], masks=["causal"], dtypes=[FP8]))
        steps["anchor"] = Step("anchor", dict(variants=taking(registry, "anchor"), dtypes=None, anchors=[ANCHOR]))
    # a context-parallel cell on its process group (NCCL on the GPU: one rank per GPU, so ranks 1 on one; gloo
    # beside it for the ranks' timing), forward and backward, causal on the zigzag split
    steps["ranks"] = Step("ranks", dict(base, variants=taking(registry, "ranks"), seq_lens=[n // 4], masks=["causal"],
                                        directions=["fwd+bwd"], ranks=[1] if device == "cuda" else [1, 2]))
    return {k: v for k, v in steps.items() if v.settings["variants"]}


ANCHOR = "fa3-h100-d128-512"  # the cheapest anchor: 16k tokens of FlashAttention-3's forward
EXTRA_CHECKS = {"sinks": "flex's learned sink from its log-sum-exp, fwd and bwd",
                "mla": "head dims 192/128 in flex, SDPA and cuDNN", "mix": "a mixed batch (q != kv, block-diagonal)",
                "cross-gqa": "GQA cross-attention aligned bottom-right (causal_lower_right)",
                "ragged": "a ragged batch through the pinned flash, efficient and cuDNN backends",
                "decode-gqa": "flex decode with a GQA group of 4 at 64 queries",
                "paged-64": "flex over a paged cache of 64-token pages",
                "layers": "block, encoder and decoder scopes, fwd and bwd, around naive and sdpa",
                "layer-graph": "a block's backward under the CUDA-graph timer, each part captured on its stream",
                "fp8": "float8_e4m3fn in each variant that takes it",
                "anchor": f"the published anchor {ANCHOR} (measured / published)",
                "ranks": "ring, Ulysses around flex and torch's context_parallel on their group, fwd+bwd causal"}


def run_extra_check(out: Path | None, device: str = "cuda") -> int:
    """The quick check's second step: a verdict per path, each printed and written to
    extra-check.json as it is reached."""
    out, registry = _start(out, device, "gpu-check --quick --extra")
    common = quick_common(device)
    steps = extra_steps(registry, device)
    checks = Verdicts(out / "extra-check.json")
    print(f"projected: {extra_projection(registry, device) / 60:.1f} min by the plan's cost model", flush=True)
    for i, (name, step) in enumerate(steps.items(), start=1):
        rows = step.run(out, registry, common)[1]
        check, ok, detail = acceptance.matrix_verdict(f"x{i} {EXTRA_CHECKS[name]}: ok or unsupported with a reason",
                                                      rows)
        if device == "cuda" and not any(r.get("status") == "ok" for r in rows):  # each path is there to run on a GPU
            ok, detail = False, f"no cell ran ({detail})"
        unprofiled = sorted({r["variant"] for r in rows if r.get("status") == "ok" and r.get("ranks")
                             and any(c is None for c in r.get("rank_collective_ms") or [None])})
        if ok and unprofiled:  # the ranks' profiled step (NCCL's kernels on a GPU) gave no time inside collectives
            ok, detail = False, f"no profiled step on the ranks of {', '.join(unprofiled)}"
        checks.add(check, ok, detail)
    for variant in taking(registry, "ab")[:1]:
        ok, detail = ab_check(out / "ab", device, variant)
        checks.add(f"x{len(steps) + 1} {AB_CHECK}: ok, every cell judged or undecided with its pairs", ok, detail)
    return _exit_code(checks.items)


AB_CHECK = "ab of this tree against a copy of it over two cells, two repeats (together: three visits each)"
# two repeats, each a server (an interpreter importing torch, ~5 s) whose sweep visits each cell in 3 fresh workers
# (the cost model's GPU worker start, 10 s each), and the ab process's own start: the starts dominate
AB_CHECK_S = {"cpu": 20.0, "cuda": 75.0}


def ab_flags(device: str, variant: str) -> list[str]:
    n = QUICK[device]["n"] // 4
    return ["--variants", variant, "--seq-lens", str(n), "--heads", "8", "--head-dims", "64", "--batch", "2",
            "--masks", "none,causal", "--dtypes", QUICK[device]["dtype"], "--directions", "fwd", "--device", device,
            "--budget-ms", str(QUICK[device]["budget_ms"]), "--repeats", "2", "--budget-s", "0"]


def ab_check(out: Path, device: str, variant: str) -> tuple[bool, str]:
    """``ab`` of this tree against a copy of it: the same harness, so B's variants/ is loaded beside
    A's (NAME@B) and each repeat's sweep visits every cell in three fresh workers (``--visits 3``),
    A and B in the same rounds; every cell in ab.json with its pairs, the command's exit 0."""
    import shutil
    import subprocess
    import sys

    from bench.features.ab import ROOT

    copy = out.parent / "ab-tree"
    for top in ("bench", "variants"):
        shutil.copytree(ROOT / top, copy / top, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    cmd = [sys.executable, "-m", "bench", "ab", str(ROOT), str(copy), *ab_flags(device, variant), "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0 or not (out / "ab.json").exists():
        return False, f"exit {done.returncode}: {(done.stderr.strip().splitlines() or ['no output'])[-1]}"
    table = json.loads((out / "ab.json").read_text())
    if len(table) != 2 or any(r["repeats"] < 2 or r.get("mode") != "together" for r in table):
        return False, f"{len(table)} cells in ab.json, pairs {[r['repeats'] for r in table]}"
    return True, ", ".join(f"{r['mask']} {r['verdict']} ({r['ratio']:.3f}, {r['repeats']} pairs)" for r in table)


def dry_run(registry, device: str, extra: bool) -> int:
    """Each step's cells and its projection, without running anything (any machine)."""
    steps = extra_steps(registry, device) if extra else quick_steps(registry, device)
    total = 0.0 if extra else QUICK_FIXED_S
    for name, n, wall, cells in steps_projection(steps, registry, device):
        total += wall
        print(f"{name}: {n} cells, {wall:.0f} s projected")
        for v, c in cells:
            print(f"  {v} {c.label()}")
    for variant in taking(registry, "ab")[:1] if extra else ():
        total += AB_CHECK_S[device]
        print(f"ab: 2 cells, {AB_CHECK_S[device]:.0f} s projected ({AB_CHECK})\n  python -m bench ab . COPY "
              + " ".join(ab_flags(device, variant)))
    what = "gpu-check --quick --extra" if extra else "gpu-check --quick"
    print(f"{what} on {device}: {total / 60:.1f} min projected" + ("" if extra else
          f" (of it {QUICK_FIXED_S:.0f} s for the timer checks and the profile; the limit: "
          f"{QUICK_LIMIT_S / 60:g} min)"))
    return 0


def run_quick_check(out: Path | None, device: str = "cuda") -> int:
    """The device acceptance check (module doc); returns the exit code."""
    q = QUICK[device]
    out, registry = _start(out, device, "gpu-check --quick")
    common = quick_common(device)
    steps = quick_steps(registry, device)
    checks = Verdicts(out / "quick-check.json")
    projected = quick_projection(registry, device)
    print(f"projected: {projected / 60:.1f} min by the plan's cost model (the limit on an H200: "
          f"{QUICK_LIMIT_S / 60:g} min)", flush=True)

    def rows(name: str) -> list[dict]:
        return steps[name].run(out, registry, common)[1] if name in steps else []

    # 1. every variant x mask x direction at n (FlexAttention's compiles last: the slowest part)
    checks.add(*acceptance.matrix_verdict("1 every variant x mask x fwd/bwd: ok or unsupported with a reason (an "
                                "approximation: or its accuracy verdict)", rows("matrix")))

    # 2. the best SDPA backend at a large size, against the matmul peak the sweep measured
    peak_rows = rows("peak")
    peak = (store.read_env(out / "peak").get("peaks_tflops") or {}).get(q["dtype"])
    shares = {n: registry[n].traits.peak_share for n in registry.names() if registry[n].traits.peak_share}
    relaxed = acceptance.threshold("best backend TFLOP/s", "cpu") if device == "cpu" else None
    checks.add(*acceptance.sdpa_verdict(peak_rows, peak, relaxed, shares))
    checks.add(*acceptance.kernel_verdict(peak_rows, device))

    _memory_exponents(checks, registry, rows("scaling"), device)  # 3
    _timer_agreement(checks, registry, device)  # 4
    _trace_check(checks, registry, device, out)  # 5

    # 6. a sub-0.1 ms cell: NVML's clocks, power and energy, and its time again as a CUDA graph
    tiny, tiny_graph = rows("tiny"), rows("tiny-graph")
    fixed = [r for r in tiny + tiny_graph if r.get("lengths", "fixed") == "fixed"]
    checks.add(*acceptance.gpu_state_verdict([r for r in fixed if r in tiny], [r for r in fixed if r in tiny_graph],
                                             device))

    # 7. the ragged and paged workloads: SDPA's nested tensors (timed by events and as a graph), flex
    # over a paged pool
    checks.add(*acceptance.workload_verdict([r for r in tiny + tiny_graph if r not in fixed], rows("paged"), device))

    if "matrix-compiled" in steps:
        compiled = steps["matrix-compiled"].settings["variants"]
        checks.add(*acceptance.matrix_verdict(f"1 {', '.join(compiled)} x mask x fwd/bwd: ok or unsupported with a "
                                              f"reason", rows("matrix-compiled")))
    return _exit_code(checks.items)


def _memory_exponents(checks, registry, scaling: list[dict], device: str) -> None:
    """3. The memory exponent of each variant that declares one, over the causal scaling sweep."""
    for name in (n for n in registry.names() if registry[n].traits.memory_exponent(device)):
        lo, hi = registry[name].traits.memory_exponent(device)
        mine = [r for r in scaling if r["variant"] == name and r["status"] == "ok" and r.get("peak_mem_bytes")]
        exp = _fit([r["q_len"] for r in mine], [r["peak_mem_bytes"] for r in mine])
        checks.add(f"3 memory exponent {name} in [{lo}, {hi}]", lo <= exp <= hi,
                   f"{exp:.2f} over n={','.join(str(r['q_len']) for r in mine)}")


def _timer_agreement(checks, registry, device: str) -> None:
    """4. The harness's median against do_bench (torch.utils.benchmark on the CPU)."""
    from bench.features.selfcheck import check_cell
    from bench.model.registry import available

    q = QUICK[device]
    t = q["timer"]
    for name in taking(registry, "timer"):
        case = Case(device, q["dtype"], kv_heads=t["heads"], mask="none", **t)
        if not available(registry[name], case)[0]:
            checks.add(f"4 timer agreement {name}", False, "not available here")
            continue
        row = check_cell(registry[name], case, 300.0 if device == "cuda" else 60.0)
        tool = "do_bench" if "ratio_do_bench" in row else "tub"
        ratio = row[f"ratio_{tool}"]
        tol = acceptance.threshold("timer agreement", device)
        checks.add(f"4 timer agreement {name} within {100 * tol:g}% of {tool}", abs(ratio - 1) <= tol,
                   f"harness {row['harness_ms']:.4g} ms, {tool} {row[f'{tool}_ms']:.4g} ms, ratio {ratio:.3f} "
                   f"(rounds {row[f'ratio_{tool}_lo']:.3f}-{row[f'ratio_{tool}_hi']:.3f})")


def _trace_check(checks, registry, device: str, out: Path) -> None:
    """5. A profiler trace with device kernels (CPU ops on the CPU), of a fused variant first."""
    from bench.features.profile.profiler import profile_case
    from bench.model.registry import available

    q = QUICK[device]
    case = Case(device, q["dtype"], 1, 8, 8, q["n"], q["n"], 64, "causal", None, "fwd")
    fused_first = sorted(taking(registry, "trace"), key=lambda n: registry[n].traits.peak_share is None)
    name = next((n for n in fused_first if available(registry[n], case)[0]), registry.names()[0])
    res = profile_case(registry[name], case, out)
    events = json.loads(Path(res["trace"]).read_text()).get("traceEvents", [])
    want = "kernel" if device == "cuda" else "cpu_op"
    n_events = sum(1 for e in events if e.get("cat") == want)
    checks.add(f"5 profiler trace has {want} events", n_events > 0, f"{n_events} in {Path(res['trace']).name}")


QUICK_LIMIT_S = 360.0  # the quick check must fit six minutes on an H200, by its own projection
QUICK_FIXED_S = 60.0  # beyond its sweeps: the timer checks (do_bench and the harness, two cells), the profile


def steps_projection(steps: dict, registry, device: str) -> list[tuple[str, int, float, list]]:
    """(name, cells, projected seconds, the cells) of each step, run one after another in one process:
    the first starts the worker and measures the peaks, the first that compiles starts the compiler,
    and the others find both (``Step.run`` keeps its workers)."""
    from bench.features.cost_model import plan

    out, common, compiled = [], quick_common(device), False
    for i, (name, step) in enumerate(steps.items()):
        spec = step.spec(registry, common, here=False)
        cells = [(n, c) for c in spec.cases() for n in spec.variants]
        wall = plan.project(cells, registry, spec, history=plan.History.empty(), report=False, peaks_cached=i > 0,
                            started=i > 0, compiler_started=compiled).wall_s
        compiled = compiled or any(registry[n].compiles for n in spec.variants)
        out.append((name, len(cells), wall, cells))
    return out


def quick_projection(registry, device: str = "cuda") -> float:
    """The quick check's projected wall time: each of its sweeps (``quick_steps``, the ones it
    runs) through the plan's cost model (bench.features.cost_model.plan, with its default rates for the
    device: compiles, the reference on the CPU, the budget), plus QUICK_FIXED_S.  Plain
    arithmetic: it runs anywhere."""
    return QUICK_FIXED_S + sum(w for _, _, w, _ in steps_projection(quick_steps(registry, device), registry, device))


def extra_projection(registry, device: str = "cuda") -> float:
    """The extra step's projected wall time, as quick_projection prices the first, and its ab."""
    ab = AB_CHECK_S[device] if taking(registry, "ab") else 0.0
    return ab + sum(w for _, _, w, _ in steps_projection(extra_steps(registry, device), registry, device))


class Verdicts:
    """The quick check's verdicts, each printed (unbuffered) and written to ``path`` as it is
    reached, so that a machine lent for a few minutes leaves every verdict it got to."""

    def __init__(self, path: Path):
        self.path, self.items = Path(path), []

    def add(self, check: str, ok: bool, detail: str) -> None:
        self.items.append((check, ok, detail))
        print(f"{'ok  ' if ok else 'FAIL'} {check}: {detail}", flush=True)
        store.write_json(self.path.parent, self.path.name,
                         [{"check": c, "ok": k, "detail": d} for c, k, d in self.items], indent=2)


def command(args):
    import os

    from bench.engine.runner import WORKER_ENV

    # the full check profiles in this process before its self-check times there: CUPTI must be torn down
    # when a profiler stops, or every later kernel runs 10-20% slow (PyTorch issue 144455); read by Kineto
    # when torch starts, so set before torch is imported, as every worker has it
    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)

    from bench.model.case import MAX_LEN
    from bench.model.parsers import number

    out = Path(args.out) if args.out else None
    if (args.extra or args.dry_run) and not args.quick:
        raise UsageError(f"{'--extra' if args.extra else '--dry-run'} goes with --quick: gpu-check --quick "
                         f"[--extra] [--dry-run]")
    if args.quick:
        given = [flag for flag, value, default in (("--variants", args.variants, None),
                                                   ("--seq-len", args.seq_len, "2048")) if value != default]
        if given:
            raise UsageError(f"gpu-check --quick checks its own cells and lengths: {' and '.join(given)} "
                             f"{'is' if len(given) == 1 else 'are'} not taken with it (drop --quick to choose them)")
        if args.dry_run:
            from bench.engine.discovery import discover

            return dry_run(discover(), args.device, args.extra)
        return run_extra_check(out, args.device) if args.extra else run_quick_check(out, args.device)
    seq_len = number(16, MAX_LEN, True)(args.seq_len, "--seq-len")
    if args.variants is not None:
        from bench.api import discover

        names = [v.strip() for v in args.variants.split(",") if v.strip()]
        known = discover().names()
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise UsageError(f"--variants {args.variants!r}: unknown {', '.join(unknown) or '(none given)'}; "
                             f"valid: {', '.join(known)}")
    variants = [v for v in (args.variants or "").split(",") if v] or None
    return run_gpu_check(out, seq_len, args.device, variants)


def add_parser(sub) -> None:
    gp = sub.add_parser("gpu-check", help="exercise every CUDA path on one NVIDIA GPU; ends with PASS or FAIL")
    gp.add_argument("--out", metavar="DIR",
                    help="a new or empty folder (default: a fresh runs/<timestamp>-gpu-check-...)")
    gp.add_argument("--quick", action="store_true",
                    help="the device acceptance check: seven verdicts, each written as it is reached (--dry-run "
                         "prints its projection)")
    gp.add_argument("--extra", action="store_true",
                    help="with --quick: its second step, the paths the first does not reach (sinks, 192/128, mixes, "
                         "GQA cross bottom-right, ragged pinned backends, flex decode with a GQA group, paged:64, "
                         "the layer scopes, a layer under the graph timer, fp8, an anchor, ab)")
    gp.add_argument("--dry-run", dest="dry_run", action="store_true",
                    help="with --quick: list each step's cells and projection, run nothing (any machine)")
    gp.add_argument("--seq-len", dest="seq_len", default="2048", metavar="N",
                    help="the full check's length: its matrix at N, its cross-attention at N/2, its scaling sweeps "
                         "from N/2 to 8N (default 2048)")
    gp.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same steps at a small size, a dry run of the script itself")
    gp.add_argument("--variants", help="comma-separated subset (default: all)")
    gp.set_defaults(func=command)
