import json
import os
import sys
import textwrap

import pytest

from bench.api import discover
from bench.case import Case
from bench.registry import DuplicateVariantError, RegistryError, available
from tests.conftest import ROOT, run_cli, write_plugin

PLUGIN = """
from bench.registry import variant
import torch.nn.functional as F

@variant("{name}", masks=("none", "causal"), description="plugin test variant")
def factory(case):
    causal = case.mask == "causal"
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                          enable_gqa=case.is_gqa)
"""


def test_builtin_families_are_registered(registry):
    names = registry.names()
    for expected in ("naive", "sdpa", "sdpa.math", "sdpa.flash", "sdpa.efficient", "sdpa.cudnn",
                     "xformers", "flex", "window.chunked"):
        assert expected in names
    assert registry.baseline().name == "naive"
    assert registry["naive"].source == os.path.join("variants", "naive.py")


@pytest.mark.slow
def test_plugin_file_is_discovered(tmp_path):
    path = write_plugin(tmp_path, "myplug", PLUGIN.format(name="plug.sdpa"))
    reg = discover([str(path)], entry_points=False)
    v = reg["plug.sdpa"]
    assert v.source == str(path.resolve())
    ok, why = available(v, Case(q_len=32, kv_len=32, mask="causal"))
    assert ok, why
    proc = run_cli("list", "--format", "json", "--plugin", path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["plug.sdpa"]["available"] is True
    assert rows["plug.sdpa"]["masks"] == ["none", "causal"]


@pytest.mark.slow
def test_duplicate_name_is_refused_with_both_sources(tmp_path):
    path = write_plugin(tmp_path, "dup", PLUGIN.format(name="naive"))
    with pytest.raises(DuplicateVariantError) as info:
        discover([str(path)], entry_points=False)
    msg = str(info.value)
    assert os.path.join("variants", "naive.py") in msg and str(path.resolve()) in msg
    proc = run_cli("list", "--plugin", path)
    assert proc.returncode == 2
    assert "defined twice" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_broken_plugin_is_a_clear_error(tmp_path):
    path = write_plugin(tmp_path, "broken", "raise ImportError('needs frobnicate')\n")
    with pytest.raises(RegistryError, match="needs frobnicate"):
        discover([str(path)], entry_points=False)
    proc = run_cli("list", "--plugin", tmp_path / "missing.py")
    assert proc.returncode == 2 and "no such file" in proc.stderr
    (tmp_path / "notes.txt").write_text("x")
    proc = run_cli("list", "--plugin", tmp_path / "notes.txt")
    assert proc.returncode == 2 and "not a Python file" in proc.stderr


@pytest.mark.slow
def test_entry_point_package_is_discovered(tmp_path):
    """An installed distribution exposing the attnbench.variants group."""
    pkg = tmp_path / "ep_variants"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent(PLUGIN.format(name="ep.sdpa")))
    dist = tmp_path / "ep_variants-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-variants\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[attnbench.variants]\nep = ep_variants\n")
    proc = run_cli("list", "--format", "json", env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"})
    assert proc.returncode == 0, proc.stderr
    assert "ep.sdpa" in {r["name"] for r in json.loads(proc.stdout)}


@pytest.mark.slow
def test_list_json_reports_availability_with_reasons():
    proc = run_cli("list", "--format", "json", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    for r in rows.values():
        assert {"name", "description", "devices", "dtypes", "masks", "backward", "available",
                "reason"} <= set(r)
        assert r["available"] or r["reason"], f"{r['name']} is unavailable without a reason"
    for name in ("naive", "sdpa", "sdpa.math", "sdpa.flash", "flex", "window.chunked"):
        assert rows[name]["available"], rows[name]["reason"]
    for name in ("sdpa.efficient", "sdpa.cudnn", "xformers"):
        assert not rows[name]["available"]
    assert "cuda" in rows["xformers"]["reason"]
    table = run_cli("list", "--device", "cpu")
    assert table.returncode == 0 and "window.chunked" in table.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="CUDA check string is Linux-specific")
def test_cuda_cases_unavailable_without_gpu(registry):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    ok, why = available(registry["naive"], Case(device="cuda", q_len=16, kv_len=16))
    assert not ok and "CUDA is not available" in why


def test_pinned_sdpa_backend_runs_that_kernel_only(registry):
    """Inside or outside the harness's scope, a pinned variant runs its own kernel or fails;
    it never falls back to another backend."""
    import torch
    from torch.nn.attention import SDPBackend
    from torch.profiler import ProfilerActivity, profile

    from bench.measure.inputs import make_inputs
    from variants.sdpa import _pinned

    case = Case(q_len=32, kv_len=32, heads=2, kv_heads=2, head_dim=16)
    q, k, v = make_inputs(case)
    efficient = registry["sdpa.efficient"].prepare(case)
    with pytest.raises(RuntimeError, match="No viable backend"):
        efficient.fn(q, k, v)

    def ops(name, scoped):
        prepared = registry[name].prepare(case)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if scoped:
                with prepared.scope():
                    assert _pinned({"sdpa.flash": SDPBackend.FLASH_ATTENTION, "sdpa.math": SDPBackend.MATH}[name])
                    prepared.fn(q, k, v)
            else:
                prepared.fn(q, k, v)
        return {e.key for e in prof.key_averages()}

    for scoped in (True, False):
        flash, math = ops("sdpa.flash", scoped), ops("sdpa.math", scoped)
        assert any("flash_attention" in n for n in flash) and not any("_math" in n for n in flash)
        assert any("_scaled_dot_product_attention_math" in n for n in math)
        assert not any("flash_attention" in n for n in math)
    assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()


@pytest.mark.slow
def test_list_backward_here_agrees_with_what_a_sweep_records(tmp_path):
    from tests.conftest import read_jsonl

    listed = {r["name"]: r for r in json.loads(run_cli("list", "--format", "json", "--device", "cpu").stdout)}
    assert listed["flex"]["backward"] and not listed["flex"]["backward_here"]
    assert listed["naive"]["backward_here"] and not listed["xformers"]["available"]
    proc = run_cli("sweep", "--out", tmp_path / "run", "--variants", "flex,naive", "--seq-lens", "16",
                   "--heads", "2", "--head-dims", "16", "--masks", "causal", "--directions", "bwd", "--device", "cpu",
                   "--budget-ms", "5", "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    status = {r["variant"]: r["status"] for r in read_jsonl(tmp_path / "run" / "results.jsonl")}
    assert status == {"flex": "unsupported", "naive": "ok"}


def test_a_new_capability_is_one_declaration(monkeypatch):
    """One entry in CAPABILITIES gives the decorator its keyword, the variant its attribute, the
    availability check its refusal and the capability table its column."""
    import dataclasses

    from bench.model import registry as reg
    from bench.model.case import Case

    extra = reg.Capability("windowed", False, lambda c: c.mask == "window",
                           lambda v, c: f"{v.name} takes no window (declare windowed=True)", "takes the window mask")
    monkeypatch.setattr(reg, "CAPABILITIES", (*reg.CAPABILITIES, extra))
    made = {}
    for declared in (False, True):
        @reg.variant(f"probe.{declared}", description="a plain SDPA", masks=("none", "window"), windowed=declared)
        def factory(case):
            import torch.nn.functional as F

            return F.scaled_dot_product_attention
        made[declared] = reg.module_variants(sys.modules[__name__], create=False)[-1]
    case = Case(q_len=16, kv_len=16, mask="window", window=4)
    assert made[False].windowed is False and made[True].windowed is True
    assert made[False].static_reason(case) == "probe.False takes no window (declare windowed=True)"
    assert made[True].static_reason(case) is None
    assert made[True].capabilities()["windowed"] is True and "windowed" not in dataclasses.asdict(made[True])
    with pytest.raises(RegistryError, match="the capabilities it may declare: cross, gqa, backward, paged, "
                                            "bottom_right, value_dim, sinks, ragged, mix, windowed"):
        reg.variant("probe.bad", description="x", slidey=True)
    setattr(sys.modules[__name__], reg.MODULE_ATTR, [])  # this test module's registrations go with it


@pytest.mark.parametrize("keywords, words", [
    (dict(work="sparse"), "work is one of all, kept, causal"),
    (dict(rates={"tpu": 1.0}), "rates takes a dict by device"),
    (dict(rates={"cpu": 0}), "a rate is a positive number"),
    (dict(colour=-1), "colour is a palette slot"),
    (dict(peak_share=1.5), "peak_share is a share of the peak"),
    (dict(memory_exponents={"cuda": (2.2, 1.8)}), "a memory exponent is a (low, high) pair"),
    (dict(selfcheck={"cpu": dict(seq_len=512)}), "selfcheck's cpu case takes case fields"),
    (dict(checks=("timer", "timing")), "unknown gpu-check step(s) ['timing']"),
    (dict(checks="timer"), "checks takes a tuple of step names"),
])
def test_a_variants_traits_are_checked_where_they_are_declared(keywords, words):
    """What a plugin declares for the plan, the charts and the checks is refused at once, with what
    is valid, rather than silently ignored (a misspelt gpu-check step would leave the variant out)."""
    from bench.registry import variant

    with pytest.raises(RegistryError) as caught:
        variant("my.variant", description="traits", **keywords)
    assert words in str(caught.value)


def test_the_built_in_variants_declare_their_traits():
    registry = discover()
    assert registry["flex"].traits.work == "kept" and registry["sdpa.flash"].traits.work == "causal"
    assert registry["naive"].traits.work == "all" and registry["naive"].traits.colour == 11
    assert registry["naive"].traits.selfcheck_case("cpu") == {"q_len": 1024, "kv_len": 1024}
    colours = [registry[n].traits.colour for n in registry.names() if registry[n].traits.colour is not None]
    assert len(colours) == len(set(colours))  # no two built-ins share a slot
