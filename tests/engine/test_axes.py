"""What the later axes of a case derive: a field of the case splits the memory models and comes back
in a model's case, a later axis that is a setting comes back in the repro command under a flag of
its own name, and a facet at its default goes unsaid; no list of them is kept apart."""

import pandas as pd

from bench.features import repro
from bench.model.case import CASE_ADDED, CASE_DEFAULTS, Case
from bench.model.spec import SETTINGS
from bench.runs import memmodel
from reports import frames


def _row(n: int, **fields) -> dict:
    case = Case("cpu", "float32", 1, 2, 2, n, n, 8, "none", None, "fwd").replace(**fields)
    return {"variant": "naive", **case.to_dict(), "status": "ok", "peak_mem_bytes": 10 * n * n + 100 * n}


def test_every_case_field_but_the_lengths_splits_the_memory_models_and_comes_back_in_their_cases():
    rows = [_row(n, inputs=i, align=a) for n in (64, 128, 256) for i, a in (("normal", "top-left"),
                                                                          ("outliers", "top-left"),
                                                                          ("normal", "bottom-right"))]
    models = memmodel.models(rows)
    assert len(models) == 3  # one per (inputs, align): neither is averaged over
    for m in models:
        first = next(r for r in rows if r["inputs"] == m.key["inputs"] and r["align"] == m.key["align"])
        assert m.case(64).to_dict() == {k: v for k, v in first.items() if k in Case.__dataclass_fields__}


def test_every_later_axis_that_is_a_setting_comes_back_in_the_repro_command():
    row = {"variant": "naive", "device": "cpu", "dtype": "float32", "batch": 1, "heads": 2, "kv_heads": 2,
           "q_len": 16, "kv_len": 16, "head_dim": 8, "mask": "none", "direction": "fwd", "mix": "none"}
    settings = {f for f in CASE_ADDED if f in SETTINGS}
    assert not any(f"--{f.replace('_', '-')}" in repro.cell_flags(row) for f in settings)  # defaults unsaid
    values = {"lengths": "uniform:0.5", "inputs": "outliers", "kv_layout": "paged:64", "align": "bottom-right",
              "scope": "encoder", "ffn": "swiglu", "ranks": 2}
    assert set(values) == settings  # a new later axis that is a setting: give it a value here
    for field, value in values.items():
        flags = repro.cell_flags(row | {field: value})
        assert flags[flags.index("--" + field.replace("_", "-")) + 1] == str(value)


def test_a_later_axis_shown_as_a_facet_goes_unsaid_at_its_default_and_said_otherwise():
    shown = [c for c in CASE_ADDED if c in frames.FACET_COLS]
    df = pd.DataFrame([{c: CASE_DEFAULTS[c] for c in shown}] * 2)
    assert frames.constant_facets(df) == {}
    for c in shown:
        other = "encoder" if c == "scope" else "x"
        assert frames.constant_facets(df.assign(**{c: other})) == {c: other}


def test_a_later_setting_leaves_a_sweep_id_as_it_was_at_its_default_and_moves_it_otherwise():
    """A new axis declared ``later`` (a toy one, on a Spec of its own) needs no list of defaults
    kept apart for the sweep id: older sweeps keep their id, and a value of the axis is measured."""
    import dataclasses

    from bench.model.spec import Spec, setting, sweep_id, texts

    toy = setting("a toy axis", texts, default=("plain",), axis=True, case=True, later=True)
    Toy = dataclasses.make_dataclass("Toy", [("toy", list, toy)], bases=(Spec,), frozen=True)
    given = dict(variants=["naive"], seq_lens=[128], heads=[2], head_dims=[16], batch=[1], dtypes=["float32"],
                 masks=["none"], window=[64], directions=["fwd"])
    assert sweep_id(Toy(**given)) == sweep_id(Spec(**given))
    assert sweep_id(Toy(**given, toy=["spicy"])) != sweep_id(Spec(**given))
    assert sweep_id(Toy(**given, steps=2)) != sweep_id(Toy(**given))  # the built-in later settings alike


def test_every_case_field_is_a_facet_and_every_facet_has_its_place_in_the_groups():
    """The report names a case's fields in one order (reports.frames.FACET_COLS); a new case field
    fails here until it has its place there, and in the groups: a group axis, one promoted to a
    group axis when a group holds too many facets, or the mask, which stays beside the others."""
    from bench.model.case import CASE_FIELDS
    from reports import groups

    assert set(frames.CASE_FACETS) == set(CASE_FIELDS) - {"q_len"}  # the length is every chart's x axis
    placed = [*groups.GROUP_AXES, *groups.PROMOTE, "mask"]
    assert sorted(placed) == sorted(frames.FACET_COLS)
