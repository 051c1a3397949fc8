"""A third scope from a plugin file: the protocol (bench.model.scope) is the whole seam, so a scope
that times q @ k^T alone sweeps without an edit outside its file."""

import pytest

from tests.conftest import read_jsonl, run_cli, write_plugin

QK_SCOPE = '''
import contextlib

import torch

from bench.measure.correctness import CheckResult
from bench.model.registry import Prepared
from bench.model.scope import Scope, register


class Bound:
    def __init__(self, variant, case):
        g = torch.Generator().manual_seed(0)
        self.variant, self.case, self.setup_ms = variant, case, 0.0
        self.q = torch.randn(case.batch, case.heads, case.q_len, case.head_dim, generator=g)
        self.k = torch.randn(case.batch, case.heads, case.kv_len, case.head_dim, generator=g)
        self.prepared = Prepared(lambda *_: self.q @ self.k.transpose(-2, -1))

    def scope(self):
        return contextlib.nullcontext()

    @property
    def fn(self):
        return self.prepared.fn

    def timed(self, direction=None):
        return lambda: self.q @ self.k.transpose(-2, -1)


class QK(Scope):
    names = ("qk",)
    what = "the scores q @ k^T alone"

    def flops(self, case):
        return 2.0 * case.batch * case.heads * case.q_len * case.kv_len * case.head_dim

    def work(self, case):
        return {"flops": self.flops(case)}

    def bind(self, variant, case, inputs):
        return Bound(variant, case)

    def check(self, bound, case, result, inputs, cache, skip_reference="", span=None):
        got = bound.timed()().double()
        want = bound.q.double() @ bound.k.double().transpose(-2, -1)
        err = float((got - want).abs().max())
        result.checked(CheckResult(err < 1e-3, err, err / float(want.abs().max())))


register(QK())
'''


@pytest.mark.slow
def test_a_scope_registered_by_a_plugin_file_is_swept_checked_and_counted(tmp_path):
    plugin = write_plugin(tmp_path, "qk_scope", QK_SCOPE)
    out = tmp_path / "run"
    proc = run_cli("sweep", "--plugin", plugin, "--scope", "qk,core", "--variants", "naive", "--seq-lens", "32,64",
                   "--heads", "2", "--head-dims", "16", "--masks", "none", "--budget-ms", "5", "--device", "cpu",
                   "--out", out, "--no-report", "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = {(r["scope"], r["q_len"]): r for r in read_jsonl(out / "results.jsonl")}
    assert set(rows) == {("qk", 32), ("qk", 64), ("core", 32), ("core", 64)}
    for row in rows.values():
        assert row["status"] == "ok", row["reason"]
        assert row["median_ms"] > 0 and row["tflops"] > 0
    assert rows[("qk", 64)]["flops"] == 2.0 * 2 * 64 * 64 * 16  # the plugin's own count
    assert rows[("core", 64)]["flops"] == 2 * rows[("qk", 64)]["flops"]  # QK^T and PV
    unknown = run_cli("sweep", "--scope", "qk", "--variants", "naive", "--seq-lens", "32", "--dry-run")
    assert unknown.returncode == 2 and "unknown scope 'qk'" in unknown.stderr  # without the plugin: no such scope
