"""Build a run's report folder from run folders alone: ``python -m bench report RUN``."""

from __future__ import annotations

from pathlib import Path

from reports import frontier, steps
from reports.accuracy import error_chart, pareto_chart, roofline_chart
from reports.charts import all_charts, variant_style
from reports.frames import load_runs, speedups, with_peaks
from reports.masks import density_chart, mask_table, pattern_chart, pictures, with_labels
from reports.page import ReportParts, write_markdown, write_page
from reports.scaling import crossovers, scaling_table
from reports.tables import facet_tables, failed_rows, failures, status_counts, write_csvs


def build_report(run_dirs, out: Path | None = None) -> Path:
    """Write report/ (index.html, report.md, charts/, CSV tables, frontier.csv); returns index.html's path."""
    run_dirs = [Path(d) for d in run_dirs]
    df, envs = load_runs(run_dirs)
    df = with_peaks(df, envs)
    folder = Path(out) if out else run_dirs[0] / "report"
    folder.mkdir(parents=True, exist_ok=True)
    baseline = next((e.get("baseline") for e in envs if e.get("baseline")), "naive")
    if baseline not in set(df["variant"]):
        baseline = None
    df = speedups(df, baseline)
    peaks = {}
    for e in envs:
        peaks.update(e.get("peaks_tflops") or {})
    tables = facet_tables(df, baseline)
    scaling = scaling_table(df)
    cross = crossovers(df)
    counts = status_counts(df)
    fails = failures(df)
    df = with_labels(df)
    pics = pictures(df, envs)
    style = variant_style(df["variant"], baseline)
    charts_dir = folder / "charts"
    light = df.drop(columns=["samples_ms"], errors="ignore")
    extra = [("roofline", roofline_chart, light, dict(out=charts_dir / "roofline", style=style, envs=envs)),
             ("error", error_chart, light, dict(out=charts_dir / "error", style=style)),
             ("pareto", pareto_chart, light, dict(out=charts_dir / "pareto", style=style)),
             ("masks", pattern_chart, pics, dict(out=charts_dir / "masks")),
             ("density", density_chart, light, dict(out=charts_dir / "density", style=style))]
    bandwidth = max((e.get("peak_gbps") or 0.0 for e in envs), default=0.0) or None
    charts = all_charts(df, charts_dir, baseline, peaks, extra, bandwidth)
    masks = {"table": mask_table(df, pics), "patterns": charts.pop("masks", []),
             "density": charts.pop("density", [])}
    masks["table"].to_csv(folder / "masks.csv", index=False)
    write_csvs(df, tables, folder)
    scaling.to_csv(folder / "scaling.csv", index=False)
    failed_rows(df).to_csv(folder / "failures.csv", index=False)
    cross.to_csv(folder / "crossovers.csv", index=False)
    memory = frontier.write(df, envs, folder, charts_dir)
    step_table = steps.steps_table(df)
    per_step = {"table": step_table, "note": steps.NOTE,
                "chart": steps.steps_chart(df, charts_dir / "steps", style) if not step_table.empty else None}
    if not step_table.empty:
        step_table.to_csv(folder / "steps.csv", index=False)
    parts = ReportParts(folder, df, envs, tables, scaling, cross, counts, fails, charts, baseline, masks, memory,
                        per_step)
    write_markdown(parts)
    return write_page(parts)
