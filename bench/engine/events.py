"""What the engine has to say while it works, handed to whoever called it: the engine never prints.

Two kinds of event leave the engine:

- notes and warnings, as records of the standard ``logging`` module under the ``bench`` logger
  (``log = logging.getLogger(__name__)``). The command line installs the handler that prints them
  (``bench.cli.common.Terminal``); a script that installs none sees warnings on stderr through
  logging's last-resort handler and no notes.
- progress, through a ``Progress`` the caller's factory makes (``bars(total, unit, desc)``). The
  default factory, ``silent``, makes one that does nothing; the command line gives tqdm's bars.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

ROOT = "bench"


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...

    def describe(self, text: str) -> None: ...

    def close(self) -> None: ...


Bars = Callable[..., Progress]


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def silent(total: int = 0, unit: str = "", desc: str = "") -> Progress:
    """A progress that nobody watches: the engine's default."""
    return _Silent()
