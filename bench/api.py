"""The Python API for scripts and notebooks: the same steps ``python -m bench sweep`` and
``python -m bench report`` take, without the command line.

    from bench.api import build_report, build_spec, discover, parse_values, run_sweep

Plugin files import ``bench.registry``, ``bench.masks`` and ``bench.case`` instead (see
variants/README.md); this module sits above everything, as the command line does.
"""

from bench.engine.discovery import discover
from bench.engine.sweep import RunSummary, SweepOptions, run_sweep
from bench.model.spec import Spec, build_spec, parse_values
from reports.build import build_report
from reports.frames import load_runs

__all__ = ["RunSummary", "Spec", "SweepOptions", "build_report", "build_spec", "discover", "load_runs", "parse_values",
           "run_sweep"]
