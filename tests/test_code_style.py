"""Habits of the project's text that no linter checks: the package's source, the docs, the analyses, benchmarks,
notebooks and tests give the reason, not an issue number (history lives in git).

Scanned: fi_toolkit/**/*.py, README.md, CHANGELOG.md, Makefile, docs/**/*.md and docs/**/*.py, analyses/*.py,
benchmarks/*.py and *.md, notebooks/*.md and the sources of notebooks/*.ipynb (markdown and code cells, not their
outputs), tests/*.py. Committed outputs (analyses/results/, benchmarks/results/) and test data are not.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fi_toolkit"
# "issue 21", "Issue #20", "issues 12", "ISSUE10_NOTES", "(#21)"; not "tissue 3", "n_issue 3", "19 issues"
ISSUE = re.compile(r"\bissues?\s?#?\d+|\(#\d+\)", re.IGNORECASE)
SCANNED = ["README.md", "CHANGELOG.md", "Makefile", "docs/**/*.md", "docs/**/*.py", "analyses/*.py"]
SCANNED += ["benchmarks/*.py", "benchmarks/*.md", "notebooks/*.md", "notebooks/*.ipynb", "tests/*.py"]
SELF = Path(__file__).resolve()  # its own examples below are citations on purpose


def scanned_files() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    files += sorted(p for pattern in SCANNED for p in ROOT.glob(pattern) if p.is_file() and p.resolve() != SELF)
    return files


def text_of(path: Path) -> str:
    """A file's text; a notebook's cell sources only, cell after cell."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] in ("markdown", "code"))


def citations(text: str) -> list[str]:
    """``N: line`` for every line of ``text`` that cites an issue number."""
    return [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if ISSUE.search(line)]


def test_no_line_cites_an_issue_number():
    cited = [
        f"{path.relative_to(ROOT)}:{line}"  # a notebook's line numbers count its cells' source lines
        for path in scanned_files()
        for line in citations(text_of(path))
    ]
    assert not cited, "cite the reason or the paper, not an issue:\n" + "\n".join(cited)


def test_the_scan_reaches_every_kind_of_file():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    for name in ("fi_toolkit/cli/app.py", "README.md", "CHANGELOG.md", "Makefile", "docs/guides/fit.md"):
        assert name in names
    for prefix in ("analyses/", "benchmarks/", "notebooks/", "tests/"):
        assert any(n.startswith(prefix) and n.endswith((".py", ".ipynb")) for n in names), prefix
    assert not any(n.startswith(("analyses/results/", "benchmarks/results/")) for n in names)
    assert "tests/test_code_style.py" not in names


def test_the_check_finds_a_citation():
    assert ISSUE.search("# usage errors answer at once (issue 19)")
    assert ISSUE.search('"""Headroom (Issue #20): ..."""')
    assert ISSUE.search("the bugs of issues 12 and 13")
    assert ISSUE.search("Measured 0.86 (see ISSUE10_NOTES.md)")
    assert ISSUE.search("fixed in (#21)")
    assert not ISSUE.search("# 19 issues of the journal")
    assert not ISSUE.search("tissue 3 and n_issue 4, the issue: 5")
    assert not ISSUE.search("(pytorch/pytorch#135712)")


def test_a_notebook_is_read_by_its_sources(tmp_path):
    notebook = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Title\n", "Issue 21, on a small scale\n"]},
            {"cell_type": "code", "metadata": {}, "source": ["x = 1"], "outputs": [{"text": "issue 4"}]},
        ]
    }
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    assert citations(text_of(path)) == ["2: Issue 21, on a small scale"]
