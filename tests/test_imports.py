"""Who imports kvpress and who resolves policy names, read from the package's source (ast), function-level
imports included:

* only modules under ``fi_toolkit/integrations/kvpress/`` import the ``kvpress`` library, or that integration
  (the commands reach it through the policy registry, which finds it as a provider by entry point);
* only the registry (``fi_toolkit/policies/registry.py``) resolves policy names: no other module reaches into its
  private tables, imports name tables (``POLICIES`` and kin), builds a name -> policy class table of its own, or
  constructs a policy from a registry entry's class.

Each checker returns what it found wrong; a test below plants each kind of violation in a synthetic source,
so every check is seen to fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fi_toolkit.policies.registry import entries

PACKAGE = Path(__file__).resolve().parents[1] / "fi_toolkit"
KVPRESS_HOME = PACKAGE / "integrations" / "kvpress"
REGISTRY = PACKAGE / "policies" / "registry.py"
INTEGRATION = "fi_toolkit.integrations.kvpress"
NAME_TABLES = {"POLICIES", "ORACLES", "FILE_POLICIES", "NAMED"}  # the tables names used to resolve through
POLICY_CLASSES = {e.cls.__name__ for e in entries() if e.cls is not None} | {"PressPolicy"}


def module_of(path: Path) -> list[str]:
    """``fi_toolkit/probe/kl.py`` -> ``["fi_toolkit", "probe", "kl"]`` (a package: its ``__init__`` dropped)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every module an import names (``from a import b``: ``a.b`` and ``a``), relative
    imports resolved, and every literal ``importlib.import_module("...")``/``__import__("...")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = module_of(path) if path.name == "__init__.py" else module_of(path)[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([node.module] if node.module else []))
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def kvpress_violations(path: Path, source: str) -> list[str]:
    """Imports of the kvpress library or of the kvpress integration from outside the integration."""
    if path.is_relative_to(KVPRESS_HOME):
        return []
    bad: dict[int, str] = {}  # one line per import statement: the first (shortest) name it reaches
    for line, name in imported_modules(path, ast.parse(source)):
        if name.split(".")[0] == "kvpress" or name == INTEGRATION or name.startswith(INTEGRATION + "."):
            bad.setdefault(line, f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return [bad[line] for line in sorted(bad)]


def resolution_violations(path: Path, source: str) -> list[str]:
    """Name resolution outside the registry: its private names, the old name tables, a string -> policy class
    table, a policy built from an entry's class."""
    if path == REGISTRY:
        return []
    where = path.relative_to(PACKAGE.parent)
    tree = ast.parse(source)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fi_toolkit.policies"):
            for alias in node.names:
                if alias.name.startswith("_") or alias.name in NAME_TABLES:
                    bad.append(f"{where}:{node.lineno} imports {alias.name} from {node.module}")
            if node.module == "fi_toolkit.policies.spec":
                bad.append(f"{where}:{node.lineno} imports the name tables' module {node.module}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "registry" and node.attr.startswith("_"):
                bad.append(f"{where}:{node.lineno} reads registry.{node.attr}")
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Name) and value.id in POLICY_CLASSES:
                    bad.append(f"{where}:{node.lineno} maps the name {key.value!r} to {value.id}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "dict":
                named = [(kw.arg, kw.value.id) for kw in node.keywords if isinstance(kw.value, ast.Name)]
                bad += [f"{where}:{node.lineno} maps the name {k!r} to {v}" for k, v in named if v in POLICY_CLASSES]
            elif isinstance(func, ast.Attribute) and func.attr == "cls":
                bad.append(f"{where}:{node.lineno} builds a policy from a registry entry's class")
    return bad


def package_sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))]


def test_only_the_kvpress_integration_imports_kvpress():
    assert [v for p, s in package_sources() for v in kvpress_violations(p, s)] == []


def test_only_the_registry_resolves_policy_names():
    assert [v for p, s in package_sources() for v in resolution_violations(p, s)] == []


def test_the_registry_holds_every_policy_class_and_the_kvpress_family():
    """The checks above know the policy classes from the registry: it must hold them all (and kvpress's family
    through its provider, found without importing kvpress)."""
    assert {"InfoKV", "SnapKV", "PyramidKV", "StreamingLLM", "H2O", "KNorm", "RandomPolicy", "RPC", "Adaptive"} <= (
        POLICY_CLASSES
    )
    assert {"FIOracle", "Fitted"} <= POLICY_CLASSES
    assert "kvpress:NAME" in [e.name for e in entries()]


PROBE = PACKAGE / "probe" / "selections.py"
CLI = PACKAGE / "cli" / "eval.py"


@pytest.mark.parametrize(
    "path, source",
    [
        (PROBE, "import kvpress\n"),
        (PROBE, "from kvpress.presses.snapkv_press import SnapKVPress\n"),
        (CLI, "def f():\n    from fi_toolkit.integrations.kvpress.bridge import press_policy\n"),
        (PROBE, "def f():\n    from ..integrations.kvpress import bridge\n"),
        (PROBE, "from fi_toolkit.integrations import kvpress\n"),
        (CLI, "import importlib\nimportlib.import_module('kvpress')\n"),
        (PACKAGE / "policies" / "registry.py", "from fi_toolkit.integrations.kvpress.provider import PROVIDER\n"),
    ],
)
def test_a_kvpress_import_outside_the_integration_fails(path, source):
    assert kvpress_violations(path, source)


@pytest.mark.parametrize(
    "source",
    [
        "import kvpress\nfrom kvpress import BasePress\n",
        "from fi_toolkit.integrations.kvpress.bridge import run_press\n",
        "from .bridge import make_press\n",
    ],
)
def test_the_integration_may_import_kvpress(source):
    assert kvpress_violations(KVPRESS_HOME / "press.py", source) == []


@pytest.mark.parametrize(
    "source",
    [
        "from fi_toolkit.policies.registry import _ENTRIES\n",
        "from fi_toolkit.policies import registry\nregistry._ENTRIES['snapkv']\n",
        "from fi_toolkit.policies.spec import parse_policy\n",
        "from fi_toolkit.policies import POLICIES\n",
        "from fi_toolkit.policies import SnapKV, InfoKV\nTABLE = {'snapkv': SnapKV, 'infokv': InfoKV}\n",
        "from fi_toolkit.policies import SnapKV\nTABLE = dict(snapkv=SnapKV)\n",
        "from fi_toolkit.policies import entries\npolicies = [e.cls(budget=0.3) for e in entries()]\n",
    ],
)
def test_resolving_a_name_outside_the_registry_fails(source):
    assert resolution_violations(CLI, source)


@pytest.mark.parametrize(
    "source",
    [
        "from fi_toolkit.policies.registry import resolve, split_policies\n",
        "from fi_toolkit.policies import SnapKV\npolicy = SnapKV(budget=0.3)\n",  # a class by itself, no name
        "KINDS = {'infokv': 1, 'random': 2}\n",  # names mapped to anything but a policy class
    ],
)
def test_using_the_registry_passes(source):
    assert resolution_violations(CLI, source) == []
