"""What the later axes of a case derive: a field added to the case (CASE_ADDED) is a memory model's
group field unless it is a length, a repro flag of its own name when it is a setting, and a facet
whose default goes unsaid; no list of them is kept apart."""

from bench.engine import memmodel, repro
from bench.model.case import CASE_ADDED, CASE_DEFAULTS, CASE_FIELDS
from bench.model.spec import SETTINGS
from reports import frames


def test_every_case_field_is_a_memory_model_group_field_or_a_length():
    assert set(memmodel.GROUP) | set(memmodel.LENGTH_FIELDS) == {"variant", *CASE_FIELDS}
    assert not set(memmodel.GROUP) & set(memmodel.LENGTH_FIELDS)


def test_every_later_axis_that_is_a_setting_comes_back_in_the_repro_command():
    row = {"variant": "naive", "device": "cpu", "dtype": "float32", "batch": 1, "heads": 2, "kv_heads": 2,
           "q_len": 16, "kv_len": 16, "head_dim": 8, "mask": "none", "direction": "fwd", "mix": "none"}
    assert set(repro.WORKLOAD_FLAGS) == {f for f in CASE_ADDED if f in SETTINGS}
    assert not any(f"--{f.replace('_', '-')}" in repro.cell_flags(row) for f in repro.WORKLOAD_FLAGS)  # defaults
    for field, value in (("lengths", "uniform:0.5"), ("inputs", "outliers"), ("kv_layout", "paged:64"),
                         ("align", "bottom-right"), ("scope", "encoder"), ("ffn", "swiglu")):
        assert field in repro.WORKLOAD_FLAGS
        flags = repro.cell_flags(row | {field: value})
        flag = "--" + field.replace("_", "-")
        assert flags[flags.index(flag) + 1] == value


def test_a_later_axis_shown_as_a_facet_goes_unsaid_at_its_default():
    for field in CASE_ADDED:
        if field in frames.FACET_COLS:
            assert frames.FACET_DEFAULTS[field] == CASE_DEFAULTS[field]
