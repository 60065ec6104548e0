"""The package's modules and what each imports, read from the source (module level and inside functions
alike, relative imports resolved): shared by the tests of the rooms' layers and of the command line's imports."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fi_toolkit"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """Every fi_toolkit module ``module`` imports, anywhere in its file (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "fi_toolkit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "fi_toolkit":
                target = node.module
            else:
                continue
            for alias in node.names:  # `from fi_toolkit.x import y` imports module x.y where y is one
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m != module}


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {m: imports_of(p, m, known) & known for m, p in modules.items()}
