"""A run folder, read and written: the one reader every command and report goes through.

``store`` is the folder's files (results.jsonl, env.json, masks.json, visits.jsonl's rows
folded in by ``visits``) and the rows as a reader sees them, with the figures their samples give
computed on read (``bench.measure.stats.row_figures``); ``judge`` decides what the rows say
(shaky, failed, trust, the verdicts of compare, ab and gpu-check); ``drift``, ``memmodel`` and
``maskfile`` read the calibration, the memory model and the masks a report draws.  It imports
the model and the measurements, never the engine that measures: the reports read a run folder
through it alone.
"""
