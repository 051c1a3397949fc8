"""A report that holds a large sweep: groups switched by a selector, at most MAX_FACETS panels
per chart, the overview of which variant to use, charts drawn once and again only when their
data changed, and every swept axis shown on every surface."""

import json
import re
import sys

import numpy as np
import pandas as pd
import pytest

from reports import charts as charts_module
from reports.build import build_report
from reports.charts import chart
from reports.frames import facet_labels, tidy
from reports.groups import MAX_FACETS, Group, overview, overview_display, split
from reports.tables import facet_tables, summary_table
from tests.conftest import ROOT, run_cli
from tests.support.browser import open_in_browser

sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
import report_scale  # noqa: E402

BASE = dict(device="cpu", dtype="float32", batch=1, heads=4, kv_heads=4, head_dim=64, mask="none", window=None,
            direction="fwd", q_len=256, kv_len=256, status="ok", reason="", reason_kind="")


def _row(variant, ms, **kw):
    r = BASE | {"variant": variant, "median_ms": ms, "q1_ms": ms * 0.98, "q3_ms": ms * 1.02, "iqr_ms": ms * 0.04,
                "peak_mem_bytes": 2**20 * ms, "samples": 30, "ci_halfwidth": 0.01}
    r.update(kw)
    if "q_len" in kw and "kv_len" not in kw:
        r["kv_len"] = kw["q_len"]
    return r


def _frame(rows):
    from reports.frames import speedups
    from reports.tables import with_metrics

    return with_metrics(speedups(tidy(pd.DataFrame(rows)), "naive"), "naive")


# -- groups and the facet limit -------------------------------------------------------------------------

def test_groups_split_by_dtype_head_dims_and_direction_and_keep_at_most_twelve_facets():
    rows = [_row(v, 1.0, dtype=d, head_dim=h, direction=dr, mask=m, heads=heads, kv_heads=heads, q_len=n)
            for v in ("naive", "sdpa") for d in ("float32", "bfloat16") for h in (64, 128)
            for dr in ("fwd", "fwd+bwd") for m in ("none", "causal", "padding") for heads in (4, 8, 16, 32, 64)
            for n in (128, 256)]
    df = _frame(rows)
    groups = split(df)
    # 2 dtypes x 2 head dims x 2 directions; 3 masks x 5 heads = 15 facets > 12: heads becomes a group axis
    assert len(groups) == 2 * 2 * 2 * 5
    assert all(len(set(facet_labels(g.frame))) <= MAX_FACETS for g in groups)
    assert {g.label for g in groups} >= {"dtype=bfloat16, head_dims=64, direction=fwd, heads=4"}
    assert len({g.slug for g in groups}) == len(groups)  # each group its own chart folder
    assert sum(len(g.frame) for g in groups) == len(df)  # every row in exactly one group


def test_a_group_of_more_masks_than_the_limit_is_cut_into_parts():
    masks = ["none", "causal", "padding", "alibi", "checker:4", "document:4", "prefix_lm:16", "dilated:2",
             "strided:16", "sink:4", "causal&sink:4", "global:4", "random:0.5", "causal&checker:4"]
    rows = [_row(v, 1.0, mask=m, q_len=n) for v in ("naive", "sdpa") for m in masks for n in (128, 256)]
    groups = split(_frame(rows))
    assert [g.label for g in groups] == ["all cells (part 1 of 2)", "all cells (part 2 of 2)"]
    assert [len(set(g.frame["mask"])) for g in groups] == [12, 2]


def test_one_group_keeps_the_plain_chart_names():
    groups = split(_frame([_row(v, 1.0, q_len=n) for v in ("naive", "sdpa") for n in (128, 256)]))
    assert [g.slug for g in groups] == [""]


def test_a_chart_never_draws_more_panels_than_the_limit(tmp_path, monkeypatch):
    """Whatever a group holds, chart() is handed at most MAX_FACETS facets by split() and draws one
    panel each: counted on the figure it saves."""
    rows = [_row(v, 1.0 + (v == "sdpa"), mask=m, heads=h, kv_heads=h, q_len=n) for v in ("naive", "sdpa")
            for m in ("none", "causal", "padding") for h in (4, 8, 16, 32, 64) for n in (128, 256)]
    seen = []
    monkeypatch.setattr(charts_module, "save_figure", lambda fig, out: seen.append(len(fig.axes)) or [out])
    style = charts_module.variant_style(["naive", "sdpa"], "naive")
    for g in split(_frame(rows)):
        chart(g.frame, "time_ms", "ms", "t", style, "naive", tmp_path / g.slug)
    assert seen and max(seen) <= MAX_FACETS and sum(seen) == 15


# -- the overview: which to use ------------------------------------------------------------------------

def test_the_overview_names_the_fastest_exact_variant_the_runner_up_and_the_margin():
    rows = []
    for n, (naive, sdpa, flex, approx) in {128: (1.0, 0.5, 0.8, 0.1), 256: (4.0, 2.5, 2.0, 0.2)}.items():
        rounds = {"naive": [naive] * 3, "sdpa": [sdpa * f for f in (1.0, 1.02, 0.98)], "flex": [flex * f for f in
                                                                                                (1.1, 1.0, 0.95)]}
        for v, ms in (("naive", naive), ("sdpa", sdpa), ("flex", flex)):
            rows.append(_row(v, ms, q_len=n, round_medians_ms=rounds[v], interleave_id=f"r{n}"))
        rows.append(_row("linear.elu", approx, q_len=n, approximate=True))  # faster, but not exact: left out
    t = overview(Group("", "all cells", _frame(rows)))
    assert t[["n", "fastest", "runner-up"]].values.tolist() == [[128, "sdpa", "flex"], [256, "flex", "sdpa"]]
    assert t["median ms"].tolist() == [0.5, 2.0]
    # the margin is the runner-up over the fastest per round: 128: 0.8*(1.1, 1.0, 0.95) / 0.5*(1.0, 1.02, 0.98)
    per_round = [0.8 * a / (0.5 * b) for a, b in zip((1.1, 1.0, 0.95), (1.0, 1.02, 0.98))]
    first = t.iloc[0]
    assert first["margin"] == pytest.approx(float(np.median(per_round)))
    assert (first["margin low"], first["margin high"]) == pytest.approx((min(per_round), max(per_round)))
    assert first["paired"]
    shown = overview_display(t)
    assert shown["margin (spread)"].iloc[0].startswith(f"{first['margin']:.2f}x (")


def test_the_overview_says_when_two_variants_are_not_told_apart():
    rows = [_row("naive", 1.0, round_medians_ms=[1.0, 1.0, 1.0], interleave_id="a"),
            _row("sdpa", 0.99, round_medians_ms=[0.95, 0.99, 1.05], interleave_id="a")]
    shown = overview_display(overview(Group("", "all cells", _frame(rows))))
    assert shown["margin (spread)"].iloc[0].endswith("not told apart")


# -- charts drawn once: the cache --------------------------------------------------------------------------

def _synthetic_run(folder, rows):
    """A folder of rows given by their figures, stored as row format 1 stores them."""
    import json

    from bench.runs.store import RESULTS, write_env
    from tests.support.runs import format_1_record

    folder.mkdir(parents=True, exist_ok=True)
    write_env(folder, {"device": "cpu", "baseline": "naive", "peaks_tflops": {"float32": 1.0, "bfloat16": 2.0},
                       "row_formats": [[1, 1]]})
    with open(folder / RESULTS, "a") as f:
        f.writelines(json.dumps(format_1_record(r)) + "\n" for r in rows)
    return folder


def test_a_second_build_draws_only_the_charts_whose_data_changed(tmp_path, monkeypatch):
    def rows(slow=1.0):
        return [_row(v, (1.0 if v == "naive" else 0.5) * (slow if d == "bfloat16" else 1.0) * n / 128, dtype=d,
                     q_len=n) for v in ("naive", "sdpa") for d in ("float32", "bfloat16") for n in (128, 256, 512)]

    drawn = []
    real = charts_module._draw_all

    def counting(jobs):
        drawn.append([str(j[3]["out"].relative_to(tmp_path / "run" / "report" / "charts")) for j in jobs])
        return real(jobs)

    monkeypatch.setattr(charts_module, "_draw_all", counting)
    run = _synthetic_run(tmp_path / "run", rows())
    images = build_report([run]).read_text().count("data:image/png;base64,")
    assert any(p.startswith("float32/time") for p in drawn[0]) and any(p.startswith("bfloat16/") for p in drawn[0])
    build_report([run])
    assert len(drawn) == 1  # nothing changed: nothing drawn again
    (run / "results.jsonl").unlink()
    _synthetic_run(run, rows(slow=1.5))  # bfloat16's times change, float32's do not
    page = build_report([run])
    # float32's charts are kept; bfloat16's and those drawn across the groups (the roofline) are drawn again
    assert "bfloat16/time" in drawn[1] and not any(p.startswith("float32/") for p in drawn[1]), drawn[1]
    assert page.read_text().count("data:image/png;base64,") == images >= 6  # the kept charts are on the page


# -- every swept axis on every surface ------------------------------------------------------------------------

AXES = {  # axis: (row changes for value a, for value b, (summary column, its two values), what labels show)
    "dtype": ({"dtype": "float32"}, {"dtype": "bfloat16"}, ("dtype", "float32", "bfloat16")),
    "head_dim": ({"head_dim": 64}, {"head_dim": 128}, ("head_dim", "64", "128"), ("head_dims=64", "head_dims=128")),
    "direction": ({"direction": "fwd"}, {"direction": "fwd+bwd"}, ("direction", "fwd", "fwd+bwd")),
    "mask": ({"mask": "none"}, {"mask": "causal"}, ("mask", "none", "causal")),
    "window": ({"mask": "window", "window": 16}, {"mask": "window", "window": 64}, ("window", "16", "64"),
               ("window=16", "window=64")),
    "lengths": ({"lengths": "fixed"}, {"lengths": "uniform:0.5"}, ("lengths", "fixed", "uniform:0.5")),
    "inputs": ({"inputs": "normal"}, {"inputs": "clustered"}, ("inputs", "normal", "clustered")),
    "kv_layout": ({"kv_layout": "contiguous"}, {"kv_layout": "paged:16"}, ("kv_layout", "contiguous", "paged:16")),
    "batch": ({"batch": 1}, {"batch": 4}, ("batch", "1", "4"), ("batch=1", "batch=4")),
    "heads": ({"heads": 4, "kv_heads": 4}, {"heads": 8, "kv_heads": 8}, ("heads", "4", "8"), ("heads=4", "heads=8")),
    "kv_heads": ({"kv_heads": 4}, {"kv_heads": 1}, ("kv_heads", "4", "1"), ("kv_heads=4", "kv_heads=1")),
    "kv_len": ({"kv_len": 256}, {"kv_len": 1024}, ("kv_len", "256", "1024"), ("kv=self", "kv=1024")),
    "align": ({"align": "top-left", "kv_len": 1024}, {"align": "bottom-right", "kv_len": 1024},
              ("align", "top-left", "bottom-right")),
}


def _column(table: str, name: str) -> set[str]:
    """The values of one column of the summary's tabulate table (cut by the dashes under the header)."""
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if set(line.replace(" ", "")) == {"-"})
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[at])]
    header = [lines[at - 1][a:b + 1].strip() for a, b in spans]
    a, b = spans[header.index(name)]
    return {line[a:b + 1].strip() for line in lines[at + 1:] if line.strip() and not line.startswith("*")}


@pytest.mark.parametrize("axis", sorted(AXES))
def test_each_swept_axis_shows_both_values_in_the_summary_the_tables_and_the_charts(axis, tmp_path, monkeypatch):
    a, b, (column, value_a, value_b), *labels = AXES[axis]
    text_a, text_b = labels[0] if labels else (value_a, value_b)
    rows = [_row(v, 1.0 + (v == "sdpa") + 0.5 * i, q_len=n, **change) for i, change in enumerate((a, b))
            for v in ("naive", "sdpa") for n in (128, 256)]
    assert {value_a, value_b} <= _column(summary_table(rows), column)
    df = _frame(rows)
    tables = [label for g in split(df) for label, _ in facet_tables(g.frame, "naive")]
    groups = [g.label for g in split(df)]
    titles = []

    def keep(fig, out):
        titles.extend([fig._suptitle.get_text()] + [ax.get_title() for ax in fig.axes])
        return [out]

    monkeypatch.setattr(charts_module, "save_figure", keep)
    style = charts_module.variant_style(["naive", "sdpa"], "naive")
    for g in split(df):
        chart(g.frame, "time_ms", "ms", "t", style, "naive", tmp_path / (g.slug or "all"))
    for surface, text in (("tables", " | ".join(groups + tables)), ("charts", " | ".join(groups + titles))):
        assert text_a in text and text_b in text, (surface, text)


# -- a large generated run, in the browser -------------------------------------------------------------------

@pytest.fixture(scope="module")
def large_run(tmp_path_factory):
    """A real small sweep's rows copied under 3 dtypes, 2 head dims and 6 length scales
    (tests/benchmarks/report_scale.py): 12 groups once its two directions are counted."""
    root = tmp_path_factory.mktemp("large")
    src = root / "src"
    proc = run_cli("sweep", "--out", src, "--variants", "naive,sdpa,linear.elu", "--seq-lens", "64,128",
                   "--heads", "2", "--head-dims", "16", "--masks", "none,causal", "--directions", "fwd,fwd+bwd",
                   "--budget-ms", "5", "--no-report", "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = report_scale.make_run(src, 24 * 36, root / "run")  # every dtype, head dim and length scale once
    assert rows == 24 * 36
    return root / "run", build_report([root / "run"])


@pytest.mark.slow
def test_a_large_report_switches_groups_in_the_browser_and_fits_1400_px(large_run):
    run, page = large_run
    text = page.read_text()
    options = re.findall(r"<option value='([^']+)'>", text)
    assert len(options) == 12 and len(set(options)) == 12
    assert all(text.count(f"data-group='{o}'") == 3 for o in options)  # its overview, its charts, its tables
    seen = open_in_browser(page, switch_to=options[-1])
    assert seen["broken"] == [] and seen["images"] >= 12 * 4, seen  # every chart decoded, the hidden ones too
    assert seen["errors"] == [], seen["errors"]
    assert seen["scroll_width"] <= seen["width"] == 1400, seen
    # before the switch only the first group's blocks show; after it, only the last one's
    assert set(seen["shown_before"]) == {options[0]} and set(seen["shown_after"]) == {options[-1]}, seen
    overview_csv = pd.read_csv(run / "report" / "overview.csv")
    assert overview_csv["group"].nunique() == 12 and set(overview_csv["fastest"]) <= {"naive", "sdpa"}
    drawn = json.loads((run / "report" / "charts" / ".drawn.json").read_text())
    assert sum(1 for k in drawn if k.endswith("/time")) == 12


@pytest.mark.slow
def test_the_page_and_report_md_give_their_sections_in_one_order(large_run):
    run, page = large_run
    names = {"overview": "Which to use", "charts": "Charts", "masks": "Masks", "scaling": "Scaling",
             "tables": "Tables", "status": "Statuses", "env": "Environment"}
    html_order = [names[i] for i in re.findall(r"<h2 id=(\w+)>", page.read_text())]
    md = (run / "report" / "report.md").read_text()
    md_order = [h for h in re.findall(r"^## (.+)$", md, re.M) if h in names.values()]
    assert html_order == md_order == list(names.values())
    # each group's overview and charts, in the page's group order, in both
    labels = re.findall(r"<option value='[^']+'>([^<]+)</option>", page.read_text())
    sections = md.split("\n## ")
    for title in ("Which to use", "Charts"):
        body = next(s for s in sections if s.startswith(title))
        assert re.findall(r"^### (.+)$", body, re.M)[-len(labels):] == labels


def _rows_of(rows):
    import pandas as pd

    from reports.frames import tidy

    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
                window=None, direction="fwd", reason="", status="ok")
    return tidy(pd.DataFrame([base | r | {"kv_len": r["q_len"]} for r in rows]))


def _rounds(variant, n, rounds, **kw):
    med = sorted(rounds)[len(rounds) // 2]
    return dict(variant=variant, q_len=n, median_ms=med, q1_ms=min(rounds), q3_ms=max(rounds),
                round_medians_ms=list(rounds), interleave_id=f"rounds-{n}", **kw)


def test_a_crossover_within_three_percent_is_not_stated():
    """b beats a in every round above n = 512, but by 1 %: within what the charts call equal, so no
    crossover; by 10 %, it is one."""
    from reports.scaling import crossovers

    def rows(gain):
        out = []
        for n, ratio in ((256, 1.10), (512, 1.10), (1024, gain), (2048, gain)):
            out.append(_rounds("a", n, [1.0, 1.1, 0.9]))
            out.append(_rounds("b", n, [1.0 * ratio, 1.1 * ratio, 0.9 * ratio]))
        return out
    assert crossovers(_rows_of(rows(0.99))).empty
    c = crossovers(_rows_of(rows(0.90)))
    assert list(c["faster_above"]) == ["b"]


def test_which_to_use_never_shows_a_runner_up_faster_than_the_fastest():
    """The medians put a first, the paired rounds put b first: the rounds decide, the margin is >= 1."""
    from reports.groups import Group, overview, overview_display

    a = _rounds("a", 256, [1.00, 1.50, 0.70])  # median 1.00
    b = _rounds("b", 256, [0.98, 1.48, 1.01])  # median 1.01, yet faster than a in 2 of 3 rounds
    t = overview(Group("", "all", _rows_of([a, b])))
    assert t["margin"].iloc[0] >= 1.0 and t["fastest"].iloc[0] == "b"
    assert "not told apart" in overview_display(t)["margin (spread)"].iloc[0]


def test_not_run_here_lists_only_variants_that_never_ran():
    from reports.groups import not_run

    df = _rows_of([dict(variant="ok", q_len=64, median_ms=1.0),
                   dict(variant="broken", q_len=64, status="error", reason="RuntimeError: x"),
                   dict(variant="gpu.only", q_len=64, status="unsupported", reason="device cpu not supported")])
    assert list(not_run(df)["variant"]) == ["gpu.only"]
