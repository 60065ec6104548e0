"""The command line only parses, builds settings, calls a run function and prints: a ``cli/`` module imports,
from the package, nothing but

- settings: a module named ``settings`` or ``*_settings``, ``signals.config`` (``SignalConfig``) and
  ``evaluation.lmeval.arguments`` (the lm-eval backend's model arguments, its settings);
- run functions: a module that defines a top-level ``run_*`` function, and ``evaluation.lmeval.backend``
  (importing it registers ``--model fi``; lm-eval's own command line is that command's run function);
- the registry (``policies.registry``), the report (``report``, ``report.*``), the run machinery (``runs.*``),
  the loaders (``documents``, ``model.loading``), ``errors`` and ``cli.*`` itself.

Anything else (the probe's internals, the signals, the decoder, a policy class, the kvpress integration) is
reached through a run function, so one obvious place holds each command's work. Read from the source (every
``import`` anywhere in the file, function bodies included), as tests/test_layers.py reads the rooms.
"""

from __future__ import annotations

import ast
from pathlib import Path

from package_graph import PACKAGE, all_modules, imports_of

SETTINGS = {"fi_toolkit.signals.config", "fi_toolkit.evaluation.lmeval.arguments"}
RUNS = {"fi_toolkit.evaluation.lmeval.backend"}
FIXED = {"fi_toolkit.policies.registry", "fi_toolkit.documents", "fi_toolkit.model.loading", "fi_toolkit.errors"}
ROOMS = ("fi_toolkit.cli", "fi_toolkit.report", "fi_toolkit.runs")


def defines_a_run_function(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("run_") for n in tree.body)


def allowed(module: str, modules: dict[str, Path]) -> bool:
    last = module.rpartition(".")[2]
    return (
        last == "settings"
        or last.endswith("_settings")
        or module in SETTINGS | RUNS | FIXED
        or any(module == room or module.startswith(room + ".") for room in ROOMS)
        or (module in modules and defines_a_run_function(modules[module]))
    )


def cli_violations(modules: dict[str, Path]) -> list[str]:
    known = set(modules)
    return [
        f"{module} imports {target}"
        for module, path in modules.items()
        if module.startswith("fi_toolkit.cli")
        for target in sorted(imports_of(path, module, known) & known)
        if not allowed(target, modules)
    ]


def test_cli_modules_import_only_settings_run_functions_registry_and_report():
    modules = all_modules()
    assert sum(m.startswith("fi_toolkit.cli.") for m in modules) >= 10
    assert cli_violations(modules) == []


def test_every_command_reaches_a_run_function():
    """Not vacuous: the CLI does import run functions, from the modules that define them."""
    modules = all_modules()
    known = set(modules)
    runs = {
        target
        for module, path in modules.items()
        if module.startswith("fi_toolkit.cli")
        for target in imports_of(path, module, known) & known
        if defines_a_run_function(modules[target]) and not target.startswith(ROOMS)
    }
    expected = {"studies.probe_run", "studies.study", "evaluation.run", "field.run", "fit.run"}
    assert {f"fi_toolkit.{m}" for m in expected} <= runs, runs


def test_the_rule_catches_a_command_that_reaches_into_the_probe(tmp_path):
    """A CLI module that imports the probe's experiment (as fi scores once did) is caught; one that imports a
    settings module and a run function is not."""
    modules = all_modules()
    bad = tmp_path / "bad.py"
    bad.write_text("def scores():\n    from fi_toolkit.probe.experiment import trace_document\n")
    good = tmp_path / "good.py"
    good.write_text(
        "from fi_toolkit.studies.probe_settings import ProbeSettings\n"
        "def probe():\n    from fi_toolkit.studies.probe_run import run_probe\n"
    )
    for name, path in (("bad", bad), ("good", good)):
        modules[f"fi_toolkit.cli.{name}"] = path
    found = [v for v in cli_violations(modules) if v.startswith(("fi_toolkit.cli.bad", "fi_toolkit.cli.good"))]
    assert found == ["fi_toolkit.cli.bad imports fi_toolkit.probe.experiment"]
    assert (PACKAGE / "probe" / "experiment.py").exists()
