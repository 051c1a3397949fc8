"""Build a run's report folder from run folders alone: ``python -m bench report RUN``."""

from __future__ import annotations

from pathlib import Path

from reports.accuracy import error_chart, pareto_chart, roofline_chart
from reports.charts import all_charts, variant_style
from reports.frames import load_runs, speedups, with_peaks
from reports.masks import density_chart, mask_table, pattern_chart, pictures, with_labels
from reports.page import write_markdown, write_page
from reports.scaling import crossovers, scaling_table
from reports.tables import facet_tables, failures, status_counts, write_csvs


def build_report(run_dirs, out: Path | None = None) -> Path:
    """Write report/ (index.html, report.md, charts/, CSV tables); returns index.html's path."""
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
    charts = all_charts(df, folder / "charts", baseline, peaks)
    style = variant_style(df["variant"], baseline)
    for name, paths in (("roofline", roofline_chart(df, folder / "charts" / "roofline", style, envs)),
                        ("error", error_chart(df, folder / "charts" / "error", style)),
                        ("pareto", pareto_chart(df, folder / "charts" / "pareto", style))):
        if paths:
            charts[name] = paths
    df = with_labels(df)
    pics = pictures(df, envs)
    masks = {"table": mask_table(df, pics), "patterns": pattern_chart(pics, folder / "charts" / "masks"),
             "density": density_chart(df, folder / "charts" / "density", style)}
    masks["table"].to_csv(folder / "masks.csv", index=False)
    write_csvs(df, tables, folder)
    scaling.to_csv(folder / "scaling.csv", index=False)
    cross.to_csv(folder / "crossovers.csv", index=False)
    write_markdown(folder, df, envs, tables, scaling, cross, counts, fails, charts, masks)
    return write_page(folder, df, envs, tables, scaling, cross, counts, fails, charts, baseline, masks)
