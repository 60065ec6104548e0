"""The command line answers at once: importing the package or the ``fi`` app loads none of the
heavy libraries, ``fi --help`` and usage errors never import them, every public name is still there, and the
package docstring's quick start runs as written."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ["torch", "transformers", "pandas", "scipy", "seaborn", "matplotlib", "numpy"]
# What `from fi_toolkit import ...` offered before the root became lazy: each must stay importable.
PUBLIC = [
    "Chunk",
    "CorpusSettings",
    "LabelSettings",
    "read_labels",
    "run_labels",
    "SurrogateFitSettings",
    "run_fit_surrogate",
    "CorrelateSettings",
    "NearfarSettings",
    "run_correlate",
    "run_nearfar",
    "ViewSettings",
    "run_view",
    "TaskExportSettings",
    "run_task_export",
    "DEFAULT_MODEL",
    "Document",
    "FIError",
    "FieldSettings",
    "FitDataSettings",
    "FitSettings",
    "GenerateSettings",
    "KeepMap",
    "LoadedModel",
    "ProbeResults",
    "ProbeSettings",
    "ScoresSettings",
    "SignalConfig",
    "TaskEvalSettings",
    "TaskSettings",
    "TextEvalSettings",
    "TokenSet",
    "Trace",
    "forward_influence",
    "forward_influence_by_deletion",
    "load_document",
    "load_documents",
    "load_model",
    "parse_chunk",
    "parse_selections",
    "probe_document",
    "run_eval",
    "run_field",
    "run_fit",
    "run_fit_data",
    "run_generate",
    "run_probe",
    "run_scores",
    "tiny_model",
    "trace_document",
    "trace_prefix",
]


def fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints a JSON object as its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def loaded_heavy(code: str) -> list[str]:
    return fresh(
        textwrap.dedent(code) + f"\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )


@pytest.mark.parametrize("module", ["fi_toolkit", "fi_toolkit.cli.app", "fi_toolkit.cli.entry", "fi_toolkit.__main__"])
def test_importing_loads_no_heavy_library(module):
    assert loaded_heavy(f"import {module}") == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["probe", "--help"],
        ["nearfar", "--help"],
        ["eval", "--help"],
        ["probe", "--no-such-option"],
        ["probe"],
        ["no-such-command"],
    ],
)
def test_help_and_usage_errors_import_no_heavy_library(argv):
    """The whole ``fi ARGS`` run (through the console script's entry point) before it exits."""
    code = f"""
        import sys
        sys.argv = ["fi", *{argv!r}]
        from fi_toolkit.cli.entry import main
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, 2), exc.code
    """
    assert loaded_heavy(code) == []


# usage errors in option values: refused before torch, transformers or pandas is imported
VALUE_ERRORS = [
    (["probe", "--chunk", "9:3"], "invalid chunk '9:3'"),
    (["probe", "--chunk", "128:160", "--select", "nonsense:1"], "unknown selector 'nonsense'"),
    (["probe", "--chunk", "128:160", "--select", "entropy:nan"], "'nan' is not a number"),
    (["nearfar", "--distances", "x"], "invalid --distances 'x'"),
    (["eval", "--budget", "nan"], "'nan' is not a number"),
    (["eval", "--interval", "0"], "--interval must be >= 1, got 0"),
    (["generate", "hi", "--max-new", "-1"], "--max-new must be >= 1, got -1"),
    (["correlate", "--chunk", "128:160", "--candidates", "bad"], "invalid --candidates 'bad'"),
    (["scores", "--fi-chunk", "9:3"], "invalid chunk '9:3'"),
    (["scores", "--prefix", "128", "--fi-chunk", "128:160", "--seed=-1"], "--seed must be >= 0, got -1"),
    (["scores", "--out", "s.txt"], "--out must end in .csv or .parquet, got 's.txt'"),
    (["generate", "hi", "--policy", "snapkv", "--budget", "hold=0.2"], "write keep=X or remove=X"),
    (["generate", "hi", "--temperature", "nan"], "--temperature must be a finite number, got nan"),
    (["eval", "--future", "generated:x"], "--future must be 'document' or 'generated:N[@SEED]'"),
    (["probe", "--chunk", "128:160", "--select", "policy:infokv@0.5:alpha=nan"], "alpha must lie in [0, 1]"),
    (["eval", "--policy", "infokv:nonsense=1"], "infokv has no option 'nonsense'"),
    (["probe", "--chunk", "128:160", "--select", "positions:0-99999999"], "past any model's context"),
    (["correlate", "--chunk", "128:160", "--estimator", "fisher", "--samples", "0"], "--samples must be >= 1"),
    (["nearfar", "--unit-sets=-1"], "--unit-sets must be >= 0"),
    (["probe", "--chunk", "128:160", "--device", "cpu", "--device-map", "auto"], "does not go with --device"),
]


@pytest.mark.parametrize("argv, message", VALUE_ERRORS, ids=[" ".join(a) for a, _ in VALUE_ERRORS])
def test_value_errors_answer_before_any_heavy_import(argv, message):
    """``fi ARGS`` in a fresh interpreter through the console script's entry point: exit 2, one line on
    stderr, and at exit (an atexit hook, after everything the command did) none of the heavy libraries."""
    code = f"""
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps([m for m in {HEAVY!r} if m in sys.modules])))
        sys.argv = ["fi", *{argv!r}]
        from fi_toolkit.cli.entry import main
        main()
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_every_public_name_is_still_exported():
    import fi_toolkit

    assert sorted(fi_toolkit.__all__) == sorted(PUBLIC)
    assert set(PUBLIC) <= set(dir(fi_toolkit))
    found = fresh(f"""
        import importlib, json
        import fi_toolkit
        names = {PUBLIC!r}
        print(json.dumps({{n: getattr(fi_toolkit, n).__module__ if hasattr(getattr(fi_toolkit, n), "__module__")
                          else type(getattr(fi_toolkit, n)).__name__ for n in names}}))
    """)
    assert sorted(found) == sorted(PUBLIC)
    from fi_toolkit.documents import Document
    from fi_toolkit.model.loading import DEFAULT_MODEL
    from fi_toolkit.probe.chunks import parse_chunk

    assert fi_toolkit.Document is Document and fi_toolkit.parse_chunk is parse_chunk
    assert fi_toolkit.DEFAULT_MODEL == DEFAULT_MODEL
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        fi_toolkit.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from fi_toolkit import no_such_name")


def test_star_import_gives_the_public_names():
    names = fresh("""
        import json
        from fi_toolkit import *
        print(json.dumps(sorted(n for n in dir() if not n.startswith("_"))))
    """)
    assert set(PUBLIC) <= set(names)


@pytest.mark.smollm
def test_quick_start_docstring_runs():
    """The package docstring's quick start, run as a doctest: removing 10 % of p = 160 removes 16 tokens."""
    import fi_toolkit

    finder = doctest.DocTestFinder(recurse=False)
    (test,) = finder.find(fi_toolkit, "fi_toolkit")
    assert len(test.examples) >= 5 and any("remove=0.1" in e.source for e in test.examples)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test)
    assert result.failed == 0 and result.attempted == len(test.examples)
