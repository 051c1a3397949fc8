"""report/index.html (one self-contained file: charts embedded as base64 PNG) and report.md."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.measure.flops import __doc__ as FLOP_DOC
from bench.model.row import Status
from reports.charts import declared_colours, variant_style
from reports.scaling import crossover_note
from reports.sections import Section
from reports.tables import METRICS, NOTES
from reports.trust import conclusions, trust_line, trust_state

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1280px;margin:0 auto;padding:24px 32px 64px}
h1{font-size:26px;margin:8px 0 4px} h2{font-size:20px;margin:36px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:20px 0 6px} .muted{color:#666} nav a{margin-right:14px}
table{border-collapse:collapse;font-size:12.5px;margin:6px 0 14px;background:#fff}
th,td{border:1px solid #e0e0e0;padding:3px 8px;text-align:right;white-space:nowrap}
td:last-child{white-space:normal;min-width:120px;max-width:560px;text-align:left;overflow-wrap:break-word}
td:first-child{white-space:normal;max-width:260px;overflow-wrap:break-word}
th{background:#f2f2f4} td:first-child,th:first-child{text-align:left}
td.bad{color:#b22222;font-weight:600}
p.trust{font-size:15px;padding:8px 12px;border-left:6px solid;border-radius:3px}
p.trust.clean{background:#eef7ee;border-color:#2e7d32} p.trust.care{background:#fff7e6;border-color:#e69500}
p.trust.bad{background:#fdecea;border-color:#c62828}
img{max-width:100%;background:#fff;border:1px solid #e6e6e6;border-radius:4px}
details{margin:6px 0} summary{cursor:pointer;font-weight:600} code{background:#f0f0f0;padding:1px 4px;border-radius:3px}
figure{margin:0 0 22px} .tw{overflow-x:auto;max-width:100%}
.picker{position:sticky;top:0;z-index:5;background:#fafafa;padding:8px 0;border-bottom:1px solid #ddd}
.picker select{font:inherit;padding:2px 6px;max-width:100%}
table.winners td.win{color:#fff;font-weight:600;text-align:center;min-width:54px}
table.winners th{font-weight:normal}
span.chip{display:inline-block;width:11px;height:11px;margin:0 4px 0 10px;border-radius:2px;vertical-align:middle}
"""
PICKER_JS = """<script>
(function () {
  var sel = document.getElementById('group');
  if (!sel) return;
  function show(v) {
    document.querySelectorAll('[data-group]').forEach(function (e) { e.hidden = e.getAttribute('data-group') !== v; });
  }
  sel.addEventListener('change', function () { show(sel.value); });
  show(sel.value);
})();
</script>"""
FAIL_WORDS = tuple(s.word for s in Status if s is not Status.OK)


def _cell(x) -> str:
    """A table cell's text: '-' for a missing value, six figures for a float."""
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, float):
        return f"{x:.6g}"
    return html.escape(str(x))


def _table_html(t: pd.DataFrame, index: bool = True) -> str:
    """A frame as an HTML table, written directly (a report holds a thousand of them, and
    pandas' writer formats each cell through its display machinery); a failed cell's status in red."""
    bad = set(FAIL_WORDS)
    head = ([f"<th>{_cell(t.index.name or '')}</th>"] if index else []) + [f"<th>{_cell(c)}</th>" for c in t.columns]
    rows = []
    for key, values in zip(t.index, t.itertuples(index=False, name=None)):
        cells = [f"<th>{_cell(key)}</th>"] if index else []
        cells += [f'<td class="bad">{v}</td>' if isinstance(v, str) and v in bad else f"<td>{_cell(v)}</td>"
                  for v in values]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    return (f'<div class="tw"><table class="dataframe"><thead><tr>{"".join(head)}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _svg_link(paths) -> str:
    svg = next((p for p in paths if p.suffix == ".svg"), None)
    return f": <a href='charts/{svg.name}'>SVG</a>" if svg else ""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def fmt_scaling(s: pd.DataFrame) -> pd.DataFrame:
    if s.empty:
        return s
    s = s.copy()
    if "time_exp_lo" in s:  # the exponent with its 95% interval, in one column
        s["time_exp"] = [("" if pd.isna(a) else f"{a:.2f} ({lo:.2f}-{hi:.2f})")
                         for a, lo, hi in zip(s["time_exp"], s["time_exp_lo"], s["time_exp_hi"])]
        s = s.drop(columns=["time_exp_lo", "time_exp_hi"])
    else:
        s["time_exp"] = s["time_exp"].map(lambda x: "" if pd.isna(x) else f"{x:.2f}")
    for c in ("mem_exp", "flops_exp"):
        if c in s:
            s[c] = s[c].map(lambda x: "" if pd.isna(x) else f"{x:.2f}")
    for c in ("time_r2", "mem_r2"):
        s[c] = s[c].map(lambda x: "n/a" if pd.isna(x) else f"{x:.3f}")
    return s.rename(columns={"time_exp": "time exponent (95%)", "time_r2": "time R²", "flops_exp": "FLOPs exponent",
                             "time_note": "note", "mem_exp": "memory exponent", "mem_r2": "memory R²",
                             "n_range": "n range", "largest_ok_n": "largest n ok",
                             "weighted_down": "weighted down in the time fit", "first_failure": "first failure above"})


def _section_html(part: Section) -> list[str]:
    """A feature's section (reports.sections): its title, note, charts and table."""
    parts = [f"<h3 id={part.anchor}>{html.escape(part.title)}</h3>", f"<p class=muted>{html.escape(part.note)}</p>"]
    parts += [f"<figure>{_img(chart)}<figcaption class=muted>{html.escape(part.caption)}</figcaption></figure>"
              for chart in part.charts]
    return parts + [_table_html(part.table, index=False)]


def _trust_html(df, envs, said=None) -> str:
    state, heading, why = trust_state(df, envs, said)
    return (f"<p class='trust {state}'><b>{heading}: {html.escape(why)}.</b><br>"
            f"{html.escape(trust_line(df, envs, lead=False, said=said))}</p>")


def env_summary(envs: list[dict]) -> pd.DataFrame:
    keys = ["device", "device_name", "cpu", "threads", "torch", "xformers", "cuda", "cudnn", "driver",
            "python", "git_commit", "command"]
    rows = {}
    for env in envs:
        col = {k: env.get(k) for k in keys}
        col["matmul peak (TFLOP/s)"] = ", ".join(f"{d} {v:.3g}" for d, v in (env.get("peaks_tflops") or {}).items())
        rows[env["run"]] = col
    return pd.DataFrame(rows).fillna("-")


@dataclass(frozen=True)
class ReportParts:
    """Everything a report page is written from (``reports.build`` makes it)."""
    folder: Path
    df: pd.DataFrame
    envs: list
    tables: list
    scaling: pd.DataFrame
    cross: pd.DataFrame
    counts: pd.DataFrame
    fails: pd.DataFrame
    charts: dict
    baseline: str | None
    masks: dict | None = None
    sections: list = field(default_factory=list)  # reports.sections.Section: the features' parts, in their order
    groups: list = field(default_factory=list)  # reports.build.GroupPart: each group's overview, charts, tables
    not_run: pd.DataFrame | None = None  # reports.groups.not_run: the variants with no ok cell, listed once


def write_page(r: ReportParts) -> Path:
    """index.html: the trust box and what ran, which variant to use, the charts, the masks, the
    scaling, the tables, the statuses and the environment, in that order (report.md's too)."""
    several = len(r.groups) > 1
    parts = [*_head_html(r, several), *_overview_html(r.groups, r.not_run, variant_style(r.df["variant"], r.baseline,
                                                                           declared_colours(r.envs))),
             *_charts_html(r, several), *_masks_html(r.masks), *_scaling_html(r), *_tables_html(r, several),
             *_statuses_html(r.df, r.counts, r.fails),
             "<h2 id=env>Environment</h2>" + _table_html(env_summary(r.envs)),
             "</main>" + (PICKER_JS if several else "") + "</body></html>"]
    path = r.folder / "index.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _head_html(r: ReportParts, several: bool) -> list[str]:
    """The title, the trust box, what ran against which baseline, the navigation, and the group
    selector where the report has several groups."""
    df = r.df
    variants = sorted(df["variant"].unique())
    ran = sorted(df[df["status"] == "ok"]["variant"].unique())
    title = report_title(r.envs)
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{CSS}</style></head><body><main>",
             f"<h1>{html.escape(title)}</h1>",
             _trust_html(df, r.envs, conclusions(r.groups, r.scaling, r.cross)),
             f"<p class=muted>{len(df)} cells, {len(variants)} variants "
             f"({len(ran)} ran here: {html.escape(', '.join(ran))}); baseline <b>{html.escape(str(r.baseline))}</b>"
             + (f"; {len(r.groups)} groups, one at a time (the selector below)" if several else "") + ".</p>",
             "<nav><a href=#overview>which to use</a><a href=#charts>charts</a><a href=#masks>masks</a>"
             "<a href=#scaling>scaling</a><a href=#tables>tables</a>"
             "<a href=#status>statuses</a><a href=#env>environment</a></nav>"]
    if several:
        options = "".join(f"<option value='{html.escape(p.group.slug)}'>{html.escape(p.group.label)}</option>"
                          for p in r.groups)
        parts.append(f"<div class=picker><label>Group: <select id=group>{options}</select></label> "
                     f"<span class=muted>switches the overview, the charts and the tables</span></div>")
    return parts


def _charts_html(r: ReportParts, several: bool) -> list[str]:
    """Each group's charts (shown with its group), then the charts drawn across the groups."""
    parts = ["<h2 id=charts>Charts</h2>"]
    for part in r.groups:
        parts.append(_open(part, several))
        for name, paths in part.charts.items():
            png = next(p for p in paths if p.suffix == ".png")
            parts.append(f"<figure>{_img(png)}<figcaption class=muted>{name}{_svg_link(paths)}</figcaption></figure>")
        parts.append("</div>")
    for name, paths in r.charts.items():  # drawn across the groups
        png = next(p for p in paths if p.suffix == ".png")
        parts.append(f"<figure>{_img(png)}<figcaption class=muted>{name} (every group){_svg_link(paths)}"
                     f"</figcaption></figure>")
    return parts


def _scaling_html(r: ReportParts) -> list[str]:
    """The fitted exponents, the features' sections (reports.sections) and the crossovers."""
    parts = ["<h2 id=scaling>Scaling</h2><p class=muted>Exponent of the log-log least-squares fit of "
             "median time and of peak memory against n (2 = quadratic, 1 = linear), with R² "
             "and the n range it covers; none from fewer than 3 lengths (two points always lie on a line). "
             "For decode, n is the KV cache length.</p>",
             _table_html(fmt_scaling(r.scaling), index=False) if not r.scaling.empty else "<p>no ok cells</p>"]
    for part in r.sections:
        parts += _section_html(part)
    parts.append("<h3>Crossovers</h3>")
    parts.append(_table_html(r.cross, index=False) if not r.cross.empty else
                 f"<p class=muted>{html.escape(crossover_note(r.df, r.cross))}</p>")
    return parts


def _tables_html(r: ReportParts, several: bool) -> list[str]:
    """Per group and facet, each metric's table of sequence length by variant (time open)."""
    flop_text = " ".join(FLOP_DOC.split())
    parts = ["<h2 id=tables>Tables</h2><p class=muted>Per facet, sequence length by variant. "
             "Failed cells show their status. FLOP convention: " + html.escape(flop_text) + "</p>",
             "<p class=muted>" + "<br>".join(f"{html.escape(k)} {html.escape(v)}" for k, v in NOTES.items())
             + "</p>"]
    for part in r.groups:
        parts.append(_open(part, several))
        for label, ts in part.tables:
            parts.append(f"<h3>{html.escape(label)}</h3>")
            for metric, t in ts.items():
                open_attr = " open" if metric == "time_ms" else ""
                parts.append(f"<details{open_attr}><summary>{html.escape(METRICS[metric][0])}</summary>"
                             f"{_table_html(t)}</details>")
        parts.append("</div>")
    return parts


def _statuses_html(df, counts, fails) -> list[str]:
    """Cells by status, the failed cells grouped by variant, status and reason, and the first
    reason each variant gave for a combination it does not support."""
    parts = ["<h2 id=status>Statuses</h2>", _table_html(counts)]
    if not fails.empty:
        parts.append(f"<h3>Failed cells and reasons</h3><p class=muted>{int(fails['cells'].sum())} cells in "
                     f"{len(fails)} groups of one variant, status and reason (failures.csv lists every cell)</p>"
                     + _table_html(fails, index=False))
    unsupported = df[df["status"] == "unsupported"].drop_duplicates("variant")[["variant", "reason"]]
    if not unsupported.empty:
        parts.append("<details><summary>unsupported combinations (first reason per variant)</summary>"
                     + _table_html(unsupported, index=False) + "</details>")
    return parts


OVERVIEW_NOTE = ("Per facet and n, the fastest exact variant (least median time; approximations are left out), its "
                 "time and peak memory, the runner-up, and the margin: the runner-up's time over the fastest's, the "
                 "median over the rounds the two were timed in together with its spread (min-max over the rounds), "
                 "or from their quartiles when they were not. A spread that reaches 1x does not tell the two apart. "
                 "overview.csv holds every group.")


OVERVIEW_OPEN = 24  # rows up to which the overview's full table is shown open (else the grid above says it)


def _open(part, several: bool) -> str:
    """A block of one group: switched by the selector when there are several."""
    if not several:
        return "<div>"
    return f"<div class=group data-group='{html.escape(part.group.slug)}'><h3>{html.escape(part.group.label)}</h3>"


def _overview_html(groups, not_run, style: dict) -> list[str]:
    from reports.groups import overview_display, winner_grid

    parts = ["<h2 id=overview>Which to use</h2>", f"<p class=muted>{html.escape(OVERVIEW_NOTE)}</p>"]
    if not_run is not None and not not_run.empty:
        parts.append("<h3>Not run here</h3><p class=muted>Variants with no ok cell in this report, each listed "
                     "once with its status and first reason (the charts leave them out; failures.csv lists every "
                     "cell)</p>" + _table_html(not_run, index=False))
    several = len(groups) > 1
    for part in groups:
        parts.append(_open(part, several))
        shown = overview_display(part.overview)
        if shown.empty:
            parts.append("<p class=muted>no exact variant ran in this group</p>")
        else:
            parts.append(winner_grid(part.overview, style))
            opened = " open" if len(shown) <= OVERVIEW_OPEN else ""
            parts.append(f"<details{opened}><summary>every facet and n: the fastest's time and memory, the runner-up, "
                         f"the margin ({len(shown)} rows)</summary>{_table_html(shown, index=False)}</details>")
        parts.append("</div>")
    return parts


MASKS_NOTE = ("Each mask is one predicate (bench/model/masks.py); its density is the fraction of (query, key) pairs it "
              "keeps, and the FLOPs count exactly those pairs (forward, one cell). 'flex skips' is the share of "
              "blocks FlexAttention's block mask leaves out.")


def _masks_html(masks) -> list[str]:
    if not masks or masks["table"].empty:
        return []
    parts = ["<h2 id=masks>Masks</h2>", f"<p class=muted>{html.escape(MASKS_NOTE)}</p>"]
    for key in ("patterns", "density"):
        png = next((p for p in masks.get(key) or [] if p.suffix == ".png"), None)
        if png:
            parts.append(f"<figure>{_img(png)}<figcaption class=muted>{key}{_svg_link(masks[key])}</figcaption>"
                         f"</figure>")
    parts.append(_table_html(masks["table"], index=False))
    return parts


def report_title(envs: list[dict]) -> str:
    """The runs, and the models their shapes are (sweep --model)."""
    models = list(dict.fromkeys(m for e in envs if (m := (e.get("spec") or {}).get("model"))))
    return "attnbench report: " + ", ".join(e["run"] for e in envs) + (f" ({', '.join(models)})" if models else "")
