"""The profile: torch.profiler's categories of a cell's time in the worker (profiler.py) and the
profiled pass over a sweep's ok cells (profiled.py)."""
