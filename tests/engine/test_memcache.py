"""A cell's memory peak is measured once per machine and taken from the record after that, while it
is younger than --peak-age and nothing it depends on changed (bench.engine.memcache)."""

import importlib.util
import json
import sys
import time

import pytest
import torch.nn.functional as F

from bench.engine.cell import run_group
from bench.engine.memcache import MemoryCache
from bench.measure import memory as memory_pass
from bench.measure.settings import MeasureSettings
from bench.model.case import Case
from bench.registry import Variant


def _sdpa(name="memvar"):
    def factory(case):
        def attention(q, k, v):
            return F.scaled_dot_product_attention(q, k, v)
        return attention
    return Variant(name=name, factory=factory, description=name, module=__name__)


CASE = Case("cpu", "float32", 1, 2, 2, 64, 64, 16, "none", None, "fwd")


@pytest.fixture
def passes(monkeypatch):
    """The memory passes that really ran."""
    calls = []
    real = memory_pass.peak_bytes
    monkeypatch.setattr(memory_pass, "peak_bytes", lambda device, call: calls.append(device) or real(device, call))
    return calls


SETTINGS = MeasureSettings(budget_ms=3, rounds=1, threads=1)


def _row(memory, settings=SETTINGS):
    rows = []
    run_group([_sdpa()], CASE, settings, rows.append, kept={"memory": memory})
    assert rows[0]["status"] == "ok", rows[0]["reason"]
    return rows[0]


def test_a_peak_measured_once_is_taken_from_the_record_by_the_next_worker(tmp_path, passes, monkeypatch):
    from bench.engine import memcache

    monkeypatch.setattr(memcache, "FLUSH_EVERY_S", 1e9)  # no write but the forced one, however slow the machine
    path = tmp_path / "memory.json"
    first = _row(MemoryCache("cpu-test", path))
    assert passes == ["cpu"] and first["peak_mem_cached"] is False and first["peak_mem_bytes"] > 0
    assert not path.exists()  # written by flush, not per cell
    writer = MemoryCache("cpu-test", path)
    _row(writer)
    writer.flush()
    assert not path.exists()  # within FLUSH_EVERY_S of the last: kept for the next
    writer.flush(force=True)  # as the worker exits
    assert len(json.loads(path.read_text())) == 1 and len(passes) == 2
    again = _row(MemoryCache("cpu-test", path))  # a fresh worker, reading the record
    assert len(passes) == 2  # no memory pass
    assert again["peak_mem_cached"] is True and again["peak_mem_bytes"] == json.loads(path.read_text()).popitem()[1][
        "bytes"]
    other = _row(MemoryCache("another-cpu", path))  # another machine's name: measured
    assert len(passes) == 3 and other["peak_mem_cached"] is False
    fresh = _row(MemoryCache("cpu-test", path), SETTINGS.replace(peak_age_h=0))
    assert len(passes) == 4 and fresh["peak_mem_cached"] is False  # --peak-age 0: always measured


def test_an_old_record_is_measured_again(tmp_path, passes):
    path = tmp_path / "memory.json"
    cache = MemoryCache("cpu-test", path)
    key = cache.key(_sdpa(), CASE, 1)
    path.write_text(json.dumps({key: {"bytes": 12345, "t": time.time() - 25 * 3600}}))
    assert MemoryCache("cpu-test", path).get(key, 24.0) is None  # older than 24 h
    assert MemoryCache("cpu-test", path).get(key, 48.0) == 12345
    row = _row(MemoryCache("cpu-test", path))
    assert passes == ["cpu"] and row["peak_mem_bytes"] != 12345


def test_the_key_changes_with_the_variants_code_the_case_and_the_threads(tmp_path, monkeypatch):
    plugin = tmp_path / "memplug.py"
    plugin.write_text("X = 1\n")
    spec = importlib.util.spec_from_file_location("memplug", plugin)
    monkeypatch.setitem(sys.modules, "memplug", importlib.util.module_from_spec(spec))
    cache = MemoryCache("cpu-test", tmp_path / "memory.json")
    variant = Variant(name="p", factory=lambda case: None, description="p", module="memplug")
    before = cache.key(variant, CASE, 1)
    assert cache.key(variant, CASE, 2) != before
    assert cache.key(variant, Case("cpu", "float32", 1, 2, 2, 128, 128, 16, "none", None, "fwd"), 1) != before
    plugin.write_text("X = 2  # the variant changed\n")
    assert cache.key(variant, CASE, 1) != before
