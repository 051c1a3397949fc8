"""From what a caller asks to the Spec a sweep runs: one path for the command line and the
Python API (``bench.api``), so that a preset, a TOML config, the given settings and a resume
mean the same from both.

- A new sweep: the preset (``default``, or the one given) under the config file's settings,
  under the given ones.
- A resume: the run's own spec, saved in its env.json, is the base (a preset changed since
  does not change a resumed run); the given settings go over it, and the variants of plugin
  files named now for the first time are added to its variants.
"""

from __future__ import annotations

from pathlib import Path

from bench.errors import UsageError
from bench.model.registry import Registry, plugin_module
from bench.model.spec import Spec, spec_from_dict
from bench.model.specbuild import build_spec, load_config
from bench.runs import store


def sweep_spec(given: dict | None = None, resume: Path | str | None = None,
               config: str | None = None, here: bool = True) -> tuple[Spec, Registry, dict]:
    """(the Spec, the registry of its variants, the settings given, merged) for ``given`` (settings
    by name, parsed: ``bench.model.specbuild.parse_values``), over ``config`` (a TOML file) and, with
    ``resume``, over that run folder's saved spec.  ``here=False``: a spec to plan, not to run here
    (``sweep --dry-run``: its device need not be this machine's)."""
    from bench.engine.discovery import discover

    flags = dict(given or {})
    file = load_config(config) if config else {}
    plugins = list(dict.fromkeys([*file.get("plugins", []), *(flags.get("plugins") or [])]))
    merged = file | flags | {"plugins": plugins}
    base = None
    if resume is not None:
        base = saved_spec(resume)
        merged["plugins"] = list(dict.fromkeys([*base.plugins, *plugins]))
    registry = discover(merged["plugins"])
    if base is not None and merged.get("variants") is None:
        new_modules = {plugin_module(p) for p in plugins}  # a resumed run adds new plugins' variants
        added = [v.name for v in registry if v.module in new_modules]
        merged["variants"] = list(dict.fromkeys([*base.variants, *added]))
    return build_spec(merged, registry, base, here=here), registry, merged


def saved_spec(run_dir: Path | str) -> Spec:
    """The spec a run folder was measured with (its env.json's), for a resume."""
    folder = Path(run_dir)
    if not folder.is_dir():
        raise UsageError(f"--resume {run_dir}: no such run folder")
    saved = store.read_env(folder).get("spec")
    if saved is None:
        raise UsageError(f"--resume {run_dir}: not a run folder (no env.json with a spec)")
    return spec_from_dict(saved)
