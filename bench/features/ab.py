"""``python -m bench ab A B``: the same cells measured under two builds taking turns.

A side is a source tree (a folder holding ``bench/``: its harness and variants), a Python
interpreter (another environment: another torch, say; it runs this tree's harness), or a plugin
file (this interpreter and tree, with that file's variants).  Each side runs in a server process
of its own that takes one slice of the sweep at a time (one sequence length, or one mix) and
measures it with ``bench.api``, its worker kept between slices.  Per repeat both servers are
started afresh and take the slices in turn, A B, B A, ... (the order alternates by slice and by
repeat), so that whatever changes from one minute to the next lands on both alike, and a process's
own offset (its memory layout) varies from one repeat to the next instead of biasing them all.

The unit of replication is the repeat: per cell, log(B / A) per repeat, whose mean, spread and t
test (``bench.measure.stats.paired_evidence``) give the ratio, its interval and the verdict, with
the false-discovery control ``compare`` has (``bench.engine.judge``).  Nothing here prints: the
command line does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]  # this tree: the harness an interpreter or a plugin side runs
SERVER = r"""
import json, sys
from pathlib import Path
out, sys.stdout = sys.stdout, sys.stderr  # the harness's own lines go to stderr; stdout is the protocol
from bench.api import SweepOptions, build_spec, discover, parse_values, run_sweep
registries = {}
print(json.dumps({"ready": True}), file=out, flush=True)
for line in sys.stdin:
    req = json.loads(line)
    plugins = tuple(req["settings"].get("plugins") or ())
    if plugins not in registries:
        registries[plugins] = discover(list(plugins))
    try:
        import dataclasses
        from bench.model.spec import Spec
        known = {f.name for f in dataclasses.fields(Spec)}  # a tree from before a setting existed runs without it
        given = {k: v for k, v in req["settings"].items() if k in known or k not in ("visits",)}
        spec = build_spec(parse_values(given), registries[plugins])
        run_sweep(spec, Path(req["out"]), SweepOptions(progress=False, keep_workers=True))
        print(json.dumps({"done": req["out"]}), file=out, flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), file=out, flush=True)
"""


@dataclass(frozen=True)
class Side:
    """One build: the interpreter it runs, the tree its harness comes from, its plugin files."""
    label: str  # A or B
    given: str  # as the user wrote it
    python: str
    tree: str
    plugins: tuple = ()

    def describe(self) -> str:
        kind = ("plugin " + ", ".join(self.plugins)) if self.plugins else (
            f"tree {self.tree}" if self.python == sys.executable else f"interpreter {self.python}")
        return f"{self.label}: {kind}"


def side(label: str, text: str) -> Side:
    """A side from what the user gave: a folder holding bench/, a .py plugin file, or an interpreter."""
    p = Path(text).expanduser()
    if p.is_dir():
        if not (p / "bench" / "__init__.py").is_file():
            raise UsageError(f"ab {label} {text}: a folder without bench/ in it; give a source tree of attnbench, "
                             f"a plugin file (.py) or a Python interpreter")
        return Side(label, text, sys.executable, str(p.resolve()))
    if p.is_file() and p.suffix == ".py":
        return Side(label, text, sys.executable, str(ROOT), (str(p.resolve()),))
    if p.is_file() and os.access(p, os.X_OK):
        return Side(label, text, str(p.resolve()), str(ROOT))
    raise UsageError(f"ab {label} {text!r}: not a source tree (a folder with bench/), a plugin file (.py) or a "
                     f"Python interpreter (an executable)")


def slices(settings: dict) -> list[dict]:
    """The sweep's settings cut into the slices the sides take in turn: one per sequence length
    (or one per mix), every other axis whole."""
    if settings.get("batch_mix"):
        return [settings | {"batch_mix": [m]} for m in settings["batch_mix"]]
    return [settings | {"seq_lens": [n]} for n in settings["seq_lens"]]


class Server:
    """A side's server process: one slice a request, its worker kept between them."""

    def __init__(self, s: Side):
        env = os.environ | {"PYTHONPATH": s.tree + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.side = s
        self.proc = subprocess.Popen([s.python, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd=s.tree)
        self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise UsageError(f"ab: side {self.side.describe()} stopped: its interpreter could not start the harness "
                             f"(`{self.side.python} -c 'import bench.api'` with PYTHONPATH={self.side.tree} says why)")
        return json.loads(line)

    def measure(self, settings: dict, out: Path) -> None:
        self.proc.stdin.write(json.dumps({"settings": settings, "out": str(out)}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise UsageError(f"ab: side {self.side.label} refused the sweep: {answer['error']}")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


B_SUFFIX = "@B"  # plugin sides measured together: B's variants under their names with this after them
SHIM = '''"""B's plugin file for ab, its variants renamed NAME@B so that A's and B's take turns in one sweep."""
import bench.model.registry as _model
import bench.registry as _public

_original = _model.variant


def _renamed(name, *args, **kwargs):
    return _original(name + {suffix!r}, *args, **kwargs)


_model.variant = _public.variant = _renamed
try:
    with open({path!r}) as _f:
        exec(compile(_f.read(), {path!r}, "exec"), globals())
finally:
    _model.variant = _public.variant = _original
'''


TOGETHER_VISITS = 3  # two plugin files in one sweep: each repeat visits every cell in 3 fresh workers, A and B
# in the same round of each (bench.engine.visits), so that each visit is a pair of its own


def together(sides: tuple[Side, Side]) -> bool:
    """Two plugin files under one interpreter and tree: their variants take turns within one sweep, in
    the same interleaved rounds of the same worker (drift at every time scale lands on both alike)."""
    a, b = sides
    return bool(a.plugins and b.plugins) and (a.python, a.tree) == (b.python, b.tree)


def renamed_plugin(side_b: Side, out: Path) -> str:
    """A plugin file that loads B's, its variants renamed with B_SUFFIX."""
    path = Path(out) / "side-b-renamed.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SHIM.format(suffix=B_SUFFIX, path=side_b.plugins[0]))
    return str(path)


def turns(repeat: int, index: int) -> tuple[str, str]:
    """Which side takes a slice first: A B, then B A, alternating by slice and by repeat, so that a
    drift in time lands on both alike."""
    return ("A", "B") if (repeat + index) % 2 == 0 else ("B", "A")


def folder(out: Path, repeat: int, index: int, label: str) -> Path:
    return Path(out) / f"repeat-{repeat + 1}" / label / f"slice-{index + 1}"


def run(sides: tuple[Side, Side], settings: dict, out: Path, repeats: int,
        start: Callable[[Side], object] = Server, progress: Callable[[str], None] = lambda _m: None) -> Path:
    """Measure ``settings`` under both sides, ``repeats`` times, into ``out``; ``start`` starts a
    side's server (a fake in tests).  Each repeat starts both servers afresh.  The servers get the
    folders as absolute paths: a tree side runs in its own tree, where a relative one would land."""
    out = Path(out).resolve()
    parts = slices(settings)
    if together(sides):
        a, b = sides
        from bench.engine.discovery import discover

        plugins = [*a.plugins, renamed_plugin(b, out)]
        known = discover(plugins).names()
        names = settings.get("variants") or [n for n in known if not n.endswith(B_SUFFIX)]
        theirs = [n + B_SUFFIX for n in names if n + B_SUFFIX in known]  # what B's file defines, B's own
        if not theirs:
            raise UsageError(f"ab: {b.given} defines none of the variants measured ({', '.join(names)}): two plugin "
                             f"files are compared by the variants they both define")
        settings = settings | {"variants": [*names, *theirs], "visits": TOGETHER_VISITS}
        parts = slices(settings)
        for k in range(repeats):
            server = start(Side("AB", f"{a.given} + {b.given}", a.python, a.tree, tuple(plugins)))
            try:
                for i, part in enumerate(parts):
                    server.measure(part | {"plugins": plugins}, folder(out, k, i, "AB"))
                    progress(f"repeat {k + 1}/{repeats}, slice {i + 1}/{len(parts)}")
            finally:
                server.close()
        return Path(out)
    by_label = {s.label: s for s in sides}
    for k in range(repeats):
        servers = {}
        try:
            for label in ("A", "B"):
                servers[label] = start(by_label[label])
            for i, part in enumerate(parts):
                for label in turns(k, i):
                    s = by_label[label]
                    values = part | ({"plugins": list(s.plugins)} if s.plugins else {})
                    servers[label].measure(values, folder(out, k, i, label))
                progress(f"repeat {k + 1}/{repeats}, slice {i + 1}/{len(parts)}")
        finally:
            for srv in servers.values():
                srv.close()
    return Path(out)


def rows_by_cell(out: Path, repeats: int, n_slices: int) -> dict:
    """{cell key: {"A": [a figure per unit], "B": [...]}} over the ok cells both sides measured in every
    repeat (a plugin side's variants are matched by name).  The unit is the repeat; two plugin files
    measured together pair per visit of each repeat (``TOGETHER_VISITS``: A and B in the same fresh
    worker and the same round), which are as many more units."""
    from bench.engine import store
    from bench.model.row import IDENTITY, current_rows

    cells: dict = {}
    for k in range(repeats):
        for i in range(n_slices):
            for label in ("A", "B", "AB"):
                f = folder(out, k, i, label)
                for r in current_rows(store.read_rows(f, quiet=True)) if f.exists() else []:
                    if r.get("status") != "ok" or not r.get("median_ms"):
                        continue
                    side_of = label
                    if label == "AB":  # one sweep: B's variants carry the suffix
                        side_of = "B" if r["variant"].endswith(B_SUFFIX) else "A"
                        r = r | {"variant": r["variant"].removesuffix(B_SUFFIX)}
                    key = tuple(str(r.get(c)) for c in IDENTITY)
                    units = cells.setdefault(key, {"A": {}, "B": {}, "row": r})[side_of]
                    if label == "AB" and r.get("visit_ids"):
                        units.update({(k, v): m for v, m in zip(r["visit_ids"], r["visit_medians_ms"])})
                    else:
                        units[(k, 0)] = float(r["median_ms"])
    out_cells = {}
    for key, v in cells.items():
        if {k for k, _ in v["A"]} != set(range(repeats)) or {k for k, _ in v["B"]} != set(range(repeats)):
            continue  # a repeat that one side lacks
        paired = sorted(set(v["A"]) & set(v["B"]))
        out_cells[key] = {"A": [v["A"][u] for u in paired], "B": [v["B"][u] for u in paired], "row": v["row"]}
    return out_cells


def analyse(cells: dict, margin: float, fdr: float) -> list[dict]:
    """Per cell: the repeats' medians of A and B, the paired ratio with its interval, p and q, and the
    verdict (bench.engine.judge.compare_verdict, false discoveries controlled across the cells)."""
    from statistics import median

    from bench.engine import judge
    from bench.measure.stats import benjamini_hochberg, paired_evidence

    keys = sorted(cells)
    evidence = [paired_evidence(cells[k]["A"], cells[k]["B"], margin) for k in keys]
    rejected, qvalues = benjamini_hochberg([e.p for e in evidence], fdr)
    out = []
    for key, e, rej, q in zip(keys, evidence, rejected, qvalues):
        r = cells[key]["row"]
        out.append({"variant": r["variant"], "dtype": r["dtype"], "mask": r["mask"], "direction": r["direction"],
                    "q_len": r["q_len"], "kv_len": r["kv_len"], "batch": r["batch"], "heads": r["heads"],
                    "head_dim": r["head_dim"], "a_ms": median(cells[key]["A"]), "b_ms": median(cells[key]["B"]),
                    "ratio": e.ratio, "ratio_lo": e.lo, "ratio_hi": e.hi, "p": e.p, "q": q, "repeats": e.repeats,
                    "verdict": judge.compare_verdict(e, rej, margin)})
    return out


def aa_drift(cells: dict) -> tuple[float, float]:
    """An A/A's between-run drift per run, (each cell's own, a run's common shift): per repeat the
    median log(B / A) over the cells is the repeats' shift; the sd of the shifts, and the median over
    the cells of the sd of what is left, each over sqrt(2) (a ratio holds two runs' drift)."""
    import math
    import statistics

    keys = sorted(cells)
    logs = {k: [math.log(b / a) for a, b in zip(cells[k]["A"], cells[k]["B"])] for k in keys}
    repeats = min(len(v) for v in logs.values())
    if not keys or repeats < 2:
        return math.nan, math.nan
    shifts = [statistics.median(logs[k][j] for k in keys) for j in range(repeats)]
    own = [statistics.stdev([logs[k][j] - shifts[j] for j in range(repeats)]) for k in keys]
    return statistics.median(own) / math.sqrt(2), statistics.stdev(shifts) / math.sqrt(2)
