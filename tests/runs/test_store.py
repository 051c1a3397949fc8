"""The run folder's files under damage: a bad line never costs a valid row, a torn last
line is the only one repaired, env.json is written whole or not at all."""

import json

import pytest

from bench.cli import main
from bench.runs import store
from tests.conftest import ROOT, run_cli

S = ["--heads", "2", "--head-dims", "16", "--dtypes", "float32", "--directions", "fwd", "--quiet", "--no-report",
     "--device", "cpu", "--budget-ms", "5", "--remeasure", "0"]


def _row(i):
    return {"variant": "naive", "status": "ok", "device": "cpu", "dtype": "float32", "batch": 1, "heads": 2,
            "kv_heads": 2, "q_len": 16 * (i + 1), "kv_len": 16 * (i + 1), "head_dim": 16, "mask": "none",
            "window": None, "direction": "fwd", "median_ms": float(i + 1), "samples_ms": [float(i + 1)]}


@pytest.mark.parametrize("bad", [b'{"variant": "naive", "broken', b"\x00" * 40, b"[1, 2, 3]",
                                 b'{"variant": "naive", "status": "ok"}', b"null"])
def test_a_bad_line_in_the_middle_is_skipped_with_its_number(tmp_path, caplog, bad):
    good = [json.dumps(_row(i)).encode() for i in range(4)]
    (tmp_path / store.RESULTS).write_bytes(b"\n".join(good[:2] + [bad] + good[2:]) + b"\n")
    rows = store.read_rows(tmp_path, repair=True)
    assert [r["median_ms"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    assert f"{store.RESULTS}:3: skipped" in caplog.text  # the engine logs it; the command line prints it
    assert (tmp_path / store.RESULTS).read_bytes().count(b"\n") == 5  # nothing rewritten or cut


def test_only_a_torn_last_line_is_repaired(tmp_path):
    good = b"\n".join(json.dumps(_row(i)).encode() for i in range(3)) + b"\n"
    (tmp_path / store.RESULTS).write_bytes(good + b'{"variant": "na')
    assert len(store.read_rows(tmp_path)) == 3
    assert (tmp_path / store.RESULTS).read_bytes().endswith(b'"na')  # reading alone changes nothing
    assert len(store.read_rows(tmp_path, repair=True)) == 3
    assert (tmp_path / store.RESULTS).read_bytes() == good


def test_non_finite_figures_are_written_as_null(tmp_path):
    w = store.ResultWriter(tmp_path)
    w.write(_row(0) | {"max_abs_err": float("inf"), "samples_ms": [float("nan"), 1.0], "status": "mismatch"})
    w.close()
    line = (tmp_path / store.RESULTS).read_text()
    assert "Infinity" not in line and "NaN" not in line
    assert json.loads(line)["samples_ms"] == [None, 1.0] and json.loads(line)["check"]["max_abs_err"] is None
    assert store.read_rows(tmp_path)[0]["median_ms"] == 1.0  # the finite samples give the figures


def test_a_row_is_typed_when_written_and_a_variants_figures_keep_their_namespace(tmp_path):
    from bench.model.row import RowError

    w = store.ResultWriter(tmp_path)
    with pytest.raises(RowError, match=r"undeclared row column\(s\) \['x'\]"):
        w.write(_row(0) | {"x": 1.0})
    with pytest.raises(RowError, match="row status 'fine'; valid: ok, mismatch"):
        w.write(_row(0) | {"status": "fine"})
    with pytest.raises(RowError, match=r"median_ms='3' \(str; a row's median_ms is float\); noisy=1 \(int; a row's "
                                       r"noisy is bool\)"):
        w.write(_row(0) | {"status": "ok", "median_ms": "3", "noisy": 1})
    with pytest.raises(RowError, match=r"samples=True \(bool; a row's samples is float\)"):  # a flag is no count
        w.write(_row(0) | {"status": "ok", "samples": True})
    w.write(_row(0) | {"status": "ok", "extra": {"compile_ms": 3.0, "q_len": 7}})
    w.close()
    raw = json.loads((tmp_path / store.RESULTS).read_text())
    assert raw["extra"] == {"compile_ms": 3.0, "q_len": 7} and raw["reason_kind"] == ""  # ok: no reason
    flat = store.read_rows(tmp_path)[0]  # as the reports read it
    assert flat["compile_ms"] == 3.0 and flat["extra.q_len"] == 7 and flat["q_len"] == _row(0)["q_len"]


@pytest.mark.parametrize("content", ["", '{"device": "cpu", "thr', "[1, 2]"])
def test_a_damaged_env_json_is_one_clear_line(tmp_path, capsys, content):
    w = store.ResultWriter(tmp_path)
    w.write(_row(0))
    w.close()
    (tmp_path / store.ENV).write_text(content)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "env.json" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_resume_after_a_bad_line_keeps_every_valid_row(tmp_path):
    out = tmp_path / "run"
    first = run_cli("sweep", "--out", out, "--variants", "naive,sdpa.math", "--seq-lens", "16,32,48",
                    "--masks", "none,causal", *S)
    assert first.returncode == 0, first.stderr
    path = out / store.RESULTS
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 13  # 12 rows and the final newline
    path.write_bytes(b"\n".join(lines[:5] + [b'{"variant": "naive", "broken'] + lines[5:]))
    again = run_cli("sweep", "--resume", out, *S)
    assert again.returncode == 0, again.stderr
    assert "0 cells to run, 12 already there" in again.stderr and "results.jsonl:6: skipped" in again.stderr
    kept = [x for x in path.read_text().splitlines() if x != '{"variant": "naive", "broken']
    assert len(kept) == 12 and all(json.loads(x)["status"] == "ok" for x in kept)  # none re-measured or lost


def test_every_column_has_a_type_and_a_timing_fills_its_columns_with_them():
    """A row's columns are typed (none is Any), and what the timer and the check give a row are
    typed results whose columns pass the writer's check."""
    import dataclasses
    import typing

    from bench.measure.correctness import CheckResult
    from bench.measure.timing import Timing
    from bench.model.row import COLUMN_TYPES, COLUMNS, TIMING, wrong_types

    assert set(COLUMNS) - {"variant", "status"} <= set(COLUMN_TYPES) and typing.Any not in COLUMN_TYPES.values()
    timing = Timing([1.0, 1.2, 0.9, 1.1, 1.05], number=4, warmup_calls=2, method="perf_counter",
                    round_medians_ms=[1.0, 1.1], timed_s=0.03, cpu_s=0.05, threads=2).summary()
    columns = timing.columns()
    assert set(columns) <= set(TIMING) | {"cpu_util"} and wrong_types(columns) == []
    assert (timing.median_ms, timing.samples, timing.few_samples, timing.rounds) == (1.05, 5, True, 2)  # 5: no 95% CI
    assert columns["samples_ms"] == [1.0, 1.2, 0.9, 1.1, 1.05] and timing.cpu_util == pytest.approx(0.05 / 0.06)
    with pytest.raises(dataclasses.FrozenInstanceError):
        timing.median_ms = 0.0
    check = CheckResult(True, 1e-6, 2e-6, rel_err=1e-7, cosine=1.0).columns()
    assert wrong_types(check) == [] and check["max_abs_err"] == 1e-6


def test_an_older_folder_resumed_keeps_each_lines_format(tmp_path):
    """A folder of format-1 rows (its figures stored) gains rows of this build's format: env.json
    says from which line, and every row reads back with its figures, whichever format stored it."""
    import gzip

    from bench.model.row import FORMAT

    old = gzip.decompress((ROOT / "tests" / "support" / "quick_run" / "results.jsonl.gz").read_bytes())
    first = [json.loads(x) for x in old.splitlines()[:3]]
    (tmp_path / store.RESULTS).write_bytes(b"\n".join(old.splitlines()[:3]) + b"\n")
    env = {"device": "cpu"}  # written before formats were recorded
    env["row_formats"] = store.row_formats(tmp_path, env)
    assert env["row_formats"] == [[1, 1], [4, FORMAT]]
    store.write_env(tmp_path, env)
    w = store.ResultWriter(tmp_path)
    w.write(_row(5) | {"samples_ms": [2.0, 4.0, 6.0]})
    w.close()
    rows = store.read_rows(tmp_path, with_visits=False)
    assert [r["median_ms"] for r in rows] == [r["median_ms"] for r in first] + [4.0]
    assert rows[-1]["q1_ms"] == 3.0 and rows[-1]["samples"] == 3 and rows[-1]["few_samples"] is True
    assert store.row_formats(tmp_path, env) == [[1, 1], [4, FORMAT]]  # resumed again: nothing to add
    (tmp_path / store.ENV).write_text("{broken")  # unreadable: each record's shape tells its format
    assert [r["median_ms"] for r in store.read_rows(tmp_path, with_visits=False)][-1] == 4.0
