"""Run the ``fi`` command line in-process, as a user would from a shell (shared by the CLI tests)."""

from __future__ import annotations

import sys

import pytest

from fi_toolkit.cli import app as cli


def run_cli(args, capsys):
    """``fi ARGS`` through ``cli.main`` -> (exit status, stdout, stderr)."""
    sys_argv, sys.argv = sys.argv, ["fi", *args]
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        sys.argv = sys_argv
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


STOP = "stop here"  # the line a command built by record_settings stops with, where it would load the model


def record_settings(monkeypatch, *classes) -> dict:
    """Record every object of the settings ``classes`` a command builds (``{class name: object}``), and stop the
    command with ``FIError(STOP)`` where it would load the model: what the command line builds, without the work."""
    from fi_toolkit.errors import FIError
    from fi_toolkit.model.settings import ModelSettings

    seen: dict = {}
    for cls in classes:
        original = cls.__post_init__

        def record(self, original=original, name=cls.__name__):
            original(self)
            seen[name] = self

        monkeypatch.setattr(cls, "__post_init__", record)
    monkeypatch.setattr(ModelSettings, "load", lambda self, **kwargs: (_ for _ in ()).throw(FIError(STOP)))
    return seen


def assert_refused_in_one_line(make, message: str, parameter: str | None) -> None:
    """``make()`` raises one ``FIError`` line holding ``message`` about ``parameter`` (None: no parameter)."""
    from fi_toolkit.errors import FIError

    with pytest.raises(FIError) as exc:
        make()
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.parameter == parameter
