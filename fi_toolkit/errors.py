"""The one exception type that reaches the user as a single line on stderr."""

from __future__ import annotations

import re
from collections.abc import Mapping


class FIError(Exception):
    """A user-facing error: bad input, missing model, impossible budget.

    The CLI prints ``error: <message>`` and exits with status 2; no traceback.

    A library message names the parameter a Python caller passed (``samples must be at most 10,000``),
    never a command-line flag; ``parameter`` says which words of the message are parameters, so the
    CLI can name its flag instead (:meth:`naming`): a name (``"samples"``), several names, or a mapping
    ``{spelling in the message: parameter name}`` where the message spells the parameter otherwise.
    """

    def __init__(self, message: str = "", parameter: str | tuple[str, ...] | Mapping[str, str] | None = None):
        super().__init__(message)
        if parameter is None:
            parameter = {}
        elif isinstance(parameter, str):
            parameter = {parameter: parameter}
        elif not isinstance(parameter, Mapping):
            parameter = {p: p for p in parameter}
        self.parameters: dict[str, str] = dict(parameter)  # spelling in the message -> parameter name

    @property
    def parameter(self) -> str | None:
        """The (first) parameter the message is about, or None."""
        return next(iter(self.parameters.values()), None)

    def naming(self, flag_of) -> str:
        """The message with each parameter spelled as ``flag_of(name)`` (a mapping or a callable; None:
        leave that parameter's spelling). Only whole words outside quotes and spec syntax change:
        ``top_k`` in ``'top_k'``, ``infokv:top_k=8`` or ``top_k:`` (prose: ``cannot resume:``) stays."""
        lookup = flag_of.get if isinstance(flag_of, Mapping) else flag_of
        message = str(self)
        for spelling in sorted(self.parameters, key=len, reverse=True):
            flag = lookup(self.parameters[spelling])
            if flag:
                message = re.sub(rf"(?<![\w'\":=@.-]){re.escape(spelling)}(?![\w'\":=(-])", flag, message)
        return message

    def about(self, parameter: str | Mapping[str, str]) -> FIError:
        """This error, also naming ``parameter`` (an error from a helper that spelled it): for ``raise
        exc.about(...)``."""
        self.parameters.update({parameter: parameter} if isinstance(parameter, str) else parameter)
        return self
