"""The architecture, checked: the layers import downwards only, and nothing imports in a circle.

bench/model (what a case, mask, variant, spec, scope and row are) <- bench/measure (timing, memory,
FLOPs, the reference) and bench/scopes (what a cell times around a variant's call) <- bench/runs (a
run folder, read and written, and the verdicts on its rows) and variants (the
built-in implementations, written as any plugin is) <- bench/engine (discovery, cells, worker, sweep,
run folder) <- reports <- bench/cli and bench/api.
"""

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"bench.model": 0, "bench.measure": 1, "bench.scopes": 1, "bench.runs": 2, "variants": 2, "bench.engine": 3,
          "bench.features": 3, "reports": 4, "bench.cli": 5, "bench.api": 5}
PUBLIC_PATHS = {"bench.case", "bench.masks", "bench.registry", "bench.probe", "bench.inputs"}  # the plugin API


def _modules() -> dict[str, Path]:
    out = {}
    for top in ("bench", "reports", "variants"):
        for path in (ROOT / top).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..y import z
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i in _imports(p, m) if i in mods and i != m} for m, p in mods.items()}


def _layer(module: str) -> int | None:
    hits = [(len(k), v) for k, v in LAYERS.items() if module == k or module.startswith(k + ".")]
    return max(hits)[1] if hits else None


def test_the_core_never_imports_the_command_line_or_the_reports():
    face = ("bench.cli", "bench.__main__", "bench.api")  # the command line, `python -m bench`, the script API
    bad = [f"{m} imports {i}" for m, deps in _graph().items() if m.startswith("bench") and not m.startswith(face)
           for i in deps if i.startswith(("reports", "bench.cli"))]
    assert not bad, bad


def test_layers_import_downwards_only():
    bad = []
    for m, deps in _graph().items():
        mine = _layer(m)
        for i in deps:
            theirs = _layer(i)
            if mine is not None and theirs is not None and theirs > mine:
                bad.append(f"{m} (layer {mine}) imports {i} (layer {theirs})")
    assert not bad, bad


def test_no_import_cycle():
    graph = _graph()
    for public in PUBLIC_PATHS:  # a stable name is an alias of its module: follow it there
        graph[public] = graph.get(public, set())
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if d.startswith("bench.") and d.count(".") == 1 and d.rpartition(".")[2] in ("model", "measure", "engine"):
                continue  # a package's empty __init__ is not a dependency of its modules
            if state.get(d) == "open":
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]) if d in stack else f"{m} -> {d}")
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_the_scan_sees_local_imports():
    """The scan is not blind: a function-local import is found (the checks above rely on it)."""
    assert "bench.model.features" in _graph()["bench.engine.cell"]


def test_every_module_has_a_layer():
    """A new top-level module or package is placed in the table, not silently left unchecked."""
    outside = {"bench", "bench.errors", "bench.__main__"} | PUBLIC_PATHS  # shared base, entry, aliases
    unplaced = sorted(m for m in _modules() if _layer(m) is None and m not in outside)
    assert not unplaced, unplaced


def test_the_variants_are_scanned_and_sit_below_the_engine():
    graph = _graph()
    assert "bench.registry" in graph["variants.naive"]
    assert "variants" in graph["bench.engine.discovery"]  # the engine finds them: a downward arrow
    assert not any(d.startswith("bench.engine") for d in graph["variants.flex"])


def test_the_old_discover_path_says_where_it_went():
    import pytest

    from bench.model import registry

    with pytest.raises(AttributeError, match="from bench.api import discover"):
        registry.discover  # noqa: B018


def test_the_built_in_variants_import_only_what_a_plugin_may():
    """A variant file is the example people copy: it reaches the harness through the plugin
    facades alone, never into its internals."""
    graph = _graph()
    for name in (m for m in _modules() if m.startswith("variants.")):
        inside = sorted(d for d in graph[name] if d.startswith("bench") and d not in PUBLIC_PATHS
                        and d not in {"bench"})
        assert not inside, (name, inside)


def test_each_facade_says_what_it_exports():
    import importlib

    for name in PUBLIC_PATHS:
        module = importlib.import_module(name)
        assert module.__all__ and all(hasattr(module, n) for n in module.__all__), name
        assert module.__name__ == name  # a module of its own, not an alias of an internal one


# -- the engine returns events, the command line prints (bench.engine.events) ----------------------------------

def _prints(path: Path, root: Path = ROOT) -> list[str]:
    """Where a module writes for a person: print(), sys.stdout/sys.stderr .write, a tqdm bar."""
    found, where = [], path.relative_to(root)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                found.append(f"{where}:{node.lineno} print()")
            elif (isinstance(f, ast.Attribute) and f.attr == "write" and isinstance(f.value, ast.Attribute)
                  and f.value.attr in ("stdout", "stderr")):
                found.append(f"{where}:{node.lineno} sys.{f.value.attr}.write")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any(n == "tqdm" or n.startswith("tqdm.") for n in names):
                found.append(f"{where}:{node.lineno} imports tqdm")
    return found


def test_nothing_below_the_command_line_prints():
    """bench/cli is the one part of bench that prints; the engine logs and hands progress to the
    caller's bars. (bench/features/ab.py's server speaks its JSON protocol on a stream it names.)"""
    bad = [hit for path in sorted((ROOT / "bench").rglob("*.py")) if "cli" not in path.relative_to(ROOT).parts[:2]
           for hit in _prints(path)]
    assert not bad, bad


def test_the_print_scan_is_not_blind(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import sys\nfrom tqdm import tqdm\n\ndef f():\n    print('x')\n    sys.stderr.write('y')\n")
    assert len(_prints(sample, tmp_path)) == 3


# -- what the harness knows of a variant is declared on the variant (bench.model.registry.Traits) --------------

def _builtin_names() -> tuple[set[str], set[str]]:
    """The built-in variants' names, and the names that are also a library one of them requires."""
    from bench.api import discover

    registry = discover()
    names = set(registry.names())
    libraries = {lib for n in names for lib in registry[n].requires}
    return names, libraries


def _named(path: Path, names: set[str], root: Path = ROOT) -> list[str]:
    """Every string literal in ``path`` that is one of ``names`` (docstrings and prose are longer)."""
    return [f"{path.relative_to(root)}:{node.lineno} {node.value!r}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_the_harness_names_no_built_in_variant():
    """A built-in variant is one file: the plan, the judge, the charts, selfcheck and gpu-check read
    what they need from its declaration. A name that is also a library's (xformers' version in the
    fingerprint) or a kernel family's (bench.features.gpu_state.kernels: the kernels that ran) is that, not the
    variant."""
    from bench.features.gpu_state.kernels import PATTERNS

    names, libraries = _builtin_names()
    exempt = libraries | {family for family, _ in PATTERNS}
    bad = [hit for top in ("bench", "reports") for path in sorted((ROOT / top).rglob("*.py"))
           for hit in _named(path, names - exempt)]
    assert not bad, bad


def test_the_name_scan_is_not_blind(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""naive is mentioned in prose."""\nRATES = {"naive": 0.4, "mine": 1}\n')
    assert _named(sample, {"naive"}, tmp_path) == ["sample.py:2 'naive'"]


def test_no_test_module_imports_another():
    """What tests share lives in tests/conftest.py or tests/support/, so that a test module can move
    or go without breaking another."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name in _imports(path, "tests." + path.stem):
            if name.startswith("tests.") and name.rpartition(".")[2].startswith("test_") or \
                    name.startswith("tests.test_"):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, bad


def test_the_reports_read_a_run_folder_through_bench_runs_not_the_engine():
    bad = [f"{m} imports {i}" for m, deps in _graph().items() if m.startswith("reports")
           for i in deps if i.startswith("bench.engine")]
    assert not bad, bad


def test_a_rows_rates_are_computed_in_one_place():
    """bench.measure.stats.rates, called by row_figures alone: the worker sends measurements, and
    every reader (the sweep's own rows included, bench.runs.store.measured) gets them from there."""
    callers = sorted(str(p.relative_to(ROOT)) for m, p in _modules().items()
                     if re.search(r"\brates\(", p.read_text()) and m != "bench.measure.stats")
    assert not callers, callers


def test_the_tests_mirror_the_layers():
    """A test module sits in the folder of the layer it tests (tests/model, tests/measure, ...), or at
    the top for the whole project's checks; the benchmarks apart."""
    folders = {"model", "measure", "scopes", "runs", "variants", "engine", "features", "reports", "cli", "benchmarks"}
    assert {k.split(".")[-1] for k in LAYERS} - {"api"} <= folders
    bad = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
           if p.parent != ROOT / "tests" and p.relative_to(ROOT / "tests").parts[0] not in folders]
    assert not bad, bad
    assert all((ROOT / "tests" / f / "__init__.py").exists() for f in folders - {"benchmarks"})


def test_no_test_imports_a_private_name_but_the_unit_test_of_its_module():
    """A test that reaches into a module's private names freezes its design: only that module's
    own unit test (tests/.../test_<module>.py) may."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("bench", "reports"):
                own = path.stem == "test_" + node.module.rpartition(".")[2]
                bad += [f"{path.relative_to(ROOT)}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__") and not own]
    assert not bad, bad


def test_the_command_line_decides_no_verdict():
    """Judging has one home below the reports (bench.runs.judge, gpu-check's in its acceptance
    module): no subcommand defines a verdict of its own."""
    cli = sorted((ROOT / "bench" / "cli").glob("*.py"))
    bad = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name}" for path in cli
           for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, ast.FunctionDef) and node.name.rstrip("_").endswith("verdict")]
    assert not bad, bad


def test_gpu_checks_thresholds_are_rows_of_the_judges_table():
    from bench.runs.judge.acceptance import ACCEPTANCE, threshold

    assert threshold("timer agreement", "cuda") == 0.03 and threshold("timer agreement", "cpu") == 0.25
    assert threshold("peak share", "cuda") == threshold("peak share", "cpu")  # one row for any device
    assert all(t.why for t in ACCEPTANCE)


def _starts_a_sweep(source: str) -> bool:
    return bool(re.search(r"run_cli\(\s*[\"']sweep[\"']", source))


def test_a_test_that_starts_a_sweep_in_a_subprocess_is_marked_slow():
    """The quick loop (``-m "not slow"``) holds no test that starts a sweep in a subprocess, itself or
    through a fixture: pyproject's marker says what slow means, and this keeps the loop to it."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        sweeping = {n.name for n in functions if not n.name.startswith("test_")
                    and _starts_a_sweep(ast.get_source_segment(text, n) or "")}
        for node in functions:
            if not node.name.startswith("test_"):
                continue
            slow = any("slow" in ast.unparse(d) for d in node.decorator_list)
            uses = _starts_a_sweep(ast.get_source_segment(text, node) or "") or \
                any(a.arg in sweeping for a in node.args.args)
            if uses and not slow:
                bad.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not bad, bad


def test_every_setting_row_group_and_cell_step_has_one_owner_and_every_named_module_exists():
    """bench/model/features.py: the core or exactly one feature owns each setting of the spec, each
    group of the stored row and each step of a timed cell's life; a feature's step, section,
    command and modules exist."""
    from bench.model.features import CORE, FEATURES, owner_of
    from bench.model.row import GROUPS
    from bench.model.spec import SETTINGS

    for kind, names in (("settings", SETTINGS), ("groups", GROUPS)):
        owners = {name: owner_of(kind, name) for name in names}
        assert {n: o for n, o in owners.items() if len(o) != 1} == {}, kind
        declared = {n for f in (CORE, *FEATURES) for n in getattr(f, kind)}
        assert declared <= set(names), f"{kind} declared by a feature but not in the harness: {declared - set(names)}"
    for f in (CORE, *FEATURES):
        for path in f.modules:
            assert (ROOT / path).is_file(), (f.name, path)


def _declared_hooks(kind: str, cls) -> dict:
    """``"module:NAME"`` -> the features declaring it among their ``kind``; each must be a ``cls`` in
    one of the declaring feature's modules."""
    from bench.model.features import CORE, FEATURES

    declared = {}
    for f in (CORE, *FEATURES):
        for ref in getattr(f, kind):
            module, _, name = ref.partition(":")
            assert module.replace(".", "/") + ".py" in f.modules, (f.name, ref)
            assert isinstance(getattr(importlib.import_module(module), name), cls), ref
            declared.setdefault(ref, []).append(f.name)
    return declared


def _defined(cls_name: str) -> set:
    """Every module-level ``NAME = cls_name(...)`` in bench/, as ``"module:NAME"``."""
    defined = set()
    for path in sorted((ROOT / "bench").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == cls_name:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {f"{module}:{t.id}" for t in targets}
    return defined


def test_the_cell_and_the_sweep_run_exactly_the_declared_steps_kept_objects_preps_and_passes():
    """Every module-level Step (a cell's life), Keep (a worker's, across its cells), Prep (a sweep's
    preparation) and Pass (a sweep's, after its first) in bench/ is declared by the core or one
    feature, once, and sits in one of that feature's modules; the cell runs the declared steps, the
    worker makes the declared kept objects, the preparation and the sweep run the declared preps
    and passes, each with a name of its own (and all but a kept object an order of its own: none
    left to the declarations' order)."""
    from bench.engine.cell import after_timing, worker_keeps
    from bench.engine.passes import Pass, sweep_passes
    from bench.engine.prepare import Prep, preps
    from bench.measure.cellsteps import Keep, Step

    for kind, cls, run in (("steps", Step, after_timing), ("kept", Keep, worker_keeps), ("preps", Prep, preps),
                           ("passes", Pass, sweep_passes)):
        declared = _declared_hooks(kind, cls)
        assert {r: o for r, o in declared.items() if len(o) != 1} == {}, kind
        assert _defined(cls.__name__) == set(declared), kind
        hooks = run()
        assert len({h.name for h in hooks}) == len(hooks) == len(declared), kind
        if cls is not Keep:
            assert len({h.order for h in hooks}) == len(hooks), kind


def test_the_core_reaches_a_feature_only_through_its_declaration():
    """bench/features/ holds the secondary features, one home each (a module, or a folder of them),
    every module there declared by one feature; no module of bench/ or reports/ imports one but
    another feature's module or a feature's own command or report section: the core finds their
    steps, kept objects, preps and passes by the names bench/model/features.py declares."""
    from bench.model.features import FEATURES

    def dotted(path: str) -> str:
        return path.removesuffix(".py").replace("/", ".")

    owned = {dotted(m) for f in FEATURES for m in f.modules} | {c for f in FEATURES for c in f.commands} | \
        {f.section for f in FEATURES if f.section}
    home = {m for m in _modules() if m.startswith("bench.features.") and not _modules()[m].name == "__init__.py"}
    assert home and home <= owned, sorted(home - owned)
    bad = [f"{m} imports {i}" for m, deps in _graph().items() if not m.startswith("bench.features") and m not in owned
           for i in deps if i.startswith("bench.features.")]
    assert not bad, bad


def test_no_module_of_the_engine_or_the_measurement_imports_a_feature():
    """bench/engine/ and bench/measure/ sit below bench/features/: none of their modules imports one, not
    even a module a feature declares as its own there (a later visit asks the core's load verdict)."""
    bad = [f"{m} imports {i}" for m, deps in _graph().items() if m.startswith(("bench.engine", "bench.measure"))
           for i in deps if i == "bench.features" or i.startswith("bench.features.")]
    assert not bad, bad


def test_every_subcommand_and_report_section_is_a_declared_feature_s():
    """The parser's subcommands are the declared commands, each once; every bench/cli module with
    an ``add_parser`` is one of them; every reports module with ``sections`` is a declared section
    and every declared section has it (reports.sections's protocol), so none is built unrendered."""
    import importlib

    from bench.cli import subcommands
    from bench.model.features import CORE, FEATURES

    declared = [m for f in (CORE, *FEATURES) for m in f.commands]
    assert len(declared) == len(set(declared))
    assert [m.__name__ for m in subcommands()] == declared
    cli = {f"bench.cli.{p.stem}" for p in (ROOT / "bench" / "cli").glob("*.py")
           if "def add_parser(" in p.read_text(encoding="utf-8")}
    assert cli == set(declared)
    sections = [f.section for f in FEATURES if f.section]
    assert len(sections) == len(set(sections))
    for name in sections:
        assert callable(getattr(importlib.import_module(name), "sections", None)), name
    having = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".") for p in (ROOT / "reports").rglob("*.py")
              if "\ndef sections(" in p.read_text(encoding="utf-8")}
    assert having == set(sections)


def test_a_file_name_repeated_across_layers_names_one_thing():
    """A module's name means one thing: where the same file name sits in two folders of bench/ and
    reports/, the files are one feature's parts in two layers (bench/model/features.py names both:
    its modules, commands or section) or a plugin API path and the module it re-exports."""
    from collections import defaultdict

    from bench.model.features import CORE, FEATURES

    def path_of(module: str) -> str:
        return module.replace(".", "/") + ".py"

    owner = {}
    for f in (CORE, *FEATURES):
        for path in (*f.modules, *map(path_of, f.commands), *([path_of(f.section)] if f.section else [])):
            owner[path] = f.name
    by_name = defaultdict(list)
    for path in sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "reports").rglob("*.py")]):
        if path.name != "__init__.py":
            by_name[path.name].append(path.relative_to(ROOT).as_posix())
    bad = []
    for paths in by_name.values():
        if len(paths) < 2:
            continue
        shims = {p for p in paths if p.count("/") == 1 and p.startswith("bench/")
                 and any(f"from {q[:-3].replace('/', '.')} import" in (ROOT / p).read_text(encoding="utf-8")
                         for q in paths if q != p)}
        rest = [p for p in paths if p not in shims]
        if len({owner.get(p) for p in rest}) != 1 or None in {owner.get(p) for p in rest}:
            bad.append({p: owner.get(p) for p in rest})
    assert not bad, f"one file name for different things (or for a part no feature declares): {bad}"


PROSE_WORD = re.compile(r"^[A-Za-z][a-z']+[,.:;)]?$")
MAX_PROSE_WORDS = 5  # a phrase ("report could not be built") names what a line says; a sentence words it


def test_no_assertion_compares_a_sentence_of_prose():
    """An assertion holds a message to its figures, flags and names (tests/support/text.py reads
    them out), never to its wording: no string in an ``assert`` of the tests has more than
    MAX_PROSE_WORDS words of prose, so a message reworded moves no test."""
    import ast

    def prose(text: str) -> int:
        return sum(bool(PROSE_WORD.match(w)) for w in text.split())

    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Assert):
                continue
            for sub in ast.walk(node.test):
                if isinstance(sub, ast.JoinedStr):
                    text = " ".join(v.value if isinstance(v, ast.Constant) else "X" for v in sub.values)
                elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    text = sub.value
                else:
                    continue
                if prose(text) > MAX_PROSE_WORDS:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text[:60]}")
    assert not bad, bad
