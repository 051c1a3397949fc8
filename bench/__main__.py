import atexit
import os
import sys

from bench.cli import main

try:
    code = main()
    sys.stdout.flush()
except BrokenPipeError:  # the reader went away (python -m bench list | head): what it read stays, no traceback
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    code = 0
# Every file of the run folder is closed by now. What is left is the interpreter's teardown of torch's
# modules, which takes a noticeable part of a short command: run the exit handlers (the workers' and
# multiprocessing's), flush, and leave.
atexit._run_exitfuncs()
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BrokenPipeError:
    pass
os._exit(code if isinstance(code, int) else 1)
