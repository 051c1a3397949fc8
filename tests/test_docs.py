"""The documentation: README.md is a user's guide, the reference sits beside the code it describes,
bench/README.md's commands are generated from the declarations and never stale, every link between
the guides resolves, and no guide quotes a dated timing of the harness itself."""

import re

import pytest

from tests.conftest import ROOT

# a timing quoted as measured somewhere: "on this VM", "took 35 s", "(95 ms here)"
DATED = re.compile(r"(this VM|2-core VM|\btook \d[\d.,]* ?(s|ms|min|minutes)\b|\d[\d.,]* ?(s|ms|min|minutes) here\b)")
GUIDES = ("README.md", "bench/README.md", "bench/measure/README.md", "reports/README.md", "variants/README.md")


def test_the_generated_commands_in_bench_readme_are_current():
    """Every command and flag of the parser, and every sweep setting, as the declarations give them
    today: a flag added, renamed or re-explained without `python -m bench.cli.reference --write`
    fails here."""
    from bench.cli.reference import current, render

    written = current((ROOT / "bench" / "README.md").read_text())
    assert written is not None, "bench/README.md has no generated part"
    assert written == render(), "bench/README.md is stale: run python -m bench.cli.reference --write"


def test_the_generated_reference_names_every_flag_of_every_command():
    import argparse

    from bench.cli import build_parser
    from bench.cli.reference import render

    text = render()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        assert f"`python -m bench {name}`" in text, name
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in text, (name, option)


def test_the_reference_is_not_blind_to_a_new_setting(monkeypatch):
    """A setting declared once appears in the generated reference with its flag, key and help."""
    from bench.cli import reference
    from bench.model import spec as spec_module

    toy = spec_module.Setting("a toy axis for this test", spec_module.ints(8), axis=True, case=True)
    monkeypatch.setitem(spec_module.SETTINGS, "toy_axis", toy)
    text = reference.render()
    assert "| `--toy-axis` TOY_AXIS | `toy_axis` | yes |" in text and "a toy axis for this test" in text


def test_readme_is_a_guide_of_at_most_250_lines_that_links_to_the_reference():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for guide in GUIDES[1:]:
        assert f"({guide}" in text, guide  # linked from the guide


@pytest.mark.parametrize("guide", GUIDES)
def test_every_relative_link_of_a_guide_resolves(guide):
    path = ROOT / guide
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", path.read_text(), flags=re.S))  # code is no link
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{guide}: {target}"


@pytest.mark.parametrize("guide", GUIDES)
def test_no_guide_quotes_a_dated_timing_of_the_harness(guide):
    """A figure a reader needs comes from a command in tests/benchmarks, named beside it; the
    guides do not carry 'took 35 s on this VM'."""
    hits = [line for line in (ROOT / guide).read_text().splitlines() if DATED.search(line)]
    assert not hits, hits


def test_the_dated_timing_scan_is_not_blind():
    dated, undated = ["the first command took 35 s: naive fits", "(95 ms here)"], ["it took the cores",
                                                                                   "the same jobs on this machine"]
    assert all(DATED.search(line) for line in dated) and not any(DATED.search(line) for line in undated)
