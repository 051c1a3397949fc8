"""What the subcommands share: the parser that turns bad input into one line and exit 2,
the setting flags (made from ``bench.model.spec``'s declarations), and the cases of the
single-case commands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from bench.errors import UsageError
from bench.model.spec import SETTINGS, flag
from bench.model.specbuild import build_spec, default_device, parse_values


class Terminal(logging.Handler):
    """Prints what the engine logs (``bench.engine.events``) on stderr, one line each: a note as it
    reads, a warning after ``warning:``. The stream is looked up at each line, so a caller that
    swaps sys.stderr (a test) sees what follows."""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.levelno >= logging.WARNING and not text.startswith("warning:"):
            text = f"warning: {text}"
        print(text, file=sys.stderr, flush=True)


def listen() -> None:
    """The engine's notes and warnings printed on stderr (once per process, however often main runs)."""
    from bench.engine.events import ROOT

    log = logging.getLogger(ROOT)
    if not any(isinstance(h, Terminal) for h in log.handlers):
        log.addHandler(Terminal())
    log.setLevel(logging.INFO)


class _Bar:
    """A tqdm bar behind the engine's Progress protocol."""

    def __init__(self, total: int, unit: str, desc: str):
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit=unit, desc=desc or None, dynamic_ncols=True, file=sys.stderr)

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def describe(self, text: str) -> None:
        self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        self._bar.close()


def bars(total: int = 0, unit: str = "", desc: str = "") -> _Bar:
    """The engine's progress drawn as tqdm bars on stderr."""
    return _Bar(total, unit, desc)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def add_setting_flags(p: argparse.ArgumentParser, case_only: bool = False, skip: tuple = ()) -> None:
    """A flag for every sweep setting (``case_only``: those of a single case), each with the
    help its declaration gives; ``--plugin`` is repeatable."""
    for name, s in SETTINGS.items():
        if name in skip or (case_only and not s.case and name != "plugins"):
            continue
        if name == "plugins":
            p.add_argument("--plugin", action="append", default=[], metavar="PATH",
                           help="a Python file with more variants (repeatable)")
        elif s.switch:  # a yes/no setting: the flag alone says yes (TOML takes true or false)
            p.add_argument(flag(name), dest=name, action="store_const", const=True, default=None, help=s.help)
        else:
            p.add_argument(flag(name), dest=name, metavar=s.metavar, help=s.help)


def given_settings(args) -> dict:
    """The settings given as flags, parsed (a flag not given is absent)."""
    raw = {name: getattr(args, name, None) for name in SETTINGS if name != "plugins"}
    values = parse_values(raw)
    if getattr(args, "plugin", None):
        values["plugins"] = parse_values({"plugins": list(args.plugin)})["plugins"]
    return values


def case_spec(args, defaults: dict, variants: list[str] | None = None):
    """The registry and the Spec of a single-case command (profile, selfcheck): its flags
    over ``defaults`` (raw values, as flags would give them)."""
    from bench.engine.discovery import discover

    given = given_settings(args)
    if variants is not None:
        given["variants"] = parse_values({"variants": variants})["variants"]
    device = given.get("device") or default_device()
    replaced = ("seq_lens", "batch", "kv_lens") if "batch_mix" in given else ()  # a mix is its own lengths and batch
    given = parse_values({k: v for k, v in defaults.items() if k not in given and k not in replaced}) | given
    given.setdefault("dtypes", ["float32" if device == "cpu" else "bfloat16"])
    registry = discover(given.get("plugins") or [])
    return registry, build_spec(given | {"device": device}, registry)


def yn(b) -> str:
    return "yes" if b else "-"


def process_started() -> float:
    """When this process started, on ``time.perf_counter``'s clock (Linux: from /proc, so the
    interpreter's own start-up and imports count; elsewhere: now)."""
    now = time.perf_counter()
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, in clock ticks
    except (OSError, ValueError, IndexError):
        return now
    return now - min(max(age, 0.0), 3600.0)
