"""The plugin API's stable import path for probing a library (``bench.measure.probe``):
``run_probe(factory, case)`` runs a tiny copy of the case and returns the library's refusal."""

from bench.measure.probe import run_probe

__all__ = ["run_probe"]
