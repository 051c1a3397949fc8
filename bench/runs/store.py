"""The run folder: results.jsonl (append-only, one flushed line per finished cell),
env.json, and report/.  ``runs/latest`` points at the newest run under runs/."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from pathlib import Path

from bench.runs import visits
from bench.runs.judge import wants_retry
from bench.measure.stats import row_figures
from bench.model import row as rows_of  # current_rows: the one helper that says which row of a cell counts
from bench.model.case import CASE_ADDED, CASE_FIELDS
from bench.model.row import (
    DERIVED,
    FORMAT,
    cell_key,
    format_of,
    formats,
    from_disk,
    make_row,
    shape_format,
    to_record,
    with_case_defaults,
)

log = logging.getLogger(__name__)  # printed by the handler the command line installs (bench.engine.events)

RESULTS = "results.jsonl"
PROFILE = "profile.jsonl"  # sweep --profile: category shares per cell, from a pass after the timing
ENV = "env.json"
DEFAULT_ROOT = Path("runs")


def read_current(run_dir: Path, quiet: bool = False) -> list[dict]:
    """``current_rows`` of a run folder's results.jsonl (``quiet``: its bad lines unsaid, for a
    reader that only learns from other folders, such as the planner)."""
    return rows_of.current_rows(read_rows(run_dir, quiet=quiet))


def measured(row: dict) -> dict:
    """A row as a worker sent it, its measurements only (the derived figures, ``DERIVED``, left
    out), with the figures computed as every reader computes them (``row_figures``): the row a sweep
    holds in memory is the row a reader of its folder gets, figure for figure."""
    kept = {k: v for k, v in row.items() if k not in DERIVED}
    return kept | row_figures(kept)


def done_keys(rows, retry=frozenset()) -> set:
    """The cells a resume does not measure again: those whose current row's status is not in
    ``retry`` (which may also name the flags of ``judge.RETRY_FLAGS``: ok cells noisy, contended,
    throttled, or any)."""
    return {cell_key(r["variant"], r) for r in rows_of.current_rows(rows) if not wants_retry(r, retry)}


def shard_folder(sweep_dir: Path, i: int, n: int) -> Path:
    """Shard ``i`` of ``n``'s run folder in its sweep's folder (``runs/<sweep id>/shard-i-of-N``)."""
    return Path(sweep_dir) / f"shard-{i}-of-{n}"


def new_run_dir(device: str, root: Path = DEFAULT_ROOT, link_latest: bool = True) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{stamp}-{device}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{device}-{n}"
    path.mkdir(parents=True)
    if not link_latest:
        return path
    latest = root / "latest"
    try:
        if latest.is_symlink() or latest.exists():
            latest.unlink()
        latest.symlink_to(path.name, target_is_directory=True)
    except OSError:
        pass  # a filesystem without symlinks: runs/latest is a convenience only
    return path


def writable_dir(path, flag: str = "--out") -> Path:
    """``path`` as a folder that exists and can be written, or a UsageError that says why."""
    from bench.errors import UsageError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {path}: a file is there; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write there ({exc.strerror or exc})") from None
    return path


def is_run_folder(path) -> bool:
    """Whether ``path`` is a run folder (it holds results.jsonl or env.json)."""
    path = Path(path)
    return path.is_dir() and ((path / RESULTS).exists() or (path / ENV).exists())


def output_file(path, flag: str = "--out", force: bool = False, own: tuple = ()) -> Path:
    """``path`` as a new file a command may write, or a UsageError that says why not: its folder
    must exist, it must not be a folder, it never replaces a file of a run folder (its rows, its
    env.json, ...: only the names in ``own``, the command's own output there, with ``force``), and
    it replaces no other existing file without ``force``."""
    from bench.errors import UsageError

    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{flag} {path}: a folder is there; give the path of a file to write")
    if not path.parent.is_dir():
        raise UsageError(f"{flag} {path}: the folder {path.parent} does not exist; create it or give another path")
    if path.exists():
        if is_run_folder(path.parent) and path.name not in own:
            raise UsageError(f"{flag} {path}: a file of the run folder {path.parent}; export never writes over a "
                             f"run's files: give a path outside it")
        if not force:
            raise UsageError(f"{flag} {path}: the file exists; --force replaces it")
    return path


def require_run(run_dir) -> Path:
    """``run_dir`` as a Path, or a UsageError when it holds no results.jsonl."""
    from bench.errors import UsageError

    path = Path(run_dir)
    if not (path / RESULTS).exists():
        raise UsageError(f"{run_dir}: not a run folder (no {RESULTS})")
    return path


_CASE_REQUIRED = tuple(f for f in CASE_FIELDS if f not in CASE_ADDED)
REQUIRED = {RESULTS: ("variant", "status", *_CASE_REQUIRED), PROFILE: ("variant", *_CASE_REQUIRED)}
_WARNED: set = set()


def read_rows(run_dir: Path, repair: bool = False, name: str = RESULTS, quiet: bool = False,
              with_visits: bool = True) -> list[dict]:
    """Every valid row.  A torn last line (a killed writer: no newline at the end) is left
    out, and with ``repair`` cut off so that appends start on a fresh line; it is the only
    line ever removed.  Any other line that is not a JSON object holding the row's columns
    (garbage, NULs, an array, a row missing its case) is skipped with a warning naming its
    line number, and stays in the file: a valid row is never rewritten or dropped.  The rows of
    results.jsonl come with their later visits folded in (``with_visits``; False: as written)."""
    path = Path(run_dir) / name
    if not path.exists():
        return []
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    rows = []
    env = _env_quietly(run_dir) if name == RESULTS else {}
    pairs = formats(env) if env is not None else None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        row, why = _parse(line, REQUIRED.get(name, ()))
        if row is None:
            if not quiet:
                _warn(path, number, why)
        elif name == RESULTS:  # the one converter, by the line's format (env.json's row_formats)
            rows.append(from_disk(row, format_of(pairs, number) if pairs else shape_format(row), row_figures))
        else:
            rows.append(with_case_defaults(row))
    if torn and repair:
        with open(path, "r+b") as f:
            f.truncate(len(data) - len(torn))
    if name == RESULTS and with_visits:  # --visits: a cell's later visits fold into its row (bench.runs.visits)
        rows = visits.merge(rows, visits.by_row(read_rows(run_dir, name=visits.VISITS, quiet=quiet)))
    return rows


def _env_quietly(run_dir) -> dict | None:
    """env.json for the rows' formats only: None when it is missing or unreadable (each record's
    shape tells its format then, ``shape_format``; the commands that need env.json say what is
    wrong with it through ``read_env``)."""
    try:
        env = json.loads((Path(run_dir) / ENV).read_bytes())
    except (OSError, ValueError):
        return None
    return env if isinstance(env, dict) else None


def next_line(run_dir: Path) -> int:
    """The number the next line appended to results.jsonl will have (a torn last line is cut
    before any append, so it does not count)."""
    path = Path(run_dir) / RESULTS
    return (path.read_bytes().count(b"\n") if path.exists() else 0) + 1


def row_formats(run_dir: Path, env: dict) -> list:
    """env.json's ``row_formats`` once rows of this build's ``FORMAT`` are appended from here on:
    a new folder is FORMAT throughout; an older folder resumed keeps its lines' format and
    gains a pair for the lines this build appends."""
    pairs, line = formats(env), next_line(run_dir)
    if line == 1:  # no row yet
        return [[1, FORMAT]]
    return [list(p) for p in pairs] + ([] if pairs[-1][1] == FORMAT else [[line, FORMAT]])


def _parse(line: bytes, required) -> tuple[dict | None, str]:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None, "not valid JSON" + (" (NUL bytes)" if b"\x00" in line else "")
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    missing = [k for k in required if k not in row]
    if missing:
        return None, f"a row without {', '.join(missing)}"
    return row, ""


def _warn(path: Path, number: int, why: str) -> None:
    key = (str(Path(path).resolve()), number)  # once per line, however the folder was named
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("%s:%d: skipped, %s; the line is left in the file", path, number, why)


def _finite(value):
    """NaN and infinities as null (strict JSON has neither); the reason column says why."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class ResultWriter:
    def __init__(self, run_dir: Path, name: str = RESULTS):
        self.path = Path(run_dir) / name
        self.typed = name == RESULTS
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, row) -> None:
        """Append one row (a dict that ``make_row`` checks: results.jsonl takes only declared
        columns of their types) and flush it to disk."""
        if self.typed:
            row = to_record(make_row(row))
        self._f.write(json.dumps(_finite(row), default=str, allow_nan=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def write_env(run_dir: Path, env: dict) -> None:
    """env.json, atomically: a new file renamed over the old one, so a kill never leaves half.
    Without ``row_formats``, the folder's rows are this build's format throughout."""
    write_json(run_dir, ENV, env if "row_formats" in env else env | {"row_formats": [[1, FORMAT]]}, indent=2)


def write_json(run_dir: Path, name: str, obj, indent: int | None = None) -> None:
    """A JSON file of the run folder, atomically (written beside it, then renamed over it)."""
    path = Path(run_dir) / name
    tmp = path.with_name(f".{name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_finite(obj), indent=indent, default=str, allow_nan=False) + "\n")
    os.replace(tmp, path)


MASKS = "masks.json"  # each mask of the sweep: its definition, parameters and keep pattern at n = 256


def read_masks(run_dir: Path) -> dict:
    """masks.json as {label: entry}; {} when the run has none or it cannot be read (it only feeds pictures)."""
    p = Path(run_dir) / MASKS
    try:
        data = json.loads(p.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def read_env(run_dir: Path) -> dict:
    """env.json as a dict ({} when there is none); a UsageError when it is not one."""
    from bench.errors import UsageError

    p = Path(run_dir) / ENV
    if not p.exists():
        return {}
    try:
        env = json.loads(p.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else \
            f"byte {exc.start} is not UTF-8"
        raise UsageError(f"{p}: env.json is not valid JSON/UTF-8 ({where}); it is the run's environment "
                         f"record: restore it, or remove it to rebuild without it (results.jsonl is untouched)") \
            from None
    if not isinstance(env, dict):
        raise UsageError(f"{p}: a JSON {type(env).__name__}, not the object env.json holds")
    return env


def pct_peak(tflops, dtype: str, env: dict) -> float | None:
    """% of the matmul peak: ``tflops`` over the peak env.json holds for ``dtype`` at the sweep's
    end (the better of the measurements at its start and end).  Rows do not carry it, since
    the end-of-sweep peak is not known when a row is written; the report and the export both
    take it from here, so they agree."""
    peak = (env.get("peaks_tflops") or {}).get(dtype)
    if tflops is None or not peak or tflops != tflops:
        return None
    return 100.0 * float(tflops) / float(peak)


LOCK = ".lock"


@contextlib.contextmanager
def locked(run_dir: Path):
    """Hold the run folder for one sweep: a second sweep into it exits 2 and names the
    process that holds it (filelock: released by the OS when the holder dies)."""
    from filelock import FileLock, Timeout

    from bench.errors import UsageError

    run_dir = Path(run_dir)
    lock = FileLock(str(run_dir / LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        holder = (run_dir / (LOCK + ".pid")).read_text().strip() if (run_dir / (LOCK + ".pid")).exists() else "?"
        raise UsageError(f"{run_dir}: another sweep is writing to this run folder (process {holder}); wait for it "
                         f"to end, or choose another --out") from None
    try:
        (run_dir / (LOCK + ".pid")).write_text(f"{os.getpid()}\n")
        yield run_dir
    finally:
        lock.release()
