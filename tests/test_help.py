"""Every ``fi`` help screen shows a flag without a type placeholder: ``--overwrite --no-overwrite``, not
``--overwrite --no-overwrite <bool>`` (a flag takes no value), ``--help`` included."""

from __future__ import annotations

import re

import pytest
import typer.main
from cli_runner import run_cli

from fi_toolkit.cli.app import app


def _commands(command, path=()):
    """``(path, click command)`` for ``fi`` and every visible command and subcommand below it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        if not sub.hidden:
            yield from _commands(sub, (*path, name))


COMMANDS = [(path, cmd) for path, cmd in _commands(typer.main.get_command(app)) if cmd.add_help_option]
PLACEHOLDER = re.compile(r"<[^<>\s]+>|\bBOOLEAN\b")  # typer's <bool> / <str>; click's BOOLEAN


def test_every_command_is_rendered():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {
        "",
        "probe",
        "report",
        "field",
        "tasks",
        "tasks export",
    } <= names and "lm-eval" not in names  # its help is lm-eval's


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(("fi", *p)) for p, _ in COMMANDS])
def test_help_shows_no_type_after_a_flag(path, command, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "200")  # one line per option: its names, its type column, its help
    code, out, err = run_cli([*path, "--help"], capsys)
    assert code == 0 and not err, err
    assert "<bool>" not in out
    flags = ["--help"] + [
        long
        for p in command.params
        if p.param_type_name == "option" and getattr(p, "is_flag", False) and not p.hidden
        for long in p.opts
        if long.startswith("--")
    ]
    for flag in flags:  # the flag's row: its names, an empty type column, its help
        rows = [line for line in out.splitlines() if re.match(rf"\W*(\*\s+)?{re.escape(flag)}\s", line)]
        assert len(rows) == 1, (flag, out)
        assert not PLACEHOLDER.search(rows[0]), rows[0]
