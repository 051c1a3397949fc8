"""The contention feature: the load around each cell (contention.py, its step), what a variant leaves
running in the worker (leftovers.py), contended cases timed again in place (retime.py) and at the end of a
sweep (remeasure.py)."""
