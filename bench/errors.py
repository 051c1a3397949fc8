"""User errors (reported as one line, exit code 2, no traceback), and how any error is said in one line."""


class UsageError(Exception):
    """Bad input from the user; the message says what is wrong and what is valid."""


class RegistryError(Exception):
    """A problem with registering or discovering variants or masks (reported to users as exit 2)."""


def first_line(exc: BaseException) -> str:
    """An exception's message in one line: its first, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
