"""A feature adds to a sweep's preparation by its declaration alone (bench.engine.prepare's
protocol): a toy feature's preps, declared beside the others, narrow the spec's cells before the
run folder is read and project what is left after it; the sweep command prints the toy's plan and
the sweep runs the cells it kept.  A feature's command may also run a sweep its own way
(``sweep_instead``)."""

import json
import sys
import types

import pytest

from bench.cli import main
from bench.engine import prepare
from bench.engine.prepare import FOLDER, Prep
from bench.model import features

SWEEP = ["sweep", "--variants", "naive", "--seq-lens", "16,32,48", "--heads", "2", "--head-dims", "8", "--masks",
         "none", "--directions", "fwd", "--device", "cpu", "--budget-ms", "5", "--visits", "1", "--remeasure", "0",
         "--no-report", "--quiet"]


class ToyProjection:
    model = 7

    def __init__(self, cells):
        self.cells, self.wall_s, self.model_rest_s = cells, 1.5 * len(cells), 0.5 * len(cells)

    def lines(self):
        return [f"toy: {len(self.cells)} cells left, n = {sorted(c.q_len for _, c in self.cells)}"]


@pytest.fixture
def toy(monkeypatch):
    """A toy feature whose first prep drops the cases of n = 32, and whose second (after the folder)
    projects what is left."""
    seen = []
    module = types.ModuleType("toy_prep")

    def narrow(p):
        seen.append(("narrow", len(p.cells), len(p.todo)))
        p.cells = [(n, c) for n, c in p.cells if c.q_len != 32]

    def project(p):
        seen.append(("project", len(p.cells), len(p.todo), p.done))
        p.projection = ToyProjection(p.todo)

    module.NARROW = Prep("toy narrowing", 15, narrow)
    module.PROJECT = Prep("toy projection", FOLDER + 20, project)  # after the cost model's: it has the last word
    monkeypatch.setitem(sys.modules, "toy_prep", module)
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, features.Feature(
        "toy", "a toy", preps=("toy_prep:PROJECT", "toy_prep:NARROW"))))
    prepare.preps.cache_clear()
    yield seen
    prepare.preps.cache_clear()


def test_a_declared_prep_narrows_the_cells_and_another_projects_what_is_left(toy, capsys):
    names = [p.name for p in prepare.preps()]
    assert names.index("toy narrowing") < names.index("toy projection") and "the projection" in names
    assert main([*SWEEP, "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "toy: 2 cells left, n = [16, 48]"
    assert toy == [("narrow", 3, 0), ("project", 2, 2, 0)]  # before the folder: no todo; after it, none done


@pytest.mark.slow  # a real sweep, its worker a process of its own
def test_the_sweep_runs_the_prepared_cells_and_records_the_projection(toy, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SWEEP, "--out", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["q_len"] for r in rows) == [16, 48]
    history = json.loads((out / "env.json").read_text())["history"][-1]
    assert (history["projected_s"], history["model_rest_s"], history["model"]) == (3.0, 1.0, 7)
    assert "toy: 2 cells left" in capsys.readouterr().err  # the plan line
    toy.clear()
    assert main([*SWEEP, "--resume", str(out), "--dry-run"]) == 0
    assert toy == [("narrow", 3, 0), ("project", 2, 0, 2)]  # resumed: both kept cells are done


def test_a_feature_s_command_may_run_the_sweep_its_own_way(monkeypatch, tmp_path, capsys):
    module = types.ModuleType("toy_instead")
    calls = []

    def add_parser(sub):
        sub.add_parser("toy-instead", help="a toy command").set_defaults(func=lambda args: 0)

    def sweep_instead(spec, registry, args, resume):
        calls.append((spec.seq_lens, registry.names(), resume))
        return 5 if spec.seq_lens == [16, 32, 48] else None

    module.add_parser, module.sweep_instead = add_parser, sweep_instead
    monkeypatch.setitem(sys.modules, "toy_instead", module)
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, features.Feature(
        "toy", "a toy", commands=("toy_instead",))))
    assert main([*SWEEP, "--out", str(tmp_path / "run")]) == 5
    assert calls[0][0] == [16, 32, 48] and "naive" in calls[0][1] and calls[0][2] is None
    assert not (tmp_path / "run").exists()  # taken over before any folder or worker
    assert main([*SWEEP[:4], "16", *SWEEP[5:], "--dry-run"]) == 0  # None: the sweep goes on here (a plan)
