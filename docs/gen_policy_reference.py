"""Write docs/reference/policies.md from the policy registry: every registered policy, its kind, paper and
options with their defaults (:func:`fi_toolkit.policies.registry.entries`).

Run by ``make docs`` before ``mkdocs build``; the generated file is committed, and tests/test_docs.py checks
that it is up to date.

    python docs/gen_policy_reference.py            # writes docs/reference/policies.md
    python docs/gen_policy_reference.py --check    # exit 1 if the committed file differs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from fi_toolkit.policies.registry import entries

OUT = Path(__file__).resolve().parent / "reference" / "policies.md"
MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|])")


def _cell(text: str) -> str:
    return MD_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def _paper(arxiv: str) -> str:
    return f"[arXiv {arxiv}](https://arxiv.org/abs/{arxiv})" if arxiv else ""


def _options(entry) -> str:
    if not entry.options:
        return "the wrapped policy's" if entry.kind == "wrapper" else "the press's fields" if entry.cls is None else ""
    return ", ".join(f"`{o.label}` ({o.type})" for o in entry.options)


def render() -> str:
    lines = [
        "# Policies",
        "",
        "Generated from the policy registry (`fi_toolkit.policies.registry`) by `python docs/gen_policy_reference.py`",
        "(`make docs` runs it); do not edit. Every command, probe selection and Python call that names a policy",
        "resolves the name there (`resolve`, `entries`, `register`).",
        "",
        "A policy is spelled `NAME[:key=value,...]` (`--policy infokv:alpha=0.5,tau=2`; in a probe,",
        "`--select policy:infokv@keep=0.25:alpha=0.5`); an option a policy lacks is refused, and the budget is",
        "no option (`--budget`, `@BUDGET`). Kinds: a *policy* compresses from its name alone; a *wrapper* wraps",
        "a scored policy (`adaptive(NAME)`, alias `NAME-adaptive`); an *oracle* sees the future text (a probe",
        "or `fi eval` on documents only); a *file policy* reads a file; a *press* is a family a provider adds",
        "under its prefix (the kvpress integration: `kvpress:NAME`, the kvpress extra).",
        "",
        "| name | kind | paper | keeps | options (defaults) | spelled |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries():
        lines.append(
            f"| `{e.name}` | {e.kind} | {_paper(e.paper)} | {_cell(e.summary)} | {_options(e)} | `{e.spelling}` |"
        )
    lines += [
        "",
        "Add a policy: its dataclass in a file of its own under `fi_toolkit/policies/` and one `register(...)`",
        "line in `registry.py`. A package of its own adds a family under a prefix through the entry-point group",
        "`fi_toolkit.policies` (an object with `prefix`, `entries()`, `resolve(...)` and `selection(...)`, as",
        "`fi_toolkit.integrations.kvpress.provider` does).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT}: {'up to date' if same else 'out of date: run python docs/gen_policy_reference.py'}")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
