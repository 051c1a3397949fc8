"""Processes still running, found by what their environment holds (/proc/<pid>/environ)."""

import os
from pathlib import Path


def processes_with(text: str) -> list[int]:
    """The pids (this process aside) whose environment contains ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if text.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found
