"""Habits of the package's source that no linter checks: comments and docstrings give the reason, not an
issue number (history lives in git)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fi_toolkit"
ISSUE = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)


def test_no_line_cites_an_issue_number():
    cited = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE.search(line)
    ]
    assert not cited, "cite the reason or the paper, not an issue:\n" + "\n".join(cited)


def test_the_check_finds_a_citation():
    assert ISSUE.search("# usage errors answer at once (issue 19)")
    assert ISSUE.search('"""Headroom (Issue #20): ..."""')
    assert not ISSUE.search("# 19 issues of the journal")
