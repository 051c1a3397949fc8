"""Build a run's report folder from run folders alone: ``python -m bench report RUN``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reports.accuracy import error_chart, pareto_chart, roofline_chart
from reports.charts import chart_jobs, declared_colours, draw, drawing_pool, variant_style
from reports.frames import load_runs, speedups, with_peaks
from reports.groups import Group, not_run, overview, split
from reports.markdown import write_markdown
from reports.mask_section import density_chart, mask_table, pattern_chart, pictures, with_labels
from reports.page import ReportParts, write_page
from reports.scaling import crossovers, scaling_table
from reports.sections import SectionInput, feature_group_charts, feature_sections
from reports.tables import facet_tables, failed_rows, failures, status_counts, with_metrics, write_csvs


@dataclass
class GroupPart:
    """One group of the report: its overview (which variant to use), its charts and its tables."""
    group: Group
    overview: object  # pandas.DataFrame: reports.groups.overview
    tables: list
    charts: dict = field(default_factory=dict)  # name -> paths


def group_chart_jobs(frame, folder: Path, style: dict, baseline, peaks, bandwidth=None) -> list:
    """A group's charts as drawing jobs: a declared section's own where one claims the group (the serving
    mixes' bar groups: reports.sections.feature_group_charts), every other group as lines over n
    (reports.charts)."""
    jobs = feature_group_charts(frame, folder, style)
    return jobs if jobs is not None else chart_jobs(frame, folder, style, baseline, peaks, bandwidth)


def _group_jobs(g: Group, charts_dir: Path, style: dict, baseline, peaks, bandwidth) -> list:
    folder = charts_dir / g.slug if g.slug else charts_dir
    return [(g.slug, job) for job in group_chart_jobs(g.frame, folder, style, baseline, peaks, bandwidth)]


WHOLE = ("roofline", "error", "pareto", "density", "masks")  # charts across the groups, each of a bounded size


def build_report(run_dirs, out: Path | None = None) -> Path:
    """Write report/ (index.html, report.md, charts/, CSV tables, frontier.csv); returns index.html's path."""
    with drawing_pool():  # started now: ready by the time the charts are
        return _build(run_dirs, out)


def _build(run_dirs, out: Path | None) -> Path:
    import pandas as pd

    run_dirs = [Path(d) for d in run_dirs]
    df, envs = load_runs(run_dirs)
    df = with_peaks(df, envs)
    folder = Path(out) if out else run_dirs[0] / "report"
    folder.mkdir(parents=True, exist_ok=True)
    baseline = next((e.get("baseline") for e in envs if e.get("baseline")), None)
    if baseline not in set(df["variant"]):
        baseline = None
    df = with_metrics(speedups(df, baseline), baseline)
    peaks = {}
    for e in envs:
        peaks.update(e.get("peaks_tflops") or {})
    scaling = scaling_table(df)
    cross = crossovers(df)
    counts = status_counts(df)
    fails = failures(df)
    df = with_labels(df)
    pics = pictures(df, envs)
    style = variant_style(df["variant"], baseline, declared_colours(envs))
    charts_dir = folder / "charts"
    light = df.drop(columns=["samples_ms"], errors="ignore")
    bandwidth = max((e.get("peak_gbps") or 0.0 for e in envs), default=0.0) or None
    groups = [GroupPart(g, overview(g), facet_tables(g.frame, baseline)) for g in split(light)]
    jobs = []
    for part in groups:
        g = part.group
        jobs += _group_jobs(g, charts_dir, style, baseline, peaks, bandwidth)
    jobs += [("", ("roofline", roofline_chart, light, dict(out=charts_dir / "roofline", style=style, envs=envs))),
             ("", ("error", error_chart, light, dict(out=charts_dir / "error", style=style))),
             ("", ("pareto", pareto_chart, light, dict(out=charts_dir / "pareto", style=style))),
             ("", ("density", density_chart, light, dict(out=charts_dir / "density", style=style))),
             ("", ("masks", pattern_chart, pics, dict(out=charts_dir / "masks")))]
    drawn = draw([job for _, job in jobs], charts_dir)
    by_slug = {part.group.slug: part for part in groups}
    whole: dict = {}
    for (slug, (name, *_)), paths in zip(jobs, drawn):
        if not paths:
            continue
        if name in WHOLE:
            whole[name] = paths
        else:
            by_slug[slug].charts[name] = paths
    masks = {"table": mask_table(df, pics), "patterns": whole.pop("masks", []), "density": whole.pop("density", [])}
    masks["table"].to_csv(folder / "masks.csv", index=False)
    tables = [(f"{part.group.label}: {label}" if part.group.slug else label, ts)
              for part in groups for label, ts in part.tables]
    write_csvs(df, tables, folder)
    pd.concat([part.overview for part in groups], ignore_index=True).to_csv(folder / "overview.csv", index=False)
    scaling.to_csv(folder / "scaling.csv", index=False)
    failed_rows(df).to_csv(folder / "failures.csv", index=False)
    cross.to_csv(folder / "crossovers.csv", index=False)
    sections = feature_sections(SectionInput(df, envs, folder, charts_dir, baseline, style))
    kept = {p for paths in drawn for p in paths} | {p for part in sections for p in part.charts}
    _remove_stale(charts_dir, kept)
    parts = ReportParts(folder, df, envs, tables, scaling, cross, counts, fails, whole, baseline, masks, sections,
                        groups, not_run(df))
    write_markdown(parts)
    return write_page(parts)


def _remove_stale(charts_dir: Path, kept: set) -> None:
    """Charts an earlier build of this folder drew that this one did not (a group gone, a chart
    with nothing left to draw): removed, so the folder holds this report's charts alone."""
    kept = {Path(p).resolve() for p in kept}
    for path in list(charts_dir.rglob("*")):
        if path.suffix in (".png", ".svg") and path.resolve() not in kept:
            path.unlink()
    for sub in sorted((p for p in charts_dir.rglob("*") if p.is_dir()), reverse=True):
        if not any(sub.iterdir()):
            sub.rmdir()
