"""Inductor's CPU vector-ISA probe is learnt once per machine: a worker records what its probe
found, and a later one with the same torch, CPU flags and compiler skips the probe, picking the
same ISA; a failed ISA, a user's own setting or another key leaves the probe to torch."""

import json
import platform
import sys

import pytest

from bench.engine import vecisa

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"),
                                reason="Inductor's probe of x86 vector ISAs")


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    from torch._inductor import config

    monkeypatch.setitem(vecisa._STATE, "learnt", False)
    with config.patch({"cpp.vec_isa_ok": None}):  # as a worker starts, unless the user set it
        yield tmp_path / vecisa.FILE


def test_a_probe_is_recorded_then_trusted_and_the_same_isa_is_picked(fresh):
    from torch._inductor import config
    from torch._inductor import cpu_vec_isa as isa

    isa.valid_vec_isa_list.cache_clear()  # as in a fresh worker (this test process may have compiled before)
    vecisa.learn(fresh)
    assert not fresh.exists()  # no probe has run yet in this process: nothing to learn
    probed = [str(i) for i in isa.valid_vec_isa_list()]  # what a CPU compile runs first
    picked = str(isa.pick_vec_isa())
    vecisa.learn(fresh)
    (entry,) = json.loads(fresh.read_text()).values()
    assert entry["passed"] == probed and entry["all_passed"] == (probed == entry["isas"])
    if not entry["all_passed"]:
        pytest.skip(f"this machine's probe refused {set(entry['isas']) - set(probed)}: nothing to trust")
    vecisa._STATE["learnt"] = False
    assert vecisa.trust(fresh) is True
    assert config.cpp.vec_isa_ok is True  # Inductor's own override: no probe
    isa.valid_vec_isa_list.cache_clear()
    try:
        assert [str(i) for i in isa.valid_vec_isa_list()] == probed and str(isa.pick_vec_isa()) == picked
    finally:
        isa.valid_vec_isa_list.cache_clear()


def test_nothing_is_trusted_where_an_isa_failed_the_key_differs_or_the_user_decided(fresh):
    from torch._inductor import config

    names, key = vecisa._candidates()
    fresh.write_text(json.dumps({key: {"isas": names, "passed": names[1:], "all_passed": False}}))
    assert vecisa.trust(fresh) is False and config.cpp.vec_isa_ok is None
    fresh.write_text(json.dumps({"2.0.0|avx2|/usr/bin/g++@1": {"isas": ["avx2"], "passed": ["avx2"],
                                                              "all_passed": True}}))
    assert vecisa.trust(fresh) is False and config.cpp.vec_isa_ok is None  # another torch, CPU or compiler
    fresh.write_text(json.dumps({key: {"isas": names, "passed": names, "all_passed": True}}))
    config.cpp.vec_isa_ok = False  # TORCHINDUCTOR_VEC_ISA_OK=0
    assert vecisa.trust(fresh) is False and config.cpp.vec_isa_ok is False
    config.cpp.vec_isa_ok = None
    fresh.write_text("{not json")
    assert vecisa.trust(fresh) is False and config.cpp.vec_isa_ok is None  # an unreadable record: the probe runs
