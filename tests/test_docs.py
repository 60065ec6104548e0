"""The documentation (README.md, docs/, mkdocs.yml) against the code and itself; fast, no model.

* the generated CLI reference, docs/reference/cli.md, is what docs/gen_cli_reference.py writes now, and
  every option of every ``fi`` command and of every subcommand of a sub-app (``fi tasks export``; walked
  here over the click tree typer builds, not with the generator's walk) appears in its section;
* every relative link and image in the Markdown files points to a file that exists, and every
  ``#anchor`` to a heading (or explicit anchor) of that file;
* every page of mkdocs.yml's nav exists; the README stays one screen (at most 80 lines);
* no formula is written as inline code (a code span with a sub- or superscript group such as ``x_{t+1}``,
  ``h_i^(l)``, ``A^{(l)}``): the method's notation is ``$...$``, which the site renders with KaTeX.

Each checker returns what it found wrong, and a test below feeds it a planted fault, so each check
is seen to fail.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CLI_MD = DOCS / "reference" / "cli.md"
API_DIR = "reference/api/"  # generated at build time by docs/gen_api_reference.py, one page per module
README_MAX_LINES = 80  # one screen
MARKDOWN = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "notebooks" / "README.md",
    *sorted(DOCS.rglob("*.md")),
]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
MATH_IN_CODE = re.compile(r"_\{|\^\(|\^\{")  # x_{t+1}, h^(l), A^{(l)}: a formula, not code


def slug(heading: str) -> str:
    """A heading's anchor as mkdocs' toc extension makes it (markup dropped, then Python-Markdown's slugify)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path, text: str | None = None) -> set[str]:
    """Anchors of a Markdown file: its headings' slugs (deduplicated as toc does) and explicit {#id}s."""
    text = FENCE.sub("", path.read_text() if text is None else text)
    found, seen = set(), {}
    for heading in HEADING.findall(text):
        base = slug(re.sub(r"\s*\{#[^}]*\}\s*$", "", heading))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}_{n}")
    return found | set(re.findall(r"\{#([\w-]+)\}", text))


def links(path: Path, text: str | None = None) -> list[str]:
    """Relative link targets in a Markdown file (or ``text`` given for it), outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text() if text is None else text))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def math_as_code(path: Path, text: str | None = None) -> list[str]:
    """Code spans of a Markdown file (outside fenced blocks) that hold a formula's sub- or superscript group."""
    text = FENCE.sub("", path.read_text() if text is None else text)
    return [span for span in CODE_SPAN.findall(text) if MATH_IN_CODE.search(span)]


def api_module_exists(rel: str) -> bool:
    """reference/api/fi_toolkit/x/y.md or .../index.md -> does fi_toolkit/x/y.py (or the package) exist?"""
    parts = Path(rel.split(API_DIR, 1)[1]).with_suffix("").parts
    if parts and parts[-1] == "index":
        return (ROOT.joinpath(*parts[:-1]) / "__init__.py").is_file()
    return ROOT.joinpath(*parts).with_suffix(".py").is_file()


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """Every relative link of ``path`` (or of ``text`` placed there) whose file, or #anchor, does not exist."""
    bad = []
    for target in links(path, text):
        file_part, _, anchor = target.partition("#")
        if not file_part:  # an anchor in this page
            if anchor not in anchors(path, text):
                bad.append(f"{target} (no such anchor)")
            continue
        dest = (path.parent / file_part).resolve()
        rel = dest.relative_to(DOCS).as_posix() if dest.is_relative_to(DOCS) else None
        if rel is not None and rel.startswith(API_DIR):
            if not api_module_exists(rel):
                bad.append(f"{target} (no such module)")
            continue
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no such anchor)")
    return bad


def cli_sections(text: str) -> dict[str, str]:
    """docs/reference/cli.md split by its '## `fi NAME`' headings -> {NAME: section text} (NAME: 'tasks export'
    for a subcommand)."""
    parts = re.split(r"^## `fi ([\w-]+(?: [\w-]+)*)`\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def every_command(group, path: str = "") -> list[tuple[str, object]]:
    """``(name, click command)`` for every command below ``group``, a sub-app's subcommands included
    (``tasks export``); hidden ones (and all below them) left out, as ``fi --help`` leaves them out."""
    found = []
    for name, cmd in group.commands.items():
        if cmd.hidden:
            continue
        full = f"{path} {name}".strip()
        found.append((full, cmd))
        if hasattr(cmd, "commands"):
            found += every_command(cmd, full)
    return found


def missing_options(text: str) -> list[str]:
    """'fi CMD OPT' for every option spelling (and argument) of every command and subcommand that the reference
    lacks; 'fi CMD (no section)' for a command without its own section."""
    root = typer.main.get_command(__import__("fi_toolkit.cli.app", fromlist=["app"]).app)
    sections, missing = cli_sections(text), []
    for name, cmd in every_command(root):
        section = sections.get(name)
        if section is None:
            missing.append(f"fi {name} (no section)")
            continue
        for param in cmd.params:
            if getattr(param, "hidden", False):  # an option kept out of --help (tasks export --device)
                continue
            spellings = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else [param.name]
            cells = re.findall(r"^`([^`]*)`$", section, flags=re.M)  # each spelling on a line of its own
            for spelling in spellings:
                if not any(re.search(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", cell) for cell in cells):
                    missing.append(f"fi {name} {spelling}")
    return missing


def nav_pages(nav) -> list[str]:
    """Every page path in a mkdocs nav (nested lists and dicts)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def missing_nav_pages(config_text: str) -> list[str]:
    """Nav entries of mkdocs.yml with no file under docs/ (the generated API directory: its generator)."""
    nav = yaml.safe_load(config_text)["nav"]
    missing = []
    for page in nav_pages(nav):
        if page.startswith(API_DIR):
            if not (DOCS / "gen_api_reference.py").is_file():
                missing.append(page)
        elif not (DOCS / page).is_file():
            missing.append(page)
    return missing


def load_mkdocs_config() -> str:
    # mkdocs.yml may hold python tags (!!python/name) in other projects; this one is plain YAML.
    return (ROOT / "mkdocs.yml").read_text()


def _generator(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_option_of_every_command_is_in_the_cli_reference():
    assert CLI_MD.is_file(), "run python docs/gen_cli_reference.py"
    text = CLI_MD.read_text()
    assert missing_options(text) == []
    assert {"tasks", "tasks export"} <= set(cli_sections(text))  # a sub-app's subcommands have sections too


def test_the_cli_reference_is_what_the_generator_writes():
    """docs/reference/cli.md equals what docs/gen_cli_reference.py writes from the typer app now: an option or
    a command (or a sub-app's subcommand) added without regenerating it fails here. Typer renders usage and option
    types differently between releases, so the comparison runs under the typer the file was generated with (the
    lowest supported one, in make test-min, still runs the option check above)."""
    generator = _generator("gen_cli_reference")
    committed = CLI_MD.read_text()
    made_with = re.search(r"with typer (\S+);", committed)
    assert made_with, "docs/reference/cli.md names no typer version: run python docs/gen_cli_reference.py"
    if made_with[1] != generator.typer_version():
        pytest.skip(
            f"docs/reference/cli.md was generated with typer {made_with[1]}, this is {generator.typer_version()}"
        )
    assert committed == generator.render(), "run python docs/gen_cli_reference.py"


def test_the_policy_reference_is_what_the_registry_generates():
    """docs/reference/policies.md equals what docs/gen_policy_reference.py writes from the registry now (a policy
    registered without regenerating it fails here), and it names every registered policy and option."""
    from fi_toolkit.policies.registry import entries

    generator = _generator("gen_policy_reference")
    committed = (DOCS / "reference" / "policies.md").read_text()
    assert committed == generator.render(), "run python docs/gen_policy_reference.py"
    rows = {re.match(r"\| `([^`]*)`", line)[1]: line for line in committed.splitlines() if line.startswith("| `")}
    assert list(rows) == [e.name for e in entries()]
    for e in entries():
        assert all(f"`{o.label}`" in rows[e.name] for o in e.options), e.name


def test_the_option_check_fails_on_a_missing_option():
    text = CLI_MD.read_text()
    section = cli_sections(text)["probe"]
    without = text.replace(section, section.replace("--batch-size", "--batch-sizes"))
    assert missing_options(without) == ["fi probe --batch-size"]
    assert "fi eval (no section)" in missing_options(text.replace("## `fi eval`", "## eval"))
    export = cli_sections(text)["tasks export"]
    assert missing_options(text.replace(export, export.replace("`--context <int>`", "`--contexts <int>`"))) == [
        "fi tasks export --context"
    ]
    assert missing_options(text.replace("## `fi tasks export`", "## tasks export")) == ["fi tasks export (no section)"]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_the_link_check_fails_on_broken_links():
    planted = (
        "# Planted\n\n[a](probe.md) [b](nope.md) [c](probe.md#worked-example) [d](probe.md#no-such)\n"
        "![e](../images/missing.png) [f](../reference/api/fi_toolkit/no_module.md) "
        "[g](../reference/api/fi_toolkit/budget.md) `[h](in-code.md)` [i](#planted) [j](#elsewhere)\n"
    )
    assert broken_links(DOCS / "guides" / "_planted.md", planted) == [
        "nope.md (no such file)",
        "probe.md#no-such (no such anchor)",
        "../images/missing.png (no such file)",
        "../reference/api/fi_toolkit/no_module.md (no such module)",
        "#elsewhere (no such anchor)",
    ]


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_formulas_are_math_not_code(path):
    assert math_as_code(path) == []


def test_the_method_writes_its_notation_as_math():
    text = (DOCS / "method.md").read_text()
    for formula in ("$x_{t+1}$", "$h_i^{(l)}$", "$A_{h,i}^{(l)}$", "$[0, p - w)$", "$H_i$"):
        assert formula in text, formula


def test_the_math_check_fails_on_formulas_in_code():
    planted = (
        "The logits at `t` predict `x_{t+1}`; `h_i^(l)` enters layer `l`; `A^{(l)}` and $A_{h,i}^{(l)}$.\n"
        "`--entropy-of next`, `fi_layer_<l>` and `positions[l][h, j]` are code.\n```\n`D^(l)` in a fence\n```\n"
    )
    assert math_as_code(DOCS / "_planted.md", planted) == ["`x_{t+1}`", "`h_i^(l)`", "`A^{(l)}`"]


def test_readme_is_one_screen():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_every_nav_page_exists():
    assert missing_nav_pages(load_mkdocs_config()) == []
    planted = load_mkdocs_config().replace("  - Testing: testing.md", "  - Testing: testing-gone.md")
    assert missing_nav_pages(planted) == ["testing-gone.md"]


def test_slugs_follow_mkdocs_toc():
    assert slug("Models larger than one GPU: `--device-map`") == "models-larger-than-one-gpu-device-map"
    assert slug("`fi probe`: Forward Influence of token sets") == "fi-probe-forward-influence-of-token-sets"
    assert slug("Set-level analysis (near/far)") == "set-level-analysis-nearfar"
