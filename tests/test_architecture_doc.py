"""docs/architecture.md against the package: its layers table names every module, and the paths and names it
cites exist; fast, no model.

* **Every module is named.** The "layer | room | its job" table has one row per room. A module of ``fi_toolkit``
  (every ``.py`` file; a sub-package's ``__init__.py`` excepted, since its room names it) is named when the row of
  its room (the row whose room cell names the module's directory, ``probe/`` or ``integrations/kvpress/``, or
  the module itself, ``errors.py``) holds its path below that directory in backticks: ``probe/kl.py`` is
  `` `kl.py` `` in the ``probe/`` row; ``evaluation/lmeval/batching.py`` is `` `lmeval/batching.py` ``, or
  `` `batching.py` `` in a row that also names `` `lmeval/` ``.
* **The table names only modules.** Every backticked ``.py`` name in a room's row is a module of that room, and
  every name cited from one there (`` `chunks.py`: `Chunk`, `parse_chunk` ``) is defined in it.
* **What it cites exists.** Every backticked ``.py`` path anywhere in the page, the "Where do I add..." table's
  among them (``policies/base.py`` below ``fi_toolkit/``, ``tests/test_policies.py`` or
  ``docs/gen_policy_reference.py`` below the repository; ``NAME`` placeholders excepted), is a file, and every
  name cited from one (`` `cli/options.py`'s `settings_options` ``, `` `runs/settings.py`: `check_int`,
  `check_number` ``, `` `SignalConfig` (`signals/config.py`) ``) is defined there (a top-level name, or a class's
  member: ``Policy.keep_map``).

Each checker returns what it found wrong, and a test below feeds it a planted fault, so each check is seen to fail.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from package_graph import PACKAGE

ROOT = PACKAGE.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TICKED = re.compile(r"`([^`\n]+)`")
PY_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.py)`")  # a path with a directory; a bare file name is its row's
POSSESSIVE = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.py)`'s `([\w.]+)")  # `cli/app.py`'s `error_line`
LISTED = re.compile(r"`((?:[\w.-]+/)*[\w.-]+\.py)`: ((?:`\w+`, )*`\w+`)(?![\w(`])")  # `runs/settings.py`: `a`, `b`
BESIDE = re.compile(r"`(\w+)` \(`((?:[\w.-]+/)*[\w.-]+\.py)`\)")  # `SignalConfig` (`signals/config.py`)


def modules() -> list[str]:
    """Every module's path below fi_toolkit/ (``probe/kl.py``), a sub-package's ``__init__.py`` left out."""
    paths = (p.relative_to(PACKAGE).as_posix() for p in sorted(PACKAGE.rglob("*.py")))
    return [p for p in paths if not (p.endswith("/__init__.py"))]


def layer_rows(text: str) -> list[tuple[str, str]]:
    """``(room cell, whole row)`` of each row of the "layer | room | its job" table."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*layer\s*\|\s*room\s*\|", line))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = line.strip().strip("|").split("|")
        rows.append((cells[1], line))
    return rows


def is_named(module: str, rows: list[tuple[str, str]]) -> bool:
    """Whether the row of ``module``'s room names it (its path below the room's directory, or its file name in a
    row that also names each directory between)."""
    for room_cell, row in rows:
        ticked = set(TICKED.findall(row))
        for room in TICKED.findall(room_cell):
            if room == module:
                return True
            if not (room.endswith("/") and module.startswith(room)):
                continue
            below = module[len(room) :]
            *dirs, name = below.split("/")
            if below in ticked or (name in ticked and all(f"{d}/" in ticked for d in dirs)):
                return True
    return False


def unnamed_modules(text: str) -> list[str]:
    rows = layer_rows(text)
    return [m for m in modules() if not is_named(m, rows)]


def in_room(name: str, rooms: list[str]) -> list[Path]:
    """The modules a row's ``name`` (``kl.py``, ``lmeval/batching.py``) may be: under the row's room directories,
    or the room itself (``errors.py``)."""
    found = [PACKAGE / room for room in rooms if room == name and (PACKAGE / room).is_file()]
    for room in (r for r in rooms if r.endswith("/")):
        found += [f for f in sorted((PACKAGE / room).rglob(Path(name).name)) if f.as_posix().endswith(f"/{name}")]
    return found


def stale_names(text: str) -> list[str]:
    """Every backticked ``.py`` name in a room's row that is no module of that room (``kl.py`` in the ``probe/``
    row: some ``probe/**/kl.py``), and every name cited from one in the row (`` `chunks.py`: `Chunk` ``) that
    it does not define; a path that exists from the repository or the package (``tests/test_imports.py``) is
    left to :func:`broken_citations`."""
    stale = []
    for room_cell, row in layer_rows(text):
        rooms = TICKED.findall(room_cell)
        for name in dict.fromkeys(re.findall(r"`((?:[\w.-]+/)*[\w.-]+\.py)`", row)):
            if not ("/" in name and resolve(name)) and not in_room(name, rooms):
                stale.append(f"{name} (in the row of {', '.join(rooms)})")
        for path, cited in dict.fromkeys(citations(row)):
            files = [] if "/" in path and resolve(path) else in_room(path, rooms)
            if files and not any(cited in defined(f) for f in files):
                stale.append(f"{path}'s {cited} (not defined there)")
    return stale


def resolve(path: str) -> Path | None:
    """A cited ``.py`` path: below fi_toolkit/ or below the repository (None: neither)."""
    for base in (PACKAGE, ROOT):
        if (base / path).is_file():
            return base / path
    return None


@cache
def defined(path: Path) -> frozenset[str]:
    """The names a module defines: top-level functions, classes and assignments, and ``Class.member`` for every
    function and assignment in a class body (fields, methods, properties)."""

    def targets(node) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    names = set()
    for node in ast.parse(path.read_text()).body:
        names.update(targets(node))
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{m}" for child in node.body for m in targets(child))
    return frozenset(names)


def citations(text: str) -> list[tuple[str, str]]:
    """``(path, name)`` for every name the text cites from a ``.py`` path."""
    found = [(path, name) for path, name in POSSESSIVE.findall(text)]
    found += [(path, name) for path, names in LISTED.findall(text) for name in re.findall(r"`(\w+)`", names)]
    found += [(path, name) for name, path in BESIDE.findall(text)]
    return found


def broken_citations(text: str) -> list[str]:
    """Every cited ``.py`` path that is no file, and every name cited from one that it does not define."""
    bad = [f"{p} (no such file)" for p in dict.fromkeys(PY_PATH.findall(text)) if "NAME" not in p and not resolve(p)]
    for path, name in dict.fromkeys(citations(text)):
        file = resolve(path)
        if file is not None and name not in defined(file):
            bad.append(f"{path}'s {name} (not defined there)")
    return bad


def test_the_layers_table_names_every_module():
    missing = unnamed_modules(ARCHITECTURE.read_text())
    assert not missing, "docs/architecture.md's layers table does not name, in its room's row:\n" + "\n".join(missing)


def test_the_module_check_fails_on_a_missing_module():
    text = ARCHITECTURE.read_text()
    assert unnamed_modules(text.replace("`kl.py`", "`kl2.py`")) == ["probe/kl.py"]
    assert unnamed_modules(text.replace("`errors.py`", "`error.py`")) == ["errors.py"]
    assert "evaluation/lmeval/batching.py" in unnamed_modules(text.replace("`lmeval/`", "`lm_eval/`"))
    # the file name must sit in its own room's row: probe/'s kl.py named in compress/'s row does not count
    rows = [("`probe/`", "| 6 | `probe/` | `chunks.py` |"), ("`compress/`", "| 7 | `compress/` | `kl.py` |")]
    assert not is_named("probe/kl.py", rows)
    assert is_named("probe/chunks.py", rows)


def test_what_the_architecture_cites_exists():
    text = ARCHITECTURE.read_text()
    assert broken_citations(text) == []
    assert stale_names(text) == []


def test_the_stale_name_check_fails_on_a_module_that_is_gone():
    text = ARCHITECTURE.read_text()
    assert stale_names(text.replace("`kl.py`", "`kl2.py`")) == ["kl2.py (in the row of probe/)"]
    assert stale_names(text.replace("`batching.py`", "`batches.py`")) == ["batches.py (in the row of evaluation/)"]
    assert stale_names(text.replace("`Chunk`", "`Chunks`")) == ["chunks.py's Chunks (not defined there)"]


def test_the_citation_check_fails_on_what_does_not_exist():
    planted = (
        "| a policy | `policies/base.py`'s `Policy.keep_map`, `policies/base.py`'s `Policy.no_such`; "
        "`policies/gone.py`; `fi_toolkit/policies/NAME.py` | `runs/settings.py`: `check_int`, `check_nothing` | "
        "`SignalConfig` (`signals/config.py`), `Nothing` (`signals/config.py`); `tests/test_policies.py`, "
        "`tests/test_gone.py` |"
    )
    assert broken_citations(planted) == [
        "policies/gone.py (no such file)",
        "tests/test_gone.py (no such file)",
        "policies/base.py's Policy.no_such (not defined there)",
        "runs/settings.py's check_nothing (not defined there)",
        "signals/config.py's Nothing (not defined there)",
    ]
