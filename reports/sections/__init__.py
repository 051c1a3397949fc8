"""The features' parts of the report, one module each, and the protocol they follow.

A feature (bench.model.features) that adds to the report names a module of this package as its
``section``.  That module has ``sections(ctx: SectionInput) -> list[Section]``: it writes its
CSV files into ``ctx.folder``, draws its charts under ``ctx.charts_dir``, and returns its parts of
the page.  ``reports.build`` calls every declared section in the features' order; index.html and
report.md render each the same way (its title, note, charts and table), and a section with an
empty table is left out.

A section module may also draw a group of the report its own way: ``group_charts(frame, folder,
style)`` returns the drawing jobs of a group whose rows it claims (as reports.charts.chart_jobs
gives a scaling group's), or None; the first declared section that claims a group draws it (the
serving mixes' bar groups, reports.sections.mixes), and every other group is drawn as lines over n.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class SectionInput:
    """What a section is built from: the report's rows and environments, and where it writes."""
    df: pd.DataFrame  # every row of the runs, with its metrics and labels
    envs: list
    folder: Path  # the report folder: a section's CSV files
    charts_dir: Path  # its charts
    baseline: str | None = None
    style: dict = field(default_factory=dict)  # variant -> colour and marker (reports.charts.variant_style)


@dataclass
class Section:
    """One part of the page: ``anchor`` is its id in index.html, ``caption`` its charts' caption."""
    anchor: str
    title: str
    note: str
    table: pd.DataFrame
    charts: list = field(default_factory=list)  # paths of PNGs, in order
    caption: str = ""


def feature_sections(ctx: SectionInput) -> list[Section]:
    """Every declared feature's sections with something to show, in the features' order."""
    from bench.model.features import FEATURES

    out: list[Section] = []
    for feature in FEATURES:
        if feature.section:
            out += [s for s in import_module(feature.section).sections(ctx) if not s.table.empty]
    return out


def feature_group_charts(frame, folder: Path, style: dict) -> list | None:
    """The drawing jobs of a group that a declared section draws its own way (``group_charts``), or
    None: the first that claims it, in the features' order."""
    from bench.model.features import FEATURES

    for feature in FEATURES:
        draw = getattr(import_module(feature.section), "group_charts", None) if feature.section else None
        jobs = draw(frame, folder, style) if draw else None
        if jobs is not None:
            return jobs
    return None
