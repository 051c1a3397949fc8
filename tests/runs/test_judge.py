"""Judging has one home (bench.runs.judge): what failed, what is shaky, the trust state, the
fingerprint.  The same rows fed through the reports, the command line's summary and gpu-check
get the same answers, and changing the one rule changes every surface.  No layer reads the
words of a reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from bench.runs import judge
from tests.support.text import count, numbers

ROOT = Path(__file__).resolve().parents[2]
BASE = dict(device="cpu", dtype="float32", batch=1, heads=2, kv_heads=2, head_dim=8, window=None, direction="fwd",
            lengths="fixed", inputs="normal", kv_layout="contiguous", mask="none")


def _rows() -> list[dict]:
    def row(variant, n, status, **kw):
        return BASE | {"variant": variant, "q_len": n, "kv_len": n, "status": status, "reason": "",
                       "reason_kind": "", "median_ms": 1.0 if status == "ok" else None, "q1_ms": 0.9,
                       "q3_ms": 1.1} | kw

    return [
        row("naive", 64, "ok"),
        row("naive", 128, "ok", noisy=True),
        row("sdpa", 64, "ok", contended=True, contended_why="timed with 0.4 of its cores"),
        row("sdpa", 128, "ok", throttled=True),
        row("flex", 64, "error", reason="RuntimeError: x (raised in variant code, flex.py:3)", reason_kind="error"),
        row("flex", 128, "unsupported", reason="mask window not supported", reason_kind="capability"),
        row("xformers", 64, "unsupported", reason="device cpu not supported (supports cuda)",
            reason_kind="library"),
        row("xformers", 128, "unsupported", reason="", reason_kind="library"),  # a refusal that gave no reason
        row("performer", 64, "mismatch", reason="worse than returning zeros", reason_kind="mismatch-values",
            approximate=True),
        row("naive", 256, "mismatch", reason="output relative error 1 > 0.01", reason_kind="mismatch-values"),
    ]


def _surfaces(rows):
    """What each surface says of the rows: (shaky per row in the report, its failed cells, the CLI's
    shaky count line, gpu-check's failed cells, the report's trust state)."""
    from bench.cli.sweep import shaky_count
    from bench.runs.judge.acceptance import failed_cells as _failed_cells
    from reports.frames import tidy
    from reports.tables import failed_cells
    from reports.trust import trust_state

    df = tidy(pd.DataFrame(rows)).assign(run="r", peak_unreliable=False)
    return (list(df["shaky"]), sorted(zip(failed_cells(df)["variant"], failed_cells(df)["q_len"])),
            shaky_count(rows), _failed_cells(rows), trust_state(df, [{"run": "r"}]))


def test_the_surfaces_agree_with_the_judge():
    rows = _rows()
    shaky, report_failed, cli, gpu, state = _surfaces(rows)
    assert shaky == [judge.shaky(r) for r in rows] == [False, False, True, True] + [False] * 6  # noisy: not shaky
    assert report_failed == sorted((r["variant"], r["q_len"]) for r in rows if judge.not_measured(r))
    assert ("flex", 128) not in report_failed and ("xformers", 64) in report_failed  # declared out vs refused
    head, *remedies = cli.split("; ")
    assert head.startswith("shaky:") and numbers(head) == [2, 4, 1, 1]  # of 4 ok cells: contended, throttled
    assert [(count(r, "contended"), count(r, "throttled")) for r in remedies[:2]] == [(1, None), (None, 1)]
    assert "--retry contended" in remedies[0] and "--retry throttled" in remedies[1]
    assert count(remedies[2], "with an interval") == 1 and "not shaky" in remedies[2]  # noisy is said apart
    t = judge.trust(rows)
    assert (t.ok, t.shaky, t.noisy, t.contended, t.throttled) == (4, 2, 1, 1, 1)
    assert state == (t.state, t.heading, t.reason) and t.state == "care" and t.heading == "Read with care"
    assert numbers(t.reason) == [2, 4, 1, 1] and count(t.reason, "contended") == 1 and "shaky" in t.reason
    assert gpu == judge.failures(rows, allow_accuracy=True)
    assert [line.split()[0] for line in gpu] == ["flex", "xformers", "naive"]  # not performer's accuracy verdict
    assert len(judge.failures(rows)) == 4


def test_changing_the_one_rule_changes_every_surface(monkeypatch):
    rows = _rows()
    monkeypatch.setattr(judge, "shaky_flags", lambda row: [])  # nothing is shaky any more
    shaky, _, cli, _, state = _surfaces(rows)
    assert not any(shaky) and cli.startswith("shaky: 0 of 4 ok cells") and state[0] == "clean"
    monkeypatch.setattr(judge, "failed", lambda row: row["variant"] == "naive")  # only naive's cells fail
    assert [line.split()[0] for line in _surfaces(rows)[3]] == ["naive"] * 3
    from bench.runs.judge.acceptance import matrix_verdict as _matrix_verdict

    assert not _matrix_verdict("1 matrix", rows)[1]


def test_retry_and_resume_ask_the_judge():
    from bench.runs import store

    rows = _rows()
    done = store.done_keys(rows, frozenset({"shaky"}))
    retried = {r["variant"] + str(r["q_len"]) for r in rows if store.cell_key(r["variant"], r) not in done}
    assert retried == {"sdpa64", "sdpa128"}  # contended and throttled; a noisy cell is not shaky
    noisy = store.done_keys(rows, frozenset({"noisy"}))
    assert {r["variant"] + str(r["q_len"]) for r in rows if store.cell_key(r["variant"], r) not in noisy} == \
        {"naive128"}  # but --retry noisy measures it again
    assert judge.wants_retry(rows[2], {"contended"}) and not judge.wants_retry(rows[1], {"contended"})
    assert judge.wants_retry(rows[4], {"error"})


def test_the_fingerprint_is_one_constant():
    from bench.engine import runfolder
    from bench.features.shards import merge

    assert "threads" in judge.FINGERPRINT
    for module in (runfolder, merge):  # the run folder's env.json and a merge's check of the shards
        text = Path(module.__file__).read_text()
        assert "judge.FINGERPRINT" in text and "FINGERPRINT = " not in text and "FINGERPRINT_KEYS" not in text
    before = {k: 1 for k in judge.FINGERPRINT}
    assert judge.fingerprint_changes(before, before | {"threads": 2}) == ["threads: 1 -> 2"]


@pytest.mark.parametrize("rows_made_now", [True])
def test_a_merge_of_auto_threaded_shards_is_not_a_mixed_machine(tmp_path, rows_made_now):
    from bench.features.shards.merge import merged_env

    env = {k: "x" for k in judge.FINGERPRINT} | {"spec": {"threads": None}}
    merged = merged_env([tmp_path / "a", tmp_path / "b"], [env | {"threads": 2}, env | {"threads": 1}])
    assert "mixed_env" not in merged and merged["threads_by_shard"] == [2, 1]
    pinned = {"spec": {"threads": 2}}
    merged = merged_env([tmp_path / "a", tmp_path / "b"], [env | pinned | {"threads": 2},
                                                           env | pinned | {"threads": 1, "cpu": "other"}])
    assert any(m.startswith("cpu:") for m in merged["mixed_env"])


# -- no reason text is parsed ---------------------------------------------------------------------------

TEXT_TESTS = {"contains", "match", "search", "fullmatch", "findall", "startswith", "endswith", "split", "partition",
              "find", "index"}


def _mentions_reason(node) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value == "reason":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "reason":
            return True
    return False


def reason_parsing(source: str) -> list[int]:
    """Lines where a row's reason is read as text: a string test or a regex on a row's ``reason``
    (``row["reason"]``, ``row.get("reason")``, ``result.reason``), or ``in`` against it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in TEXT_TESTS and _mentions_reason(func.value):
                found.append(node.lineno)
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "re" and \
                    any(_mentions_reason(a) for a in node.args[1:]):
                found.append(node.lineno)
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and \
                any(_mentions_reason(c) for c in node.comparators):
            found.append(node.lineno)
    return found


def test_the_scan_finds_a_regex_over_a_reason():
    assert reason_parsing('bad["reason"].fillna("").str.contains(r"not supported", regex=True)\n') == [1]
    assert reason_parsing('import re\nre.search("x", row["reason"])\n') == [2]
    assert reason_parsing('ok = "oom" in r.reason\n') == [1]
    assert reason_parsing('why = f"{reason}: more"\n') == []  # writing a reason is not reading it


def test_no_layer_reads_the_words_of_a_reason():
    found = []
    for top in ("bench", "reports"):
        for path in (ROOT / top).rglob("*.py"):
            found += [f"{path.relative_to(ROOT)}:{line}" for line in reason_parsing(path.read_text())]
    assert not found, found


def test_the_remedies_name_the_run_they_would_measure_again(tmp_path):
    from bench.cli.sweep import shaky_count

    run = tmp_path / "my run"
    rows = _rows() + [BASE | {"variant": "naive", "q_len": 512, "kv_len": 512, "status": "ok", "few_samples": True,
                              "median_ms": 900.0, "samples_ms": [900.0], "number": 1}]
    line = shaky_count(rows, run_dir=run)
    assert f"--resume '{run}' --retry contended" in line and f"--resume '{run}' --retry few_samples" in line
    assert "RUN" not in line and "<function" not in line
    assert "--resume RUN --retry contended" in shaky_count(rows)  # no run given: the placeholder
