"""The code's shape, for a before/after of a redesign: lines per folder, modules, the row's
columns (declared, stored at a record's top level, and on the quick preset's widest record),
the ten largest functions, the READMEs' lines, and where the core imports a feature's module
directly rather than through its declaration (bench/model/features.py).

    python tests/benchmarks/layout_metrics.py [CHECKOUT] [--run RUN_FOLDER]

CHECKOUT defaults to this one; give another (a ``git worktree`` of an older commit) to compare.
``--run`` reads the widest line of a run folder's results.jsonl (``python -m bench sweep --preset
quick --device cpu --out RUN``)."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

FOLDERS = ("bench/model", "bench/measure", "bench/engine", "bench/features", "bench/cli", "bench", "reports",
           "variants", "tests")


def _py(root: Path, folder: str, deep: bool) -> list[Path]:
    base = root / folder
    files = base.rglob("*.py") if deep else base.glob("*.py")
    return [p for p in files if "__pycache__" not in p.parts]


def lines_per_folder(root: Path) -> dict:
    out = {}
    for folder in FOLDERS:
        deep = folder not in ("bench",)  # bench/ itself: its top-level modules only (the layers are listed apart)
        files = _py(root, folder, deep)
        out[folder] = (len(files), sum(len(p.read_text().splitlines()) for p in files))
    return out


def largest_functions(root: Path, n: int = 10) -> list[tuple[int, str]]:
    sizes = []
    for top in ("bench", "reports", "variants"):
        for path in _py(root, top, True):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    sizes.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(root)}:{node.name}"))
    return sorted(sizes, reverse=True)[:n]


def row_columns(root: Path) -> str:
    code = ("from bench.model import row\n"
            "stored = getattr(row, 'STORED', None)\n"
            "groups = getattr(row, 'GROUPS', {})\n"
            "top = len(stored) + len(groups) + 1 if stored is not None else len(row.COLUMNS) + 1\n"
            "print(len(row.COLUMNS), top)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    declared, top = out.stdout.split()
    return f"{declared} declared; at most {top} at a record's top level (the groups and extra counted as one each)"


def core_to_feature_imports(root: Path, every: bool = False) -> str:
    """The imports (local ones counted) from the core's declared modules and commands into a
    feature's modules, commands or section, each (importer, imported) pair once; with ``every``,
    from every module of bench/ and reports/ that no feature declares (the plugin paths, the
    parsers, the run folder...: the core as a whole, not only its declared spine)."""
    importers = ("[p[:-3].replace('/', '.') for p in CORE.modules] + list(commands(CORE))" if not every else
                 "['.'.join(p.with_suffix('').parts).removesuffix('.__init__') for top in ('bench', 'reports')\n"
                 "     for p in sorted(pathlib.Path(top).rglob('*.py'))\n"
                 "     if '.'.join(p.with_suffix('').parts).removesuffix('.__init__') not in owner]")
    code = ("import ast, json, pathlib\n"
            "from bench.model.features import CORE, FEATURES\n"
            "def path(m): return m if m.endswith('.py') else m.replace('.', '/') + '.py'\n"
            "def commands(f):  # an older declaration named one command, as its bench/cli module\n"
            "    old = getattr(f, 'command', None)\n"
            "    return getattr(f, 'commands', None) or (('bench.cli.' + old,) if old else ())\n"
            "owner = {p[:-3].replace('/', '.'): f.name for f in FEATURES\n"
            "         for p in (*f.modules, *map(path, commands(f)), *([path(f.section)] if f.section else []))}\n"
            "pairs = set()\n"
            f"for m in {importers}:\n"
            "    file = pathlib.Path(path(m))\n"
            "    file = file if file.is_file() else file.with_suffix('') / '__init__.py'\n"
            "    for node in ast.walk(ast.parse(file.read_text())):\n"
            "        if isinstance(node, ast.ImportFrom) and node.module:\n"
            "            names = [node.module] + [node.module + '.' + a.name for a in node.names]\n"
            "        elif isinstance(node, ast.Import):\n"
            "            names = [a.name for a in node.names]\n"
            "        else:\n"
            "            continue\n"
            "        pairs |= {(m, n) for n in names if n in owner}\n"
            "print(json.dumps(sorted(pairs)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    if out.returncode:
        return "- (no bench/model/features.py here)"
    pairs = json.loads(out.stdout)
    importers = sorted({a for a, _ in pairs})
    modules = sorted({a for a, _ in pairs})
    return f"{len(pairs)} (from {len(modules)} modules: {', '.join(modules)})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[2]))
    ap.add_argument("--run", help="a run folder: its widest results.jsonl line's top-level keys")
    args = ap.parse_args(argv)
    root = Path(args.root)
    print(f"checkout: {root}")
    total_files = total_lines = 0
    for folder, (files, lines) in lines_per_folder(root).items():
        print(f"  {folder:<14} {files:>4} modules {lines:>7} lines")
        if folder != "tests":
            total_files += files
            total_lines += lines
    print(f"  {'all but tests':<14} {total_files:>4} modules {total_lines:>7} lines")
    print(f"row columns: {row_columns(root)}")
    if args.run:
        widest = max(len(json.loads(x)) for x in (Path(args.run) / "results.jsonl").read_text().splitlines() if x)
        print(f"  the widest line of {args.run}/results.jsonl: {widest} top-level keys")
    print(f"core imports of a feature's module: {core_to_feature_imports(root)}")
    print(f"  and from every module no feature declares: {core_to_feature_imports(root, every=True)}")
    print("ten largest functions (lines):")
    for size, name in largest_functions(root):
        print(f"  {size:>4}  {name}")
    for readme in ("README.md", "bench/README.md", "bench/measure/README.md", "reports/README.md",
                   "variants/README.md"):
        p = root / readme
        print(f"{readme}: {len(p.read_text().splitlines()) if p.exists() else '-'} lines")


if __name__ == "__main__":
    main()
