"""The ``fi`` console script and ``python -m fi_toolkit``: :func:`fi_toolkit.cli.app.main` behind a guard.

The app's modules take a moment to import; Ctrl-C during that moment (or between the import and the
app's own handler) is the same one line and exit 130 as Ctrl-C later, never a traceback. This module
imports nothing at module level but the two constants, so the guard is in place before anything slow runs.

While the app imports, SIGINT goes to a handler of its own that prints the line and leaves at once: nothing
is written yet, and Python's KeyboardInterrupt is unreliable inside imports (raised in an import lock's
weakref callback it is only printed as "Exception ignored", and the interpreter may then end itself by
SIGINT instead of with the exit code given). Once the app runs, its own handler prints the line (after the
commands' ``finally`` blocks have cleaned up), and this guard leaves with exit 130 without the interpreter's
shutdown, for the same reason.
"""

from __future__ import annotations

import os
import signal
import sys

from fi_toolkit.cli import INTERRUPTED, INTERRUPTED_LINE


def _leave(code: int) -> None:
    """Flush what was printed and end the process with ``code`` (no interpreter shutdown, no SIGINT re-raise)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def _interrupted(*_args) -> None:
    sys.stderr.write(INTERRUPTED_LINE + "\n")
    _leave(INTERRUPTED)


def main() -> None:
    """Run ``fi``: exit 130 with one line on Ctrl-C at any moment, imports included."""
    guard = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not when SIGINT is ignored
    try:
        try:
            if guard:
                signal.signal(signal.SIGINT, _interrupted)
            from fi_toolkit.cli.app import main as run_app
        finally:
            if guard:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        run_app()
    except KeyboardInterrupt:
        _interrupted()
    except SystemExit as exc:
        if exc.code == INTERRUPTED:  # the app printed the line
            _leave(INTERRUPTED)
        raise


if __name__ == "__main__":
    main()
