"""``--heap fixed|system``: the C heap a sweep's workers time under, recorded on every row and in
env.json, and named in the trust box."""

from __future__ import annotations

import ctypes
import json
import platform

import pytest

from bench.runs import store
from reports.trust import heap_words
from tests.conftest import run_cli, write_plugin

# glibc marks a chunk it mapped for itself (not carved from the heap) with bit 1 of the size word
# before the pointer.  48 MiB is past the largest threshold glibc's own rule reaches (32 MiB), and
# below the fixed heap's (64 MiB): mapped under the system heap, from the heap under the fixed one.
PROBE = """
    import ctypes
    import json

    from bench.registry import variant


    @variant("heapprobe", masks=("none",), description="sdpa, after noting how a 48 MiB malloc was served")
    def heapprobe(case):
        import torch.nn.functional as F

        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        p = libc.malloc(48 << 20)
        mapped = bool(ctypes.c_size_t.from_address(p - 8).value & 2)
        libc.free(ctypes.c_void_p(p))
        with open({out!r}, "a") as f:
            f.write(json.dumps({{"mapped": mapped}}) + "\\n")
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
"""


def _glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.slow
@pytest.mark.skipif(not _glibc(), reason="the heap setting acts on glibc's allocator only")
def test_a_system_heap_sweep_leaves_glibc_its_own_rule_and_says_so(tmp_path):
    seen = {}
    for heap in ("fixed", "system"):
        out = tmp_path / f"probe-{heap}.jsonl"
        plugin = write_plugin(tmp_path, f"probe_{heap}", PROBE.format(out=str(out)))
        flags = [] if heap == "fixed" else ["--heap", "system"]
        res = run_cli("sweep", "--plugin", plugin, "--variants", "heapprobe", "--seq-lens", "32", "--heads", "1",
                      "--head-dims", "8", "--masks", "none", "--budget-ms", "5", "--no-report", "--quiet",
                      "--out", tmp_path / heap, *flags)
        assert res.returncode == 0, res.stderr
        seen[heap] = {json.loads(line)["mapped"] for line in out.read_text().splitlines()}
        rows = store.read_rows(tmp_path / heap)
        assert {r["heap"] for r in rows} == {heap} and {r["status"] for r in rows} == {"ok"}
        assert json.loads((tmp_path / heap / "env.json").read_text())["heap"] == heap
    assert seen == {"fixed": {False}, "system": {True}}


@pytest.mark.skipif(not _glibc(), reason="the heap setting acts on glibc's allocator only")
def test_the_probe_reads_glibc_s_mapped_bit():
    """The probe above, in this process: a block past any threshold is mapped, a small one is not."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    flags = []
    for size in (1 << 10, 256 << 20):
        p = libc.malloc(size)
        flags.append(bool(ctypes.c_size_t.from_address(p - 8).value & 2))
        libc.free(ctypes.c_void_p(p))
    assert flags == [False, True]


def test_the_trust_box_names_the_cpu_heap():
    fixed, system = heap_words([{"device": "cpu"}]), heap_words([{"device": "cpu", "heap": "system"}])
    assert fixed.startswith("CPU heap fixed") and system.startswith("CPU heap system")
    both = heap_words([{"device": "cpu", "run": "a"}, {"device": "cpu", "heap": "system", "run": "b"}])
    assert "a: fixed" in both and "b: system" in both
    assert heap_words([{"device": "cuda", "heap": "system"}]) == ""


def test_heap_takes_fixed_or_system_and_a_repro_keeps_a_system_heap(capsys):
    from bench.cli import main
    from bench.features.repro import command

    assert main(["sweep", "--heap", "big", "--dry-run", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fixed" in err and "system" in err
    row = {"variant": "naive", "device": "cpu", "dtype": "float32", "heads": 2, "kv_heads": 2, "head_dim": 16,
           "mask": "none", "direction": "fwd", "batch": 1, "q_len": 64, "kv_len": 64}
    assert "--heap system" in command(row | {"heap": "system"})
    assert "--heap" not in command(row | {"heap": "fixed"})
