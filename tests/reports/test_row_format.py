"""The row stores what was measured: the quick preset's report, built from the same rows before
and after the row format changed, has the same figures in its tables.

``tests/support/quick_run`` is a real quick-preset run (``python -m bench sweep --preset quick
--device cpu``) written in row format 1, every column flat with the derived figures stored, and
the CSV tables the report made from it then (``expected/``).  The files are the record of what
format 1 gave: they are never written again by the code under test."""

import gzip
import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from bench.model.case import CASE_DEFAULTS
from bench.model.row import COLUMNS, FORMAT, GROUPS, STORED, formats
from bench.runs import store
from reports.build import build_report

FIXTURE = Path(__file__).resolve().parent.parent / "support" / "quick_run"
TABLES = sorted(p.name.removesuffix(".gz") for p in (FIXTURE / "expected").glob("*.csv.gz"))


def _unpack(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for p in FIXTURE.iterdir():
        if p.is_file():
            data = p.read_bytes()
            (folder / p.name.removesuffix(".gz")).write_bytes(gzip.decompress(data) if p.suffix == ".gz" else data)
    return folder


def _in_format_2(old: Path, new: Path) -> Path:
    """The same run with its rows written again by this build's writer (the other files as they are)."""
    new.mkdir(parents=True)
    for name in ("visits.jsonl", "masks.json"):
        shutil.copy(old / name, new / name)
    writer = store.ResultWriter(new)
    for row in store.read_rows(old, with_visits=False):
        writer.write({k: v for k, v in row.items() if k in COLUMNS} | {"extra": {k: v for k, v in row.items()
                                                                               if k not in COLUMNS}})
    writer.close()
    env = json.loads((old / "env.json").read_text())
    assert "row_formats" not in env  # written before formats were recorded: format 1 throughout
    store.write_env(new, env)
    return new


def _same_tables(folder: Path):
    build_report([folder])
    assert TABLES and "results.csv" in TABLES and "tables.csv" in TABLES
    for name in TABLES:
        got, want = folder / "report" / name, gzip.decompress((FIXTURE / "expected" / f"{name}.gz").read_bytes())
        if not want.strip():  # a table with no rows to give (the quick preset has no frontier): empty either way
            assert not got.read_text().strip(), name
            continue
        got, want = pd.read_csv(got), pd.read_csv(io.BytesIO(want))
        added = sorted(set(got.columns) - set(want.columns))  # columns declared since: empty, or a case field's default
        for c in added:
            assert got[c].isna().all() or (c in CASE_DEFAULTS and (got[c] == CASE_DEFAULTS[c]).all()), (name, c)
        pd.testing.assert_frame_equal(got.drop(columns=added), want, check_like=True, obj=name)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("quick")
    old = _unpack(root / "format1" / "golden")  # the folder's name is the report's run column: as it was
    return old, _in_format_2(old, root / "format2" / "golden")


@pytest.mark.slow  # two whole reports, charts included: with the whole suite
def test_a_format_1_folder_reads_through_the_converter_to_the_same_tables(folders):
    _same_tables(folders[0])


@pytest.mark.slow
def test_the_same_rows_stored_in_format_2_give_the_same_tables(folders):
    new = folders[1]
    records = [json.loads(line) for line in (new / "results.jsonl").read_text().splitlines()]
    assert formats(json.loads((new / "env.json").read_text())) == [(1, FORMAT)]
    assert max(len(r) for r in records) <= 60 and len(STORED) + len(GROUPS) + 1 <= 60
    ok = [r for r in records if r["status"] == "ok"]
    assert ok and all("median_ms" not in r and "tflops" not in r and r["samples_ms"] for r in ok)
    assert all(isinstance(r["load"], dict) and "contended" in r["load"] for r in ok)
    _same_tables(new)


def test_rows_read_back_from_either_format_are_the_same(folders):
    old, new = (store.read_rows(f) for f in folders)
    assert len(old) == len(new) == 208
    assert old == new and [set(r) for r in old] == [set(r) for r in new]  # the same columns and values
