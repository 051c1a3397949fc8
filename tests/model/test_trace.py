"""Serving traces (--batch-mix @FILE, --trace-mixes) and vLLM's batch-spec spelling."""

import json

import pytest

from bench.model.trace import features, read_trace, sample, spelling, trace_mixes
from bench.model.workload import WorkloadError, canonical_mix
from tests.conftest import run_cli


@pytest.mark.parametrize("vllm, ours", [
    ("q2k", "1x(2048/2048)"),
    ("8q1kv1k", "8x(1/1024)"),
    ("q4kv1k", "1x(4/1024)"),
    ("2q2k_32q1s1k", "2x(2048/2048)+32x(1/1024)"),
    ("16q4s1k", "16x(4/1024)"),
    ("2q512_1q128s4096_8q1s2048", "2x(512/512)+1x(128/4096)+8x(1/2048)"),
])
def test_vllms_batch_spec_is_another_spelling_of_the_same_mix(vllm, ours):
    assert canonical_mix(vllm) == ours == canonical_mix(ours)


@pytest.mark.parametrize("bad", ["2q2k_32z1", "q", "2q2k__q1", "q1kkv2"])
def test_a_bad_vllm_term_names_itself_and_both_spellings(bad):
    with pytest.raises(WorkloadError) as info:
        canonical_mix(bad)
    assert bad in str(info.value) and "2q2k_32q1s1k" in str(info.value)


@pytest.mark.slow
def test_a_vllm_spelling_on_the_command_line_and_a_bad_one_exits_2():
    ok = run_cli("sweep", "--variants", "naive", "--batch-mix", "2q64_4q1s256", "--masks", "causal", "--dry-run")
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("sweep", "--variants", "naive", "--batch-mix", "2q64_4z1", "--dry-run")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "'4z1' is not a vLLM batch-spec term" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def _write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_line_is_either_form_and_becomes_its_mix(tmp_path):
    path = _write(tmp_path, [json.dumps({"new": [512, 1, 1], "cached": [0, 2047, 2047]}),
                             "", json.dumps([[4, 100], [1, 99]])])
    batches = read_trace(str(path))
    assert [line for line, _ in batches] == [1, 3]
    assert spelling(batches[0][1]) == "1x(512/512)+2x(1/2048)"
    assert spelling(batches[1][1]) == "1x(4/104)+1x(1/100)"
    assert features(batches[0][1]) == (pytest.approx(9.00564, rel=1e-5), 2 / 3)


@pytest.mark.parametrize("line, words", [
    ('{"new": [0], "cached": [5]}', "line 1: sequence [0, 5]"),
    ('{"new": [4, 1], "cached": [5]}', "line 1: 'new' and 'cached' must be lists of the same length"),
    ("[[1, 2], [3]]", "line 1: sequence [None, None]"),
    ("not json", "line 1: Expecting value"),
    ('{"tokens": [1]}', "line 1: keys ['tokens']"),
])
def test_a_bad_trace_line_is_named_with_what_is_valid(tmp_path, line, words):
    path = _write(tmp_path, [line])
    with pytest.raises(WorkloadError) as info:
        read_trace(str(path))
    assert words in str(info.value) and '{"new": [Q, ...], "cached": [C, ...]}' in str(info.value)


def test_the_sampler_keeps_one_batch_from_each_kind_of_batch(tmp_path):
    # three kinds, ten of each, interleaved: big prefills, pure decode, and a chunk among decodes;
    # each kind's batches vary a little, so a representative is its kind's most typical batch
    lines = []
    for i in range(10):
        lines.append(json.dumps({"new": [2048 + 16 * i], "cached": [0]}))
        lines.append(json.dumps([[1, 1000 + 10 * i]] * 32))
        lines.append(json.dumps([[128, 512]] + [[1, 700 + i]] * 4))
    path = _write(tmp_path, lines)
    kinds = {line: ("prefill", "decode", "mixed")[(line - 1) % 3] for line in range(1, 31)}
    chosen = sample(read_trace(str(path)), 3)
    assert sorted(kinds[line] for line, _ in chosen) == ["decode", "mixed", "prefill"]
    # the prefills differ in tokens: their middle one (i = 4 or 5 of 0..9) stands for them; the decode and
    # mixed batches have the same tokens and decode share each: the first of them, at lines 2 and 3
    by_kind = {kinds[line]: line for line, _ in chosen}
    assert (by_kind["prefill"] - 1) // 3 in (4, 5) and by_kind["decode"] == 2 and by_kind["mixed"] == 3
    named = trace_mixes(str(path), 3)
    assert [name for name, _ in named] == [f"{path}:{line}" for line, _ in chosen]
    assert sample(read_trace(str(path)), 100) == read_trace(str(path))  # fewer batches than asked: all of them


@pytest.mark.slow
def test_a_trace_on_the_command_line_becomes_its_representative_mixes(tmp_path):
    lines = [json.dumps({"new": [64], "cached": [0]}), json.dumps([[1, 128]] * 4), json.dumps([[16, 64], [1, 64]])]
    path = _write(tmp_path, lines)
    proc = run_cli("sweep", "--variants", "naive", "--batch-mix", f"@{path}", "--trace-mixes", "2", "--masks",
                   "causal", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "2 cells in 2 cases" in proc.stdout + proc.stderr
    assert f"trace batch {path}:" in proc.stdout + proc.stderr
    missing = run_cli("sweep", "--batch-mix", f"@{tmp_path}/none.jsonl", "--dry-run")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: --batch-mix @{tmp_path}/none.jsonl: no such file"
