"""gpu-check's verdicts and their thresholds: plain functions of rows, each returning
(check, ok, detail), so that ``python -m bench gpu-check`` only runs the sweeps and prints.

The thresholds are rows of one table (``ACCEPTANCE``); what a variant must reach of them is declared
on the variant where it is its own (``variant(..., peak_share=, memory_exponents=)``)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.runs.judge import failures


@dataclass(frozen=True)
class Threshold:
    check: str
    device: str  # cuda, cpu, or any
    value: float
    why: str


ACCEPTANCE = (
    Threshold("timer agreement", "cuda", 0.03, "the harness median within 3% of triton.testing.do_bench on the "
                                               "same call (cells of 0.5 ms and more)"),
    Threshold("timer agreement", "cpu", 0.25, "the harness median against torch.utils.benchmark: the CPU "
                                              "rehearsal's looser bound, a shared CPU drifting within seconds"),
    Threshold("peak share", "any", 0.35, "a fused backend that declares no share of the measured matmul peak is "
                                         "held to FlashAttention-2's (about 350 to 400 TFLOP/s of the H200's ~790)"),
    Threshold("best backend TFLOP/s", "cpu", 0.0, "the CPU rehearsal's relaxed threshold for the best SDPA backend: "
                                                  "a CPU reaches no share of a GPU's"),
)


def threshold(check: str, device: str) -> float:
    """The table's value of ``check`` on ``device`` (a row for the device, else its ``any`` row)."""
    rows = [t for t in ACCEPTANCE if t.check == check and t.device in (device, "any")]
    if not rows:
        raise KeyError(f"no threshold {check!r} for {device}")
    return sorted(rows, key=lambda t: t.device == "any")[0].value


def failed_cells(rows: list[dict]) -> list[str]:
    """The cells that failed, less an approximate variant's accuracy verdict (bench.runs.judge)."""
    return failures(rows, allow_accuracy=True)


def matrix_verdict(check: str, rows: list[dict]) -> tuple[str, bool, str]:
    import pandas as pd

    bad = failed_cells(rows)
    counts = pd.Series([r["status"] for r in rows]).value_counts().to_dict() if rows else {}
    return check, bool(rows) and not bad, (f"{len(bad)} failed, e.g. {bad[0]}" if bad else
                                           ", ".join(f"{k} {v}" for k, v in counts.items()))


def kernel_verdict(rows: list[dict], device: str) -> tuple[str, bool, str]:
    """Every ok cell of the SDPA sweep names the kernels that ran, and a pinned backend ran its
    own (bench.features.gpu_state.kernels); on the CPU there are no CUDA kernels to name."""
    check = "2 kernels that ran belong to each cell's backend"
    if device != "cuda":
        return check, True, "on the CPU: no CUDA kernels to name"
    ok = [r for r in rows if r.get("status") == "ok"]
    bad = [f"{r['variant']}: {r['kernel_mismatch']}" for r in ok if r.get("kernel_mismatch")]
    unnamed = [r["variant"] for r in ok if not r.get("kernels")]
    ran = ", ".join(f"{r['variant']} -> {r.get('backend_ran') or '?'}" for r in ok)
    if bad or unnamed:
        return check, False, "; ".join(bad + [f"{v}: no kernel names" for v in unnamed])
    return check, bool(ok), ran or "no ok cell"


def gpu_state_verdict(events_rows: list[dict], graph_rows: list[dict], device: str) -> tuple[str, bool, str]:
    """Verdict 6: a sub-0.1 ms cell, forward and backward, has NVML's clock and power (when
    nvidia-ml-py is there), its CUDA-graph time beside its event time (a failed capture is named
    from ``graph_error``, its timing kept), and ``--timer graph`` times each as a graph."""
    check = "6 NVML state, and CUDA-graph timing of a fwd and a bwd cell under 0.1 ms"
    if device != "cuda":
        return check, True, "on the CPU: no NVML, no CUDA graphs"
    directions = sorted({r.get("direction") for r in events_rows + graph_rows})
    pairs = {d: (next((r for r in events_rows if r.get("direction") == d and r.get("status") == "ok"), None),
                 next((r for r in graph_rows if r.get("direction") == d and r.get("status") == "ok"), None))
             for d in directions}
    if not pairs or any(row is None or graph is None for row, graph in pairs.values()):
        return check, False, "a cell did not run: " + "; ".join(
            f"{r.get('variant')} {r.get('direction')} {r.get('status')}: {r.get('reason')}"
            for r in events_rows + graph_rows if r.get("status") != "ok")[:300]
    problems, details = [], []
    try:
        import pynvml  # noqa: F401
        nvml_here = True
    except ImportError:
        nvml_here = False  # optional: the columns are simply absent
    for d, (row, graph) in pairs.items():
        if nvml_here and row.get("sm_clock_start_mhz") is None:
            problems.append(f"{d}: no SM clock from NVML")
        if row.get("graph_error"):
            problems.append(f"{d}: the CUDA-graph cross-check failed ({row['graph_error']})")
        elif row["median_ms"] < 0.1 and row.get("graph_median_ms") is None:
            problems.append(f"{d}: no CUDA-graph cross-check under 0.1 ms")
        if graph.get("timer") != "cuda-graph":
            problems.append(f"{d}: --timer graph timed with {graph.get('timer')}")
        details.append(f"{d}: events {row['median_ms']:.4g} ms, graph {row.get('graph_median_ms') or float('nan'):.4g}"
                       f" ms, kernels {row.get('kernel_sum_ms') or float('nan'):.4g} ms "
                       f"({row.get('timer_mismatch') or 'agree'}); --timer graph {graph['median_ms']:.4g} ms; "
                       f"SM {row.get('sm_clock_start_mhz')} MHz, {row.get('power_start_w')} W of "
                       f"{row.get('power_limit_w')}, {row.get('energy_j_per_call')} J/call")
    return check, not problems, "; ".join(problems + details)


def workload_verdict(ragged_rows: list[dict], paged_rows: list[dict], device: str) -> tuple[str, bool, str]:
    """Verdict 7: a ragged batch through SDPA's nested tensors is ok with its layout change timed
    apart, and (on a GPU) flex reads a paged cache visiting no more than its own pages."""
    check = "7 a ragged batch through sdpa, a paged cache through flex"
    problems, details = [], []
    ragged = [r for r in ragged_rows if r.get("status") == "ok"]
    failed = [f"{r.get('direction')} {r.get('status')}: {r.get('reason')}" for r in ragged_rows
              if r.get("status") != "ok"]
    if not ragged_rows or failed:
        problems.append("ragged sdpa: " + ("; ".join(failed) if failed else "no row"))
    for r in ragged:
        layout = (r.get("extra") or {}).get("layout_ms", r.get("layout_ms"))
        layout = "?" if layout is None else f"{layout:.3g}"
        how = " ".join(str(x) for x in (r.get("direction"), r.get("timer")) if x)
        details.append(f"ragged sdpa{' ' + how if how else ''} {r['median_ms']:.4g} ms (layout change {layout} ms "
                       f"of it, {r.get('layout')})")
    if device == "cuda":
        paged = [r for r in paged_rows if r.get("status") == "ok"]
        if not paged:
            problems.append("paged flex: " + "; ".join(f"{r.get('status')}: {r.get('reason')}" for r in paged_rows)
                            if paged_rows else "paged flex: no row")
        for r in paged:
            extra = r.get("extra") or {}
            share = extra.get("kv_blocks_visited", r.get("kv_blocks_visited"))
            if share is None or share > 1.0 / r["batch"] + 1e-6:
                problems.append(f"paged flex visits {share} of the pool's blocks (its own pages: 1/{r['batch']})")
            details.append(f"paged flex {r['median_ms']:.4g} ms, {share} of the pool's blocks visited")
    else:
        details.append("paged flex: on a GPU only (the CPU suite checks its block mask)")
    return check, not problems, "; ".join(problems + details)


def sdpa_verdict(rows: list[dict], peak: float | None, absolute: float | None = None,
                 shares: dict | None = None) -> tuple[str, bool, str]:
    """Verdict 2 from the peak sweep's rows: the fastest SDPA backend against its share of the
    measured matmul peak (``shares``: each variant's declared peak_share; the table's peak share for
    one that declares none), naming the backend; ``absolute`` instead, where given (the CPU rehearsal's
    relaxed threshold)."""
    ok = sorted((r for r in rows if r.get("status") == "ok" and r.get("tflops")), key=lambda r: -r["tflops"])
    if not ok:
        return "2 best SDPA backend TFLOP/s", False, "no SDPA backend ran"
    best = ok[0]
    if absolute is not None:
        bar, why = absolute, f"threshold {absolute:g}"
    elif peak:
        share = (shares or {}).get(best["variant"], threshold("peak share", "cuda"))
        bar, why = share * peak, f"threshold {share:g} x the measured matmul peak {peak:.0f} = {share * peak:.0f}"
    else:
        return "2 best SDPA backend TFLOP/s", False, "no matmul peak was measured to hold it to"
    detail = (f"best {best['variant']} {best['tflops']:.1f} TFLOP/s ({why}); "
              + ", ".join(f"{r['variant']} {r['tflops']:.1f}" for r in ok[1:]))
    return "2 best SDPA backend TFLOP/s", best["tflops"] >= bar, detail
