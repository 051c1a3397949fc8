"""The cost model: each case's cost and the projection of a sweep's wall time, learnt from the machine's
history (plan.py), and the cases a compiled variant set up here (compiled.py)."""
