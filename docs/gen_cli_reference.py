"""Write docs/reference/cli.md from the typer app: every ``fi`` command, and every subcommand of a sub-app
(``fi tasks export``), with every argument and option and its help.

Run by ``make docs`` before ``mkdocs build``; the generated file is committed, and tests/test_docs.py checks
that it is what this script writes now and names every option of every command and subcommand.

    python docs/gen_cli_reference.py            # writes docs/reference/cli.md
    python docs/gen_cli_reference.py --check    # exit 1 if the committed file differs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import typer

from fi_toolkit.cli.app import app

OUT = Path(__file__).resolve().parent / "reference" / "cli.md"
MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def _text(help_text: str | None) -> str:
    """Help text as one Markdown table cell: rich's escapes removed, Markdown's characters escaped."""
    plain = " ".join((help_text or "").replace("\\[", "[").split())
    return MD_SPECIAL.sub(r"\\\1", plain)


def command_tree():
    """The click command behind ``fi`` and its context (typer builds it the way ``fi`` runs)."""
    root = typer.main.get_command(app)
    return root, root.context_class(root, info_name="fi")


def _parameters(cmd, ctx) -> list[str]:
    """A command's arguments, then its options, as definition lists: the spelling on a line of its own (never
    squeezed into a narrow table column), the help indented below it."""
    groups: dict[str, list[str]] = {"Arguments": [], "Options": []}
    for param in cmd.params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        spelled, help_text = record
        group = groups["Arguments" if param.param_type_name == "argument" else "Options"]
        group += [f"`{spelled}`", f":   {_text(help_text)}", ""]
    if not any(groups.values()):
        return ["No arguments or options."]
    lines = []
    for title, items in groups.items():
        if items:
            lines += [f"**{title}**", "", '<div class="options" markdown>', "", *items, "</div>", ""]
    return lines[:-1]


def walk(cmd, ctx, path: str = ""):
    """``(name, command, context)`` for every visible command below ``cmd``, depth first in definition order:
    a sub-app's group (``tasks``) and then each of its subcommands (``tasks export``)."""
    for name, sub in getattr(cmd, "commands", {}).items():
        if sub.hidden:
            continue
        full = f"{path} {name}".strip()
        sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
        yield full, sub, sub_ctx
        yield from walk(sub, sub_ctx, full)


def anchor(name: str) -> str:
    """The anchor mkdocs' toc gives the heading ``fi NAME`` (``tasks export`` -> ``fi-tasks-export``)."""
    return "fi-" + name.replace(" ", "-")


def _first(cmd) -> str:
    return _text((cmd.help or "").strip().split("\n\n")[0])


def typer_version() -> str:
    """The installed typer's version: its help rendering (usage, option types) changes between releases."""
    from importlib.metadata import version

    return version("typer")


def render() -> str:
    root, root_ctx = command_tree()
    lines = [
        "# CLI reference",
        "",
        f"Generated from the typer app by `python docs/gen_cli_reference.py` (`make docs` runs it) with typer "
        f"{typer_version()}; do not edit.",
        "Every command prints one `error: …` line and exits 2 on bad input.",
        "",
        f"`fi`: {_text(root.help)}",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    commands = list(walk(root, root_ctx))
    for name, cmd, _ in commands:
        lines.append(f"| [`fi {name}`](#{anchor(name)}) | {_first(cmd)} |")
    for name, cmd, ctx in commands:
        lines += [
            "",
            f"## `fi {name}`",
            "",
            "```text",
            " ".join(cmd.collect_usage_pieces(ctx)).join([f"fi {name} ", ""]),
            "```",
            "",
        ]
        for para in (cmd.help or "").strip().split("\n\n"):
            lines += [_text(para), ""]
        subs = [(n, c) for n, c in getattr(cmd, "commands", {}).items() if not c.hidden]
        if subs:  # a sub-app: its commands (their sections follow), then the group's own options if any
            lines += ["**Commands**", ""]
            lines += [f"- [`fi {name} {n}`](#{anchor(f'{name} {n}')}): {_first(c)}" for n, c in subs]
            lines.append("")
            if not any(p.get_help_record(ctx) for p in cmd.params):
                lines.pop()
                continue
        lines += _parameters(cmd, ctx)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT}: {'up to date' if same else 'out of date: run python docs/gen_cli_reference.py'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
