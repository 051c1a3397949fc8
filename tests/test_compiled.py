"""The cases a compiled variant set up on this machine (bench.engine.compiled): recorded at a sweep's
end, read by the plan before it prices a compile as cold, void once the compiler's cache is gone."""

import pytest

from bench.engine import compiled, plan
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
