"""The one exception type that reaches the user as a single line on stderr."""


class FIError(Exception):
    """A user-facing error: bad input, missing model, impossible budget.

    The CLI prints ``error: <message>`` and exits with status 2; no traceback.
    """
