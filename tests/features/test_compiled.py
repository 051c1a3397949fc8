"""The cases a compiled variant set up on this machine (bench.features.cost_model.compiled): recorded at a sweep's
end, read by the plan before it prices a compile as cold, void once the compiler's cache is gone."""

import pytest

from bench.features.cost_model import compiled, plan
from bench.model.case import Case


def _row(variant, case, status="ok"):
    return case.to_dict() | {"variant": variant, "status": status}


def test_a_recorded_compile_is_priced_from_the_cache_until_the_cache_is_wiped(registry, tmp_path):
    record, inductor = tmp_path / "compiled.json", tmp_path / "inductor"
    inductor.mkdir()
    (inductor / "fxgraph").mkdir()
    done, other = Case(q_len=256, kv_len=256), Case(q_len=512, kv_len=512)
    rows = [_row("flex", done), _row("flex", other, status="error"), _row("naive", done)]
    compiled.record(plan.compiled_pairs(rows, registry, "cpu"), "cpu", path=record, inductor_dir=inductor)
    seen = compiled.seen("cpu", path=record, inductor_dir=inductor)
    assert seen == {("flex", plan.case_key(done.to_dict()))}  # ok rows of a compiled variant only
    history = plan.History({}, {}, seen=seen)
    assert plan.cell_setup_s(registry["flex"], done, history) == plan.COMPILE_S["cpu"]
    assert plan.cell_setup_s(registry["flex"], other, history) == plan.COMPILE_COLD_S["cpu"]
    assert compiled.seen("cuda", path=record, inductor_dir=inductor) == frozenset()  # another device's
    (inductor / "fxgraph").rmdir()  # the compiler's cache wiped: every compile is cold again
    assert compiled.seen("cpu", path=record, inductor_dir=inductor) == frozenset()
    assert compiled.seen("cpu", path=record, inductor_dir=tmp_path / "elsewhere") == frozenset()


def test_a_later_visit_prices_a_compile_from_the_cache_its_first_visit_filled(registry):
    case = Case(q_len=256, kv_len=256)
    g = plan.groups([("flex", case), ("naive", case)], registry, 100.0)[0]
    assert g.setup_s == plan.COMPILE_COLD_S["cpu"] + plan.SETUP_S  # never compiled here
    timing = g.cost_s - g.setup_s
    assert plan.later_visit_s(g, registry, rounds=3) == pytest.approx(
        plan.COMPILE_S["cpu"] + plan.SETUP_S + plan.GROUP_OVERHEAD_S + 2 * plan.VISIT_WARM_S + timing / 3)
    xformers = plan.groups([("xformers", case)], registry, 100.0)[0]  # cannot run here: not visited again
    alone = plan.GROUP_OVERHEAD_S + xformers.cost_s / 3
    assert plan.later_visit_s(xformers, registry, rounds=3) == pytest.approx(alone)


def test_a_probes_refusal_is_recorded_for_the_machine_and_priced_at_nothing_anywhere(registry, tmp_path,
                                                                                      monkeypatch):
    """flex's CPU backward is refused by its own probe, in the worker: once a sweep has seen it, a
    plan in any folder prices neither its setup (a cold compile) nor its later visits."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path / "cache"))
    case = Case(q_len=256, kv_len=256, direction="fwd+bwd")
    cells = [("flex", case), ("naive", case)]
    before = plan.groups(cells, registry, 100.0, plan.load_history(tmp_path / "runs", "cpu", machine=True))[0]
    assert before.setup_s == pytest.approx(plan.COMPILE_COLD_BACKWARD_S["cpu"] + plan.SETUP_S)
    rows = [_row("flex", case, status="unsupported") | {"reason_kind": "library", "device": "cpu"},
            _row("naive", case, status="unsupported") | {"reason_kind": "capability", "device": "cpu"}]
    compiled.record_refused(plan.refused_pairs(rows, "cpu"), "cpu")
    assert compiled.refused("cpu") == {("flex", plan.case_key(case.to_dict()))}  # the probe's, not a capability's
    assert compiled.refused("cuda") == frozenset()
    history = plan.load_history(tmp_path / "runs", "cpu", machine=True)
    after = plan.groups(cells, registry, 100.0, history)[0]
    assert after.setup_s == pytest.approx(plan.SETUP_S)  # naive's alone
    assert plan.later_visit_s(after, registry, history, rounds=3) < plan.later_visit_s(before, registry, rounds=3) \
        - plan.COMPILE_S["cpu"] + 1e-9
