"""The plugin API's stable import path for a case's tensors (``bench.measure.inputs``): the
inputs the harness gives a variant (to warm or compile it in its factory), a small case to
probe with, and a paged cache read back (``gather_pages`` runs a factory for a contiguous cache
on the pages gathered first)."""

from bench.measure.inputs import from_pages, gather_pages, make_grad_out, make_inputs, probe_case

__all__ = ["from_pages", "gather_pages", "make_grad_out", "make_inputs", "probe_case"]
