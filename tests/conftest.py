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
MAX_TEST_WORKERS = 4  # the suite's sweeps each take two threads: more workers would only contend for cores


def pytest_xdist_auto_num_workers(config):
    """How many processes ``-n auto`` (pyproject's addopts) runs the suite in: one per usable core
    and one more (a test that starts a sweep waits on it, and on its worker's start, for much of
    its time, so one process per core leaves cores idle), at most
    MAX_TEST_WORKERS; none (the suite in this process) on one core, and when the pytest-benchmark
    suite is asked to measure, since a benchmark timed beside other tests is not a measurement."""
    measuring = config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 0 if measuring or cores < 2 else min(cores + 1, MAX_TEST_WORKERS)


def run_cli(*args, timeout=600, env=None, cwd=None):
    """``python -m bench ARGS`` in a subprocess; returns CompletedProcess (text).  The suite
    describes CPU behaviour: on a machine with a GPU (where the default device is CUDA) a
    measuring command stays on the CPU unless the test names a --device (or resumes a run,
    whose saved spec has one).  A sweep re-measures no contended cell at its end unless the
    test asks (``--remeasure N``; tests/features/test_remeasure.py does), and visits each cell once unless
    it asks (``--visits N``; tests/engine/test_visits.py does)."""
    args = list(args)
    if args and args[0] in CPU_BY_DEFAULT and "--device" not in args and "--resume" not in args:
        args += ["--device", "cpu"]
    if args and args[0] == "sweep" and "--remeasure" not in args:
        args += ["--remeasure", "0"]  # a test counts the rows it wrote: no second row for a cell the load flagged
    if args and args[0] == "sweep" and "--visits" not in args and "--resume" not in args:
        args += ["--visits", "1"]  # one visit: tests/engine/test_visits.py measures the later ones
    full_env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "bench", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT)


def made_once(tmp_path_factory, name: str, make):
    """A folder made once for the whole test run, by ``make(folder)`` (which returns a
    CompletedProcess); returns the folder and that process.  With xdist the tests of one module are
    spread over workers, and a module fixture would be made in each of them, side by side: here the
    first worker to ask makes it, under a file lock, and the others wait for it and read it (its
    process's output kept beside it).  A folder that ``make`` failed to finish is made again."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder, done = root / f"made-once-{name}", root / f"made-once-{name}.json"
    with FileLock(str(root / f"made-once-{name}.lock")):
        if not done.exists():
            if folder.exists():
                import shutil

                shutil.rmtree(folder)
            folder.mkdir()
            proc = make(folder)
            done.write_text(json.dumps({"args": [str(a) for a in proc.args], "returncode": proc.returncode,
                                        "stdout": proc.stdout, "stderr": proc.stderr}))
    kept = json.loads(done.read_text())
    return folder, subprocess.CompletedProcess(kept["args"], kept["returncode"], kept["stdout"], kept["stderr"])


@pytest.fixture
def calibrated(monkeypatch, tmp_path_factory):
    """``calibrate(env, sigma)``: this machine's between-run drift as an A/A ab would record it
    (bench.runs.drift), in a cache folder of the test's own; compare of two runs reads it."""
    monkeypatch.setenv("ATTNBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("calibrated-cache")))

    def calibrate(env: dict | None = None, sigma: float = 0.01) -> None:
        from bench.runs import drift

        drift.record(env or {"device": "cpu"}, cell=sigma, run=sigma, cells=18, repeats=5)
    return calibrate


def write_plugin(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


def read_jsonl(path: Path) -> list[dict]:
    """Every line of a JSONL file; a run folder's results.jsonl as its rows read (every line,
    the derived figures computed, each group's columns at the top level: ``store.read_rows``)."""
    path = Path(path)
    if path.name == "results.jsonl":
        from bench.runs import store

        return store.read_rows(path.parent, with_visits=False)
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_records(path: Path) -> list[dict]:
    """Every line of a JSONL file as it is stored."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="session")
def registry():
    from bench.api import discover

    return discover(entry_points=False)


def check_every_variant(registry, case, skip=("flex",)) -> list[str]:
    """Every variant of ``registry`` that takes ``case`` (approximate ones and ``skip`` aside: flex
    compiles for seconds a case, and its eager form reads the same definitions), run once and checked
    against the float64 reference, forward and gradients; one that does not take it must say why.
    Returns the names that ran."""
    from bench.measure.bound import bind_variant
    from bench.measure.correctness import run_and_check
    from bench.model.registry import available

    ran = []
    for v in registry:
        if v.approximate or v.name in skip:
            continue
        ok, why = available(v, case)
        if not ok:
            assert why, f"{v.name} is unavailable without a reason"
            continue
        bound = bind_variant(v, case)
        with bound.scope():
            result = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out)
        assert result.ok, (v.name, result.reason)
        ran.append(v.name)
    return ran


def eager_flex(case, traced=False, **kw):
    """flex_attention uncompiled (its reference implementation, which the CPU also runs) on the
    case's inputs, its block mask from the case's mask_mod (per batch and head where the mask
    depends on them): (output, (q, k, v)); ``kw`` go to flex_attention (return_lse=True makes the
    output (out, lse)).

    Untraced by default: the mask_mod and score_mod run in Python under vmap, as the definitions
    read, which costs milliseconds.  ``traced=True`` is flex_attention's own default, where dynamo
    first traces them whole (fullgraph, eager backend) as torch.compile would: a few hundred
    milliseconds for each new mask, so the tests that ask for it are slow."""
    import warnings

    import torch.nn.attention.flex_attention as fa
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from bench.measure.inputs import make_inputs
    from bench.model import masks

    bound = masks.bind(case)
    q, k, v = make_inputs(case)
    per_batch, per_head = bound.depends
    block_mask = None if bound.mask_mod() is None else create_block_mask(
        bound.mask_mod(), case.batch if per_batch else None, case.heads if per_head else None,
        case.q_len, case.kv_len, device="cpu")
    previous = getattr(fa, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", None)
    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = not traced
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "called without torch.compile": that is the point here
            out = flex_attention(q, k, v, block_mask=block_mask, score_mod=bound.score_mod(), scale=case.scale,
                                 enable_gqa=case.is_gqa, **kw)
    finally:
        fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = previous
    return out, (q, k, v)


def pytest_configure(config):
    """A test process of ``-n auto`` runs torch on one thread and draws a report's charts in its
    own process: there is a test process per core already, and a second thread or a drawing
    process each would only contend (the suite's small tensors ran about a third slower, and a
    report built in a test spawned a process that imports matplotlib).  The sweeps the tests start
    choose their own threads.  Every test process prints the engine's notes and warnings as the
    command line does."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        os.environ.setdefault("ATTNBENCH_DRAW_PROCESSES", "0")
    # the engine logs its notes and warnings (bench.engine.events); a test process prints them on stderr
    # as `python -m bench` does, from its first test on, whichever test calls the command line first
    from bench.cli.common import listen

    listen()
