import atexit
import os
import sys

from bench.cli import main

code = main()
# Every file of the run folder is closed by now. What is left is the interpreter's teardown of torch's
# modules, which takes a noticeable part of a short command: run the exit handlers (the workers' and
# multiprocessing's), flush, and leave.
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code if isinstance(code, int) else 1)
