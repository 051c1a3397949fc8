"""Shards, jobs and merge: a shard's share of a sweep's cells and its cluster jobs (jobs.py), and the
shards' run folders as one (merge.py)."""
