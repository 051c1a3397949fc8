import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the machine's peaks (bench.engine.peaks) are cached for the session, in a folder of its own: the
# first sweep measures them, the others reuse them, and no user cache is read or written
os.environ.setdefault("ATTNBENCH_CACHE_DIR", tempfile.mkdtemp(prefix="attnbench-test-cache-"))


CPU_BY_DEFAULT = ("sweep", "profile", "selfcheck")


def run_cli(*args, timeout=600, env=None, cwd=None):
    """``python -m bench ARGS`` in a subprocess; returns CompletedProcess (text).  The suite
    describes CPU behaviour: on a machine with a GPU (where the default device is CUDA) a
    measuring command stays on the CPU unless the test names a --device (or resumes a run,
    whose saved spec has one).  A sweep re-measures no contended cell at its end unless the
    test asks (``--remeasure N``; tests/test_remeasure.py does)."""
    args = list(args)
    if args and args[0] in CPU_BY_DEFAULT and "--device" not in args and "--resume" not in args:
        args += ["--device", "cpu"]
    if args and args[0] == "sweep" and "--remeasure" not in args:
        args += ["--remeasure", "0"]  # a test counts the rows it wrote: no second row for a cell the load flagged
    full_env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "bench", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT)


def write_plugin(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="session")
def registry():
    from bench.api import discover

    return discover(entry_points=False)
