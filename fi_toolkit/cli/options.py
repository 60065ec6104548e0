"""Options, consoles and helpers shared by every ``fi`` command (app.py, study.py, eval.py, generate.py).

One module that imports nothing else of the CLI, so the command modules import it and never each other.
The option blocks the commands share are the settings dataclasses' fields (:func:`settings_options`):
their flags, defaults and help are written once, in the dataclass.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from typer.core import TyperGroup

from fi_toolkit.errors import FIError
from fi_toolkit.runs.settings import first_repeat

out = Console(emoji=False)
err = Console(stderr=True, emoji=False, soft_wrap=True)  # messages stay one line at any terminal width

OverwriteOpt = typer.Option(False, help="Replace results already in --out.")


class FlagsTakeNoValue(TyperGroup):
    """The ``fi`` command group (``typer.Typer(cls=...)``): its help and every command's show no type after a
    flag. typer's rich help gives each option a type column (``<str>``, ``<path>``); recent releases fill it
    for flags too (``--overwrite --no-overwrite <bool>``, even ``--help <bool>``), as if they took a value. An
    empty metavar leaves a flag's column blank under every supported typer (older releases left it blank)."""

    def get_params(self, ctx):
        return _untyped_flags(super().get_params(ctx))

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _untyped_command(command, ctx)
        return command


def _untyped_command(command, ctx) -> None:
    """``command``'s flags (its --help included) and those of every command below it, without a type."""
    _untyped_flags(command.get_params(ctx))
    for sub in getattr(command, "commands", {}).values():
        _untyped_command(sub, ctx)


def _untyped_flags(params: list) -> list:
    for param in params:
        if param.param_type_name == "option" and getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


HIDDEN = object()  # a settings_options tweak: keep the option, out of --help
_SETTINGS_CLASSES: list[type] = []  # every settings dataclass a command's options were generated from


def settings_classes() -> list[type]:
    """The settings dataclasses whose fields are some command's options (those imported so far)."""
    return list(_SETTINGS_CLASSES)


def settings_options(**tweaks):
    """Decorator: each parameter of a command annotated with a settings dataclass (a field's ``metadata``
    from :func:`fi_toolkit.runs.settings.option`) becomes that dataclass's options, and the command is
    called with one built object. The defaults are the parameter's default object's (``run: RunSettings =
    RunSettings(out=Path("runs/eval"))``), else the dataclass's; the flags and help are the fields'.

    A parameter without a default is a settings class that checks itself on construction
    (:class:`~fi_toolkit.studies.probe_settings.ProbeSettings`): a field without a default is a required option,
    and the object is built from the options with ``cls(**values)``, a field that names another settings
    parameter of the command (``signals``) filled with that parameter's object, built first.

    ``tweaks``: ``{parameter: {field: None}}`` leaves that option out (the field keeps its default),
    ``{parameter: {field: "help"}}`` replaces its help, ``{parameter: {field: HIDDEN}}`` keeps the option out of
    ``--help``. Checks of the groups with a default are the command's
    (``settings.check()``), so the order in which its errors are reported stays the command's.
    """

    def decorate(command):
        hints = typing.get_type_hints(command)
        params, groups = [], {}
        for p in inspect.signature(command).parameters.values():
            cls = hints.get(p.name)
            if not (dataclasses.is_dataclass(cls) and any("flags" in f.metadata for f in dataclasses.fields(cls))):
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))
                continue
            default = p.default if isinstance(p.default, cls) else None if p.default is p.empty else cls()
            names, tweak = [], tweaks.get(p.name, {})
            for f in _option_fields(cls):
                if f.name in tweak and tweak[f.name] is None:
                    continue
                names.append(f.name)
                flags = f.metadata["flags"] or (f"--{f.name.replace('_', '-')}",)
                hidden = tweak.get(f.name) is HIDDEN
                help_text = f.metadata["help"] if hidden else tweak.get(f.name) or f.metadata["help"]
                value = getattr(default, f.name) if default is not None else _field_default(f)
                params.append(
                    inspect.Parameter(
                        f"{p.name}__{f.name}",
                        inspect.Parameter.KEYWORD_ONLY,
                        annotation=_cli_type(cls, f),
                        default=typer.Option(value, *flags, help=help_text, hidden=hidden),
                    )
                )
            groups[p.name] = (cls, default, names)
            if cls not in _SETTINGS_CLASSES:
                _SETTINGS_CLASSES.append(cls)

        @functools.wraps(command)
        def wrapper(**kwargs):
            # the groups with a default first: a group built from its options may hold one of them (signals)
            for name, (cls, default, fields) in sorted(groups.items(), key=lambda g: g[1][1] is None):
                values = {f: kwargs.pop(f"{name}__{f}") for f in fields}
                if default is not None:
                    kwargs[name] = dataclasses.replace(default, **values)
                    continue
                siblings = {f.name: kwargs[f.name] for f in dataclasses.fields(cls) if f.name in groups}
                kwargs[name] = cls(**values, **{k: v for k, v in siblings.items() if k != name})
            return command(**kwargs)

        del wrapper.__wrapped__  # typer reads the signature below, not the command's
        wrapper.__signature__ = inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params])
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


def _field_default(f: dataclasses.Field):
    """A field's default as an option's: ``...`` (required) for a field without one."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return ...


def _option_fields(cls) -> list:
    """The fields of ``cls`` that are options, in ``cls.OPTION_ORDER`` where it sets one."""
    fields = [f for f in dataclasses.fields(cls) if "flags" in f.metadata]
    order = getattr(cls, "OPTION_ORDER", None)
    return sorted(fields, key=lambda f: order.index(f.name)) if order else fields


def _cli_type(cls, f):
    """The option's type: the metadata's ``cli_type``, else the field's (``X | None`` as ``Optional[X]``)."""
    hint = f.metadata.get("cli_type") or typing.get_type_hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = typing.Optional[args[0]] if len(args) == 1 else hint
    return hint


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


def unit_progress(bar: Progress, label: str):
    """``progress(unit, done, total)`` for the studies and ``fi eval``: one bar per document or task sample."""
    tasks: dict = {}

    def progress(name: str, done: int, total: int):
        if name not in tasks:
            tasks[name] = bar.add_task(f"{label} {name}", total=total or None)
        bar.update(tasks[name], completed=done)

    return progress


# --- documents measured before the model's weights load ---


def check_document_lengths(model, texts: list[tuple[str, str, str]], needed: int, what: str) -> None:
    """Refuse a document of ``texts`` shorter than the ``needed`` tokens that ``what`` reads, before the model's
    weights load: counted with ``model``'s ``tokenizer.json`` where one is at hand (a ``ModelSettings``'
    :meth:`token_counter`: no torch, no transformers), else bounded by the text's bytes
    (:func:`fi_toolkit.documents.check_lengths`)."""
    from fi_toolkit.documents import check_lengths

    check_lengths(texts, needed, what, model.token_counter())


def chunk_ending(chunks, end: int, otherwise: str) -> str:
    """``chunk START:END`` for the chunk of ``chunks`` that ends at ``end`` (the last token a document must
    hold), else ``otherwise``."""
    return next((f"chunk {c.label}" for c in chunks if c.end == end), otherwise)


# --- equal specifications: compared after parsing, refused in one line naming both spellings ---


def distinct_texts(texts: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """``(name, text, source)`` documents: two with the same text are refused (a document counts once)."""
    pair = first_repeat(texts, key=lambda t: t[1])
    if pair:
        (a, _, src_a), (b, _, src_b) = pair
        raise FIError(f"documents '{a}' ({src_a}) and '{b}' ({src_b}) hold the same text; give each document once")
    return texts
