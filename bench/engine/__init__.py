"""The engine: cells in an isolated worker, the sweep, the run folder."""
