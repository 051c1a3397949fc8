"""The command line: ``python -m bench {list,sweep,report,compare,ab,frontier,merge,status,profile,selfcheck,
export,gpu-check}``.

One module per subcommand, each with ``add_parser(sub)`` and the handler it sets; the core and
each feature declare theirs (bench.model.features), and the parser takes them in that order.  This
package is the only part of ``bench`` that prints for the user, builds reports and turns
errors into exit codes; the engine underneath takes and returns plain values."""

from __future__ import annotations

import os
import sys
from importlib import import_module

from bench.cli.common import Parser, listen
from bench.errors import UsageError
from bench.model import features
from bench.model.case import CaseError
from bench.model.registry import RegistryError


def subcommands() -> list:
    """The modules of the core's commands, then each feature's (bench.model.features), in their
    declared order."""
    return [import_module(name) for f in (features.CORE, *features.FEATURES) for name in f.commands]


def build_parser() -> Parser:
    p = Parser(prog="python -m bench", description="Benchmark and profile attention variants.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in subcommands():
        module.add_parser(sub)
    return p


def main(argv=None) -> int:
    # GPU numbers as nvidia-smi gives them, here as in every worker (set before CUDA starts)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    listen()  # the engine logs its notes and warnings; here they are printed
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except (UsageError, RegistryError, CaseError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
