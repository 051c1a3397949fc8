"""Imported by the fork server alone (bench.engine.runner.FORKSERVER_PRELOAD), last: it imports the
built-in variants and collects and freezes the server's heap once, so that no worker forked from it
imports them again or scans that heap at its first collection; and its exit skips the
interpreter's teardown.  The server holds the sweep's stdout and stderr, and tearing down torch and
dynamo takes it about 1.5 s after the sweep has exited, during which whoever reads the sweep's output
through a pipe (a script, CI, subprocess.run with capture_output) waits for its end.  The workers it
forks never run this: a forked child leaves through os._exit after its target."""

import atexit
import os
import sys

SERVER_COMMAND = "from multiprocessing.forkserver import main"  # how multiprocessing starts its fork server


def _in_fork_server() -> bool:
    """The fork server runs ``python -c 'from multiprocessing.forkserver import main; main(...)'``;
    its command line says so (another ``python -c`` process, a test runner's worker say, that has
    imported multiprocessing.forkserver is not it)."""
    command = getattr(sys, "orig_argv", [])
    return sys.argv == ["-c"] and any(arg.startswith(SERVER_COMMAND) for arg in command)


def _leave() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(0)


def _prepare() -> None:
    import gc

    from bench.engine.discovery import discover

    try:
        discover([])  # the built-in variants; a worker discovers its plugins, and says what fails
    except Exception:  # noqa: BLE001
        pass
    gc.collect()
    gc.freeze()  # torch's, dynamo's and the variants' objects: shared with every worker, never scanned


if _in_fork_server():
    atexit.register(_leave)
    _prepare()
