"""Numbers as users type them: ASCII digits only.  Python's ``str.isdigit`` takes superscripts
(``²``), which ``int`` then refuses with a traceback, and ``int``/``float`` take fullwidth and
other scripts' digits (``６４``) silently; every parser of a flag, a TOML value or a spelling asks
these instead."""

from __future__ import annotations

import re

_INT = re.compile(r"[+-]?[0-9]+")
_DIGITS = re.compile(r"[0-9]+")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|nan|infinity)", re.I)
ASCII = "ASCII digits 0-9"


def is_int(text) -> bool:
    """A whole number written in ASCII digits, with an optional sign: '12', '-3', '+4'."""
    return isinstance(text, str) and _INT.fullmatch(text.strip()) is not None


def is_digits(text) -> bool:
    """ASCII digits alone: '12' (no sign, no space)."""
    return isinstance(text, str) and _DIGITS.fullmatch(text) is not None


def is_number(text) -> bool:
    """A number in ASCII: '1.5', '2e-3', '.5', 'inf' (ranges refuse what they do not take)."""
    return isinstance(text, str) and _NUMBER.fullmatch(text.strip()) is not None
