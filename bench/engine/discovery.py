"""Finding the variants: the built-in ``variants`` package, ``--plugin`` files and installed
entry points, gathered into one ``Registry``.

This sits above ``variants`` (it imports that package) and below everything that runs a sweep;
the model's ``registry`` only defines what a variant is.  Scripts import it as
``from bench.api import discover``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import pkgutil
import sys
import types
from collections.abc import Iterable
from pathlib import Path

from bench.errors import RegistryError
from bench.model.registry import ENTRY_POINT_GROUP, Registry, module_variants, plugin_module


def _load_plugin(path: str):
    p = Path(path).expanduser().resolve()
    if not p.exists():
        raise RegistryError(f"--plugin {path}: no such file ({p}); give the path to a .py file (a plugin moved "
                            f"since the run began is given again with --plugin NEW_PATH)")
    if not p.is_file() or p.suffix != ".py":
        raise RegistryError(f"--plugin {path}: not a Python file (expected a path to a .py file)")
    modname = plugin_module(path)
    if modname in sys.modules:
        return modname
    spec = importlib.util.spec_from_file_location(modname, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except RegistryError:
        del sys.modules[modname]
        raise
    except SystemExit as exc:
        del sys.modules[modname]
        raise RegistryError(f"--plugin {path}: called sys.exit({exc.code!r}) while being imported; a plugin "
                            f"file defines variants and must not exit") from None
    except Exception as exc:
        del sys.modules[modname]
        raise RegistryError(f"--plugin {path}: import failed: {type(exc).__name__}: {exc}") from exc
    return modname


def _builtin_modules() -> list[str]:
    import variants

    names = []
    for info in sorted(pkgutil.iter_modules(variants.__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            modname = f"variants.{info.name}"
            importlib.import_module(modname)
            names.append(modname)
    return names


def _entry_point_modules() -> list[str]:
    names = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:
            raise RegistryError(f"entry point {ep.name!r} ({ep.value}) failed to load: "
                                f"{type(exc).__name__}: {exc}") from exc
        names.append(obj.__name__ if isinstance(obj, types.ModuleType) else obj.__module__)
    return names


def discover(plugins: Iterable[str] = (), entry_points: bool = True) -> Registry:
    """Built-in variants, then ``--plugin`` files, then installed entry points."""
    modules = _builtin_modules()
    modules += [_load_plugin(p) for p in plugins]
    if entry_points:
        modules += _entry_point_modules()
    reg = Registry()
    seen = set()
    for m in modules:
        if m in seen:
            continue
        seen.add(m)
        for v in module_variants(sys.modules.get(m)):
            reg.add(v)
    return reg
