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
the false-discovery control ``compare`` has (``bench.runs.judge``).  Nothing here prints: the
command line does.
"""

from __future__ import annotations

import json
import math
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


ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "TEMP", "TMP", "LANG", "LANGUAGE", "TZ",
            "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "SLURM_JOB_ID")
ENV_KEEP_PREFIXES = ("LC_", "ATTNBENCH_")  # a locale's parts; the harness's own settings (its cache folder)


def pair_env(seed: int | None) -> dict:
    """The environment both sides of a repeat run with (a whitelist, as pyperf's workers have:
    whatever else the shell holds cannot differ between them or tilt one side), with the repeat's
    hash seed."""
    env = {k: v for k, v in os.environ.items() if k in ENV_KEEP or k.startswith(ENV_KEEP_PREFIXES)}
    if seed is not None:
        env["PYTHONHASHSEED"] = str(seed)
    return env


def conditions(repeat: int, threads: int | None = None, allowed: list[int] | None = None) -> dict:
    """What both sides of repeat ``repeat`` share and the next repeat varies: the hash seed (drawn
    from the repeat's number), the cores the servers and their workers may run on (a window of
    ``threads`` cores that moves by one each repeat; all of them when the sweep uses every core),
    and the thread count (the sweep's: another count would time another cell)."""
    import zlib

    if allowed is None:
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    seed = zlib.crc32(f"attnbench-ab-{repeat}".encode()) % 4294967295
    width = min(threads or len(allowed), len(allowed))
    cpus = [allowed[(repeat + i) % len(allowed)] for i in range(width)] if allowed else []
    return {"repeat": repeat + 1, "seed": seed, "cpus": sorted(cpus), "threads": threads or width or None}


class Server:
    """A side's server process: one slice a request, its worker kept between them, started with its
    repeat's ``conditions`` (the hash seed, the environment, the cores: both sides alike)."""

    def __init__(self, s: Side, conditions: dict | None = None):
        conditions = conditions or {}
        env = pair_env(conditions.get("seed"))
        env["PYTHONPATH"] = s.tree + os.pathsep + os.environ.get("PYTHONPATH", "")
        cpus = conditions.get("cpus")
        self.side = s
        self.proc = subprocess.Popen([s.python, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env, cwd=s.tree,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
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
    """Whether B's variants can take turns with A's within one sweep, in the same interleaved rounds
    of the same worker (drift at every time scale lands on both alike): two plugin files under one
    interpreter and tree, or two trees under one interpreter whose harnesses (bench/) are the same
    (B's variants/ loaded beside A's, ``tree_plugin``)."""
    a, b = sides
    if a.python != b.python:
        return False
    if a.plugins and b.plugins:
        return a.tree == b.tree
    return not a.plugins and not b.plugins and a.tree != b.tree and not tree_difference(a.tree, b.tree)["bench"]


B_PACKAGE = "attnbench_side_b_variants"  # the package B's variants/ is loaded under, beside A's own
TREE_SHIM = '''"""Tree B's variants/ for ab, loaded beside A's as the package {package}: each module's
source read from B's tree with its imports of `variants` turned to {package} (so that a variant
importing a helper from its own tree gets B's), each variant renamed NAME@B and none a baseline."""
import importlib
import importlib.abc
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path

import bench.model.registry as _model
import bench.registry as _public

_ROOT, _PACKAGE = Path({root!r}), {package!r}
_FROM = re.compile(r"^(\\s*from\\s+)variants(?=[.\\s])", re.M)
_IMPORT = re.compile(r"^(\\s*)import\\s+variants((?:\\.\\w+)*)\\s*$", re.M)
_IMPORT_AS = re.compile(r"^(\\s*import\\s+)variants((?:\\.\\w+)*\\s+as\\s)", re.M)


def _rewrite(text):
    text = _FROM.sub(lambda m: m.group(1) + _PACKAGE, text)
    text = _IMPORT_AS.sub(lambda m: m.group(1) + _PACKAGE + m.group(2), text)
    return _IMPORT.sub(lambda m: f"{{m.group(1)}}variants = __import__({{(_PACKAGE + m.group(2))!r}})", text)


class _Loader(importlib.abc.Loader):
    def __init__(self, path):
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module):  # never through a bytecode cache: B's own .pyc holds the unrewritten imports
        exec(compile(_rewrite(Path(self.path).read_text()), self.path, "exec", dont_inherit=True), module.__dict__)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != _PACKAGE and not fullname.startswith(_PACKAGE + "."):
            return None
        where = _ROOT.joinpath("variants", *fullname.split(".")[1:])
        if (where / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(fullname, where / "__init__.py",
                                                          loader=_Loader(str(where / "__init__.py")),
                                                          submodule_search_locations=[str(where)])
        if where.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(fullname, where.with_suffix(".py"),
                                                          loader=_Loader(str(where.with_suffix(".py"))))
        return None


sys.meta_path.insert(0, _Finder())

_original = _model.variant


def _renamed(name, *args, **kwargs):
    return _original(name + {suffix!r}, *args, **(kwargs | {{"baseline": False}}))


_mine = _model.module_variants(sys.modules[__name__], create=True)
_model.variant = _public.variant = _renamed
try:
    _package = importlib.import_module(_PACKAGE)
    for _info in sorted(pkgutil.iter_modules(_package.__path__), key=lambda m: m.name):
        if not _info.name.startswith("_"):
            _mine.extend(_model.module_variants(importlib.import_module(f"{{_PACKAGE}}.{{_info.name}}")))
finally:
    _model.variant = _public.variant = _original
'''


def tree_plugin(side_b: Side, out: Path) -> str:
    """A plugin file that loads tree B's variants/ beside A's (``TREE_SHIM``), renamed with B_SUFFIX."""
    path = Path(out) / "side-b-variants.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TREE_SHIM.format(root=side_b.tree, package=B_PACKAGE, suffix=B_SUFFIX))
    return str(path)


def tree_difference(a: str, b: str) -> dict:
    """Which of the two trees' Python files differ, by top-level folder: {"bench": [...], "variants":
    [...], "other": [...]} (paths relative to the tree)."""
    import hashlib

    def files(root: Path) -> dict:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for top in ("bench", "variants") for p in sorted((root / top).rglob("*.py"))
                if "__pycache__" not in p.parts}
    fa, fb = files(Path(a)), files(Path(b))
    changed = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
    return {"bench": [k for k in changed if k.startswith("bench")],
            "variants": [k for k in changed if k.startswith("variants")]}


def mode(sides: tuple[Side, Side]) -> tuple[str, str]:
    """How the two sides are measured, and why: ``together`` (two plugin files: one sweep, B's
    variants as NAME@B in the same rounds of the same workers) or ``turns`` (a server per side, the
    slices in turn)."""
    a, b = sides
    if together(sides) and a.plugins:
        return "together", ("both sides are plugin files under one interpreter and tree, so B's variants (as "
                            "NAME@B) take turns with A's in the same rounds of the same workers")
    if together(sides):
        changed = len(tree_difference(a.tree, b.tree)["variants"])
        return "together", (f"the trees' harnesses are the same and they differ in {changed} file(s) under variants/, "
                            f"so B's variants/ is loaded into A's workers (as NAME@B) and takes turns with A's in the "
                            f"same rounds")
    if a.python != b.python:
        return "turns", "the sides run different interpreters, so each has its own server; they take the slices in turn"
    if a.tree != b.tree and not a.plugins and not b.plugins:
        diff = tree_difference(a.tree, b.tree)
        return "turns", (f"the trees' harnesses differ ({len(diff['bench'])} file(s) under bench/), so each runs its "
                         f"own: a server per tree, the slices in turn")
    return "turns", "a server per side, the slices in turn"


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


def plan(sides: tuple[Side, Side], settings: dict, out: Path) -> tuple[dict, list[dict], list[Side]]:
    """The settings each repeat measures, their slices, and the servers each repeat starts (two plugin
    files together: one, with B's file renamed; else one per side)."""
    out = Path(out).resolve()
    if not together(sides):
        return settings, slices(settings), list(sides)
    a, b = sides
    from bench.engine.discovery import discover

    plugins = [*a.plugins, renamed_plugin(b, out) if b.plugins else tree_plugin(b, out)]
    known = discover(plugins).names()
    names = settings.get("variants") or [n for n in known if not n.endswith(B_SUFFIX)]
    theirs = [n + B_SUFFIX for n in names if n + B_SUFFIX in known]  # what B's file defines, B's own
    if not theirs:
        raise UsageError(f"ab: {b.given} defines none of the variants measured ({', '.join(names)}): two "
                         f"{'plugin files' if b.plugins else 'trees'} are compared by the variants they both define")
    settings = settings | {"variants": [*names, *theirs], "visits": TOGETHER_VISITS, "plugins": plugins}
    return settings, slices(settings), [Side("AB", f"{a.given} + {b.given}", a.python, a.tree, tuple(plugins))]


def run_repeat(sides: tuple[Side, Side], settings: dict, out: Path, k: int, start: Callable = Server,
               progress: Callable[[str], None] = lambda _m: None, of: int | str = "?", planned=None) -> dict:
    """Repeat ``k`` (from 0): fresh servers for both sides, started with the same ``conditions``,
    take the slices in turn (``turns``).  Returns the repeat's conditions.  The servers get the
    folders as absolute paths: a tree side runs in its own tree, where a relative one would land."""
    out = Path(out).resolve()
    settings, parts, servers_of = planned or plan(sides, settings, out)
    cond = conditions(k, settings.get("threads"))
    by_label = {s.label: s for s in servers_of}
    servers = {}
    try:
        for s in servers_of:
            servers[s.label] = start(s, cond)
        for i, part in enumerate(parts):
            for label in (("AB",) if "AB" in by_label else turns(k, i)):
                s = by_label[label]
                values = part | ({"plugins": list(s.plugins)} if s.plugins else {})
                servers[label].measure(values, folder(out, k, i, label))
            progress(f"repeat {k + 1}/{of}, slice {i + 1}/{len(parts)}")
    finally:
        for srv in servers.values():
            srv.close()
    return cond


def run(sides: tuple[Side, Side], settings: dict, out: Path, repeats: int, start: Callable = Server,
        progress: Callable[[str], None] = lambda _m: None) -> Path:
    """Measure ``settings`` under both sides, ``repeats`` times, into ``out``; ``start`` starts a
    side's server (a fake in tests).  Each repeat starts both servers afresh."""
    planned = plan(sides, settings, out)
    for k in range(repeats):
        run_repeat(sides, settings, out, k, start, progress, repeats, planned)
    return Path(out)


MAX_REPEATS = 50  # the most repeats a sequential ab takes, whatever its budget


def looks(first: int, most: int = MAX_REPEATS) -> list[int]:
    """The repeat counts at which a sequential ab looks at its cells: ``first``, then each about 1.5
    times the last (3, 5, 8, 12, 18, 27, 41, 50): few looks, so that the alpha each one spends
    (``look_weight``) stays large."""
    out, r = [], first
    while r < most:
        out.append(r)
        r = max(r + 1, math.ceil(r * 1.5))
    return [*out, most]


def look_weight(j: int) -> float:
    """A split of the false-discovery rate over looks whose number is not known: 1 / (j (j + 1)) to
    look ``j`` (from 1), which sums to 1 over any number of looks (``analyse``'s default)."""
    return 1.0 / (j * (j + 1))


def spend(repeats: int, last: int, spent: float, final: bool) -> float:
    """The share of the false-discovery rate a look at ``repeats`` spends (an alpha-spending rule,
    Bonferroni over the looks): (repeats / last)^2 less what earlier looks ``spent``, where ``last``
    is the most repeats the budget is expected to allow (from the repeats' walls, never from what
    they measured); a ``final`` look (no repeat fits after it) spends all that is left.  The early
    looks spend little and the last most of it, and the shares never sum past 1."""
    if final:
        return max(0.0, 1.0 - spent)
    return max(0.0, min(1.0, (repeats / max(last, repeats)) ** 2) - spent)


def sequential(sides: tuple[Side, Side], settings: dict, out: Path, first: int, budget_s: float,
               decided: Callable[[int, int, list], bool], start: Callable = Server,
               progress: Callable[[str], None] = lambda _m: None, clock: Callable[[], float] = None) -> dict:
    """Repeat after repeat until every cell is decided or the budget is spent.  ``decided(repeats,
    look, weights)`` analyses the repeats so far at look ``look``, each look's share of the
    false-discovery rate in ``weights`` (``spend``), and says whether every cell is decided.  A
    repeat starts only where the repeats' mean wall says it ends inside ``budget_s`` (the first
    ``first`` always run).  The looks are ``looks(first)``'s, but one after which the budget is
    expected to end before the next scheduled look: the budget's last repeat takes it instead
    (with the rest of the rate, where a look one repeat earlier would have split it).  Returns
    {"repeats", "looks", "weights", "walls_s", "conditions", "stopped"}."""
    import time

    clock = clock or time.monotonic
    planned = plan(sides, settings, out)
    t0, walls, conds, seen, weights = clock(), [], [], [], []
    schedule = looks(first)
    stopped = "the most repeats"
    k = 0

    def fitting() -> int:  # the repeats after this one that the budget is expected to allow
        mean = sum(walls) / len(walls)
        return min(MAX_REPEATS - k, max(0, int((budget_s - (clock() - t0)) // mean))) if mean > 0 else 0

    while k < MAX_REPEATS:
        t = clock()
        conds.append(run_repeat(sides, settings, out, k, start, progress, "?", planned))
        walls.append(clock() - t)
        k += 1
        more = fitting()
        later = [s for s in schedule if s > k]
        if k in schedule and (more == 0 or (later and k + more >= later[0])):  # a look the budget's own last
            seen.append(k)  # one would follow before the next scheduled look is left to that last look
            weights.append(spend(k, k + more, sum(weights), final=more == 0 or k == MAX_REPEATS))
            if decided(k, len(seen), list(weights)):
                stopped = "every cell decided"
                break
        if k >= first and more == 0:
            stopped = "the budget"
            break
    if not seen or seen[-1] != k:  # a last look at what the budget left: it spends the rest
        seen.append(k)
        weights.append(spend(k, k, sum(weights), final=True))
        decided(k, len(seen), list(weights))
    return {"repeats": k, "looks": seen, "weights": weights, "walls_s": walls, "conditions": conds,
            "stopped": stopped, "budget_s": budget_s, "wall_s": clock() - t0}


def rows_by_cell(out: Path, repeats: int, n_slices: int) -> dict:
    """{cell key: {"A": [a figure per unit], "B": [...]}} over the ok cells both sides measured in every
    repeat (a plugin side's variants are matched by name).  The unit is the repeat; two plugin files
    measured together pair per visit of each repeat (``TOGETHER_VISITS``: A and B in the same fresh
    worker and the same round), which are as many more units."""
    from bench.model.row import IDENTITY, current_rows
    from bench.runs import store

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
        out_cells[key] = {"A": [v["A"][u] for u in paired], "B": [v["B"][u] for u in paired], "row": v["row"],
                          "repeat": [k for k, _ in paired]}
    return out_cells


VERDICTS = ("faster", "slower", "same", "undecided")


def _prefix(cell: dict, repeats: int) -> tuple[list, list]:
    """A cell's pairs from its first ``repeats`` repeats."""
    keep = [i for i, k in enumerate(cell.get("repeat") or range(len(cell["A"]))) if k < repeats]
    return [cell["A"][i] for i in keep], [cell["B"][i] for i in keep]


def analyse(cells: dict, margin: float, fdr: float, seen: list[int] | None = None,
            weights: list[float] | None = None) -> list[dict]:
    """Per cell: the repeats' medians of A and B, the paired ratio with its 95% interval, and the
    verdict: ``faster`` or ``slower`` beyond ``margin``, ``same`` (its interval inside the margin
    at the last look's level) or ``undecided``.  ``seen``: the repeat counts it was looked at, in
    order (None: one look at everything).  Look j tests the pairs of its first seen[j] repeats; a
    cell's p over the sequence is min_j p_j / w_j (Bonferroni over the looks), w_j the share of the
    rate look j spent (``weights``: ``spend``'s, or by default ``look_weight``'s), and
    Benjamini-Hochberg over the cells holds the false-discovery rate ``fdr`` across the cells and the
    sequence (a sequence that stopped at a look spent only the shares of the looks it made)."""
    from statistics import NormalDist, median

    from bench.measure.stats import benjamini_hochberg, paired_evidence

    keys = sorted(cells)
    sequence = bool(seen)  # looks of a sequence spend the rate by their weights, a stop at the first one too
    seen = list(seen) if seen else [max((max(c.get("repeat") or [0]) for c in cells.values()), default=0) + 1]
    if not sequence:
        weights = [1.0]
    elif weights is None:
        weights = [look_weight(j) for j in range(1, len(seen) + 1)]
    combined, evidence = [], []
    for key in keys:
        best = 1.0
        for r, w in zip(seen, weights):
            if w > 0:
                best = min(best, paired_evidence(*_prefix(cells[key], r), margin).p / w)
        combined.append(min(1.0, best))
        evidence.append(paired_evidence(cells[key]["A"], cells[key]["B"], margin))
    rejected, qvalues = benjamini_hochberg(combined, fdr)
    level = fdr * (weights[-1] or max(weights))  # the last look's share of the rate
    z = NormalDist().inv_cdf(1.0 - level / 2)
    out = []
    for key, e, p, rej, q in zip(keys, evidence, combined, rejected, qvalues):
        r = cells[key]["row"]
        logs = [math.log(b / a) for a, b in zip(cells[key]["A"], cells[key]["B"]) if a > 0 and b > 0]
        sd = _sd(logs)
        half = z * sd / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
        mean = sum(logs) / len(logs) if logs else math.nan
        inside = abs(mean) + half <= math.log1p(margin)
        verdict = ("slower" if e.p_slower <= e.p_faster else "faster") if rej else "same" if inside else "undecided"
        out.append({"variant": r["variant"], "dtype": r["dtype"], "mask": r["mask"], "direction": r["direction"],
                    "q_len": r["q_len"], "kv_len": r["kv_len"], "batch": r["batch"], "heads": r["heads"],
                    "head_dim": r["head_dim"], "a_ms": median(cells[key]["A"]), "b_ms": median(cells[key]["B"]),
                    "ratio": e.ratio, "ratio_lo": e.lo, "ratio_hi": e.hi, "p": p, "q": q, "repeats": e.repeats,
                    "sd": sd, "power_10pct": power(sd, len(logs), margin, level), "verdict": verdict})
    return out


def _sd(logs: list[float]) -> float:
    if len(logs) < 2:
        return math.nan
    mu = sum(logs) / len(logs)
    return math.sqrt(sum((x - mu) ** 2 for x in logs) / (len(logs) - 1))


def power(sd: float, pairs: int, margin: float, level: float, change: float = 0.10) -> float:
    """The chance that ``pairs`` pairs of this sd (of the log ratio per pair) call a true ``change``
    slower beyond ``margin`` at a two-sided ``level`` (normal approximation)."""
    from statistics import NormalDist

    if not (sd == sd and sd > 0 and pairs > 1):
        return math.nan
    n = NormalDist()
    effect = math.log1p(change) - math.log1p(margin)
    return n.cdf(effect / (sd / math.sqrt(pairs)) - n.inv_cdf(1.0 - level / 2))


def pairs_for(sd: float, margin: float, level: float, change: float = 0.10, want: float = 0.90) -> float:
    """How many pairs of this sd find a true ``change`` with probability ``want`` at ``level``."""
    from statistics import NormalDist

    n = NormalDist()
    effect = math.log1p(change) - math.log1p(margin)
    if not (sd == sd and effect > 0):
        return math.nan
    return ((n.inv_cdf(1.0 - level / 2) + n.inv_cdf(want)) * sd / effect) ** 2


def all_decided(table: list[dict], gate: float | None = None) -> bool:
    """Whether every cell is decided: faster, slower or same, or, under a gate, judged by it."""
    from bench.runs import judge

    def done(r):
        return r["verdict"] != "undecided" or (
            gate is not None and judge.gate_verdict(r["verdict"], r["ratio_lo"], r["ratio_hi"], gate) != "unjudged")
    return bool(table) and all(done(r) for r in table)


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
