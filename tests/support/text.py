"""Reading the figures out of a message, so that a test asserts what a line says (its counts,
flags and names) and not how it is worded (tests/test_layout.py forbids an assertion on a whole
sentence of prose)."""

from __future__ import annotations

import re

NUMBER = r"[-+]?\d[\d,]*(?:\.\d+)?"


def numbers(text: str) -> list[float]:
    """Every number in ``text``, in order (``"2 of 4 ok cells (1 contended)"`` -> [2, 4, 1])."""
    return [float(n.replace(",", "")) for n in re.findall(NUMBER, text)]


def count(text: str, label: str) -> float | None:
    """The number written just before ``label`` (``count("6 ok cells, 1 noisy", "noisy") == 1``),
    or None where ``label`` follows no number."""
    m = re.search(rf"({NUMBER})\s+{re.escape(label)}", text)
    return float(m.group(1).replace(",", "")) if m else None


def value(text: str, label: str) -> float | None:
    """The number written just after ``label`` (``value("ok 2, error 1", "error") == 1``,
    ``value("B/A 1.2", "B/A") == 1.2``), or None."""
    m = re.search(rf"{re.escape(label)}\s*[:=]?\s*({NUMBER})", text)
    return float(m.group(1).replace(",", "")) if m else None
