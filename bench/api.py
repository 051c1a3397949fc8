"""The Python API for scripts and notebooks: the same steps ``python -m bench sweep`` and
``python -m bench report`` take, without the command line.

    from bench.api import build_report, build_spec, discover, parse_values, run_sweep

Plugin files import ``bench.registry``, ``bench.masks`` and ``bench.case`` instead (see
variants/README.md); this module sits above everything, as the command line does.
"""

import dataclasses
from pathlib import Path

from bench.engine import sweep as _sweep
from bench.engine.discovery import discover
from bench.engine.request import sweep_spec
from bench.engine.sweep import RunSummary, SweepOptions
from bench.model.spec import Spec
from bench.model.specbuild import build_spec, parse_values
from reports.build import build_report
from reports.frames import load_runs

__all__ = ["RunSummary", "Spec", "SweepOptions", "build_report", "build_spec", "discover", "load_runs", "parse_values",
           "run_sweep", "sweep_spec"]


def run_sweep(spec: Spec | None, run_dir, options: SweepOptions | None = None, *, resume: bool = False,
              given: dict | None = None) -> RunSummary:
    """Measure every cell of ``spec`` that ``run_dir`` lacks.  ``resume=True`` resumes the run
    folder as ``python -m bench sweep --resume RUN`` does (``bench.engine.request.sweep_spec``):
    its own saved spec under ``given`` (settings by name, parsed), the variants of new plugins
    added; ``spec`` is then None (or the spec that would come out, which is checked)."""
    options = options or SweepOptions()
    if resume:
        resumed, _, merged = sweep_spec(given, resume=Path(run_dir))
        if spec is not None and spec != resumed:
            raise ValueError("run_sweep(resume=True): give the settings to change in given=, not a spec (the run's "
                             "own spec is the base of a resume)")
        spec = resumed
        options = dataclasses.replace(options, resume=True, given=merged)
    return _sweep.run_sweep(spec, Path(run_dir), options)
