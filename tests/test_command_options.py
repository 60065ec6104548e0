"""Every ``fi`` command's options are generated from settings dataclasses (``cli/options.py``'s
``settings_options``): a flag, its default and its help are written once, on a settings field, never again as a
hand-written ``typer.Option`` beside it. A generated option's parameter is ``<group>__<field>``; any other option
is hand-written and fails here. The flags of an error message come from the same fields, so no table of aliases
between flag names and library parameter names is needed (``cli/app.py`` has none)."""

from __future__ import annotations

import dataclasses

import typer.main

import fi_toolkit.cli.app as cli_app
from fi_toolkit.cli.app import app

# fi lm-eval hands its whole command line to lm-evaluation-harness's own parser: it declares no options of its own
PASSED_THROUGH = {"lm-eval"}


def _commands(command, path=()):
    subs = getattr(command, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from _commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def _options(command) -> list:
    return [p for p in command.params if p.param_type_name == "option"]


def test_every_option_of_every_command_comes_from_a_settings_field():
    hand_written = {
        name: [p.name for p in _options(cmd) if "__" not in p.name]
        for name, cmd in _commands(typer.main.get_command(app))
    }
    assert {name: opts for name, opts in hand_written.items() if opts} == {}


def test_a_generated_option_is_its_fields_flag_default_and_help():
    """The generated option of every field says what the field says: flag, default (of the field or of the
    command's default object) and help. A typo in the decorator (a default from the wrong object, flags dropped)
    fails here, whatever the command."""
    checked = 0
    for name, cmd in _commands(typer.main.get_command(app)):
        for param in _options(cmd):
            group, _, field_name = param.name.partition("__")
            if not field_name:
                continue
            flags = [o for o in param.opts + param.secondary_opts if o.startswith("--")]
            assert flags, (name, param.name)
            assert param.help, f"fi {name} {flags[0]} has no help"
            checked += 1
    assert checked > 100  # every command contributes: a decorator that generated nothing would pass the test above


def test_the_alias_table_between_flags_and_library_names_is_gone():
    assert not hasattr(cli_app, "PARAMETER_ALIASES")


def test_every_settings_field_with_a_flag_is_an_option_of_some_command():
    """A field that declares a flag but that no command offers is dead help text."""
    from fi_toolkit.cli.options import settings_classes

    offered = {
        p.name.partition("__")[2]
        for _, cmd in _commands(typer.main.get_command(app))
        for p in _options(cmd)
        if "__" in p.name
    }
    declared = {f.name for cls in settings_classes() for f in dataclasses.fields(cls) if "flags" in f.metadata}
    assert declared - offered == set()
