"""report.md: the report in Markdown, its sections in the page's order (``reports.page``
writes the HTML from the same parts)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.measure.flops import __doc__ as FLOP_DOC
from reports.page import MASKS_NOTE, OVERVIEW_NOTE, ReportParts, env_summary, fmt_scaling, report_title
from reports.scaling import crossover_note
from reports.sections import Section
from reports.tables import METRICS, NOTES
from reports.trust import conclusions, trust_line, trust_state


def _md(t: pd.DataFrame, index: bool = True, text: bool = False) -> str:
    """A frame as a Markdown table.  ``text``: its cells are already formatted (the per-facet
    tables, a thousand of them in a large report): written as they are, without tabulate's
    parsing of every cell as a number."""
    if not text:
        return t.to_markdown(index=index)
    head = ([str(t.index.name or "")] if index else []) + [str(c) for c in t.columns]
    body = [([str(k)] if index else []) + [str(v) for v in values]
            for k, values in zip(t.index, t.itertuples(index=False, name=None))]
    return "\n".join("| " + " | ".join(row) + " |" for row in [head, ["---"] * len(head), *body])


def _section_md(part: Section) -> list[str]:
    """A feature's section (reports.sections): its title, note, charts and table."""
    lines = [f"### {part.title}", "", part.note, ""]
    for chart in part.charts:
        lines += [f"![{part.caption}](charts/{chart.name})", ""]
    return lines + [_md(part.table, index=False), ""]


def write_markdown(r: ReportParts) -> Path:
    from reports.groups import overview_display

    folder, df, envs, scaling, cross = r.folder, r.df, r.envs, r.scaling, r.cross
    counts, fails, charts, masks = r.counts, r.fails, r.charts, r.masks
    said = conclusions(r.groups, scaling, cross)
    state = trust_state(df, envs, said)
    lines = ["# " + report_title(envs), "",
             f"**Trust: {state[1]}: {state[2]}.** " + trust_line(df, envs, lead=False, said=said), "",
             "## Which to use", "", OVERVIEW_NOTE, ""]
    if r.not_run is not None and not r.not_run.empty:
        lines += ["### Not run here", "", _md(r.not_run, index=False), ""]

    def rel(path: Path) -> str:
        return path.relative_to(folder).as_posix()

    several = len(r.groups) > 1
    for part in r.groups:  # the sections in the page's order; each group in turn where the page switches
        if several:
            lines += [f"### {part.group.label}", ""]
        shown = overview_display(part.overview)
        lines += [_md(shown, index=False) if not shown.empty else "no exact variant ran in this group", ""]
    lines += ["## Charts", ""]
    for part in r.groups:
        if several:
            lines += [f"### {part.group.label}", ""]
        for name, paths in part.charts.items():
            png = next(p for p in paths if p.suffix == ".png")
            lines += [f"![{name}]({rel(png)})", ""]
    for name, paths in charts.items():
        png = next(p for p in paths if p.suffix == ".png")
        lines += [f"![{name} (every group)]({rel(png)})", ""]
    if masks and not masks["table"].empty:
        lines += ["## Masks", "", MASKS_NOTE, ""]
        for key in ("patterns", "density"):
            png = next((p for p in masks.get(key) or [] if p.suffix == ".png"), None)
            if png:
                lines += [f"![{key}]({rel(png)})", ""]
        lines += [_md(masks["table"], index=False), ""]
    lines += ["## Scaling", "", _md(fmt_scaling(scaling), index=False) if not scaling.empty else "none", ""]
    for part in r.sections:
        lines += _section_md(part)
    crossings = _md(cross, index=False) if not cross.empty else crossover_note(df, cross)
    lines += ["### Crossovers", "", crossings, ""]
    lines += ["## Tables", "", "FLOP convention: " + " ".join(FLOP_DOC.split()), ""]
    lines += [f"{k} {v}  " for k, v in NOTES.items()] + [""]
    for label, ts in r.tables:
        lines += [f"### {label}", ""]
        for metric, t in ts.items():
            lines += [f"**{METRICS[metric][0]}**", "", _md(t, text=True), ""]
    lines += ["## Statuses", "", _md(counts), ""]
    if not fails.empty:
        lines += [_md(fails, index=False), ""]
    lines += ["## Environment", "", _md(env_summary(envs)), ""]
    path = folder / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
