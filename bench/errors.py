"""User errors: reported as one line, exit code 2, no traceback."""


class UsageError(Exception):
    """Bad input from the user; the message says what is wrong and what is valid."""


class RegistryError(Exception):
    """A problem with registering or discovering variants or masks (reported to users as exit 2)."""
