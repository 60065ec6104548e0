"""The API reference, one page per module of fi_toolkit, generated at build time (mkdocs-gen-files).

Walks the package on disk, so a module added or split later appears without editing anything; the
pages hold only mkdocstrings' ``::: module`` directive, and reference/api/SUMMARY.md is their nav
(mkdocs-literate-nav).
"""

from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fi_toolkit"

nav = mkdocs_gen_files.Nav()
for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__main__":
        continue
    if parts[-1] == "__init__":
        parts = parts[:-1]
        page = Path(*parts, "index.md")
    else:
        page = Path(*parts).with_suffix(".md")
    nav[parts] = page.as_posix()
    with mkdocs_gen_files.open(Path("reference", "api", page), "w") as f:
        f.write(f"# `{'.'.join(parts)}`\n\n::: {'.'.join(parts)}\n")
    mkdocs_gen_files.set_edit_path(Path("reference", "api", page), path.relative_to(ROOT))

with mkdocs_gen_files.open("reference/api/SUMMARY.md", "w") as f:
    f.writelines(nav.build_literate_nav())
