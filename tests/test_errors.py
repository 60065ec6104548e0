"""Library errors name parameters: no FIError message written in a library module names a
command-line flag, a Python call reads the parameter it passed, and the CLI names the flag instead."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fi_toolkit
from fi_toolkit import SignalConfig
from fi_toolkit.errors import FIError

PACKAGE = Path(fi_toolkit.__file__).parent


def _fierror_texts(path: Path):
    """(line, text) of every string constant and f-string piece in ``raise FIError(...)``'s message."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
            continue
        func = node.exc.func
        if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) != "FIError":
            continue
        for arg in node.exc.args[:1]:
            for part in ast.walk(arg):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    yield node.lineno, part.value


def test_no_library_message_names_a_flag():
    library = [p for p in PACKAGE.rglob("*.py") if "cli" not in p.relative_to(PACKAGE).parts]
    assert len(library) > 50
    found = [
        f"{p.relative_to(PACKAGE)}:{line}: {text!r}"
        for p in library
        for line, text in _fierror_texts(p)
        if "--" in text
    ]
    assert found == []


def test_the_walk_sees_flags_in_cli_messages():
    """The walk above would catch a flag: the CLI's own messages name many (constants and f-strings)."""
    texts = [t for p in (PACKAGE / "cli").glob("*.py") for _, t in _fierror_texts(p)]
    assert sum("--" in t for t in texts) >= 10


@pytest.mark.parametrize(
    "call, message, parameter",
    [
        (lambda: SignalConfig(alpha=2).check(), "alpha must lie in [0, 1], got 2", "alpha"),
        (lambda: SignalConfig(top_k=0).check(), "top_k must be >= 1, got 0", "top_k"),
        (lambda: SignalConfig(pool_kernel=2).check(), "pool_kernel must be an odd number >= 1, got 2", "pool_kernel"),
        (lambda: SignalConfig(entropy_of="x").check(), "entropy_of must be one of", "entropy_of"),
        (
            lambda: __import__("fi_toolkit.probe.estimator", fromlist=["x"]).check_samples(0),
            "samples must be >= 1, got 0",
            "samples",
        ),
        (
            lambda: __import__("fi_toolkit.probe.estimator", fromlist=["x"]).check_samples(10**9),
            "samples must be at most 10,000",
            "samples",
        ),
        (
            lambda: (
                __import__("fi_toolkit.model.settings", fromlist=["x"])
                .ModelSettings(device="cpu", device_map="auto")
                .check()
            ),
            "device_map places the model's layers across devices; it does not go with device",
            "device_map",
        ),
        (
            lambda: __import__("fi_toolkit.runs.settings", fromlist=["x"]).RunSettings("r", True, True).check(),
            "resume and overwrite contradict each other",
            "resume",
        ),
        (
            lambda: __import__("fi_toolkit.evaluation.settings", fromlist=["x"]).TaskSettings(samples=0).check(),
            "samples must lie in [1, 1,000], got 0",
            "samples",
        ),
        (
            lambda: (
                __import__("fi_toolkit.evaluation.settings", fromlist=["x"])
                .TaskSettings(tasks=("multikey_needle", "niah"))
                .check()
            ),
            "tasks names one task twice: 'multikey_needle' and 'niah' are both multikey_needle",
            "tasks",
        ),
        (
            lambda: __import__("fi_toolkit.compress.future", fromlist=["x"]).parse_future("generated:0"),
            "future generated:0 generates nothing",
            "future",
        ),
        (
            lambda: __import__("fi_toolkit.studies.nearfar", fromlist=["x"]).nearfar_chunks(128, [0, 0], 16),
            "distances holds a distance twice",
            "distances",
        ),
    ],
)
def test_a_python_call_names_the_parameter(call, message, parameter):
    with pytest.raises(FIError) as exc:
        call()
    assert message in str(exc.value) and "--" not in str(exc.value)
    assert exc.value.parameter == parameter


def test_a_selection_names_itself_in_python():
    from fi_toolkit.probe.selections import parse_selections

    with pytest.raises(FIError, match=r"^selection random:0.1@x: seed must be an integer") as exc:
        parse_selections(["random:0.1@x"])
    assert "--" not in str(exc.value)
    with pytest.raises(FIError, match="selection entropy:0.1 and selection entropy:keep=0.1 select the same set"):
        parse_selections(["entropy:0.1", "entropy:keep=0.1"])


def test_naming_replaces_whole_unquoted_words_only():
    exc = FIError(
        "policy infokv:top_k=8: top_k is shared; give it with SignalConfig.top_k, not 'top_k'",
        parameter={"SignalConfig.top_k": "top_k"},
    )
    assert (
        exc.naming({"top_k": "--top-k"}) == "policy infokv:top_k=8: top_k is shared; give it with --top-k, not 'top_k'"
    )
    both = FIError(
        "resume and overwrite contradict each other: resume continues, overwrite replaces; resumed",
        parameter=("resume", "overwrite"),
    )
    assert (
        both.naming({"resume": "--resume", "overwrite": "--overwrite"})
        == "--resume and --overwrite contradict each other: --resume continues, --overwrite replaces; resumed"
    )
    assert both.naming({}) == str(both)  # a parameter the command has no flag for keeps its name
    assert FIError("plain").parameters == {} and FIError("plain").parameter is None


def test_the_cli_maps_parameters_to_the_running_commands_flags():
    """Derived from the click options, every one a settings field named as the library's parameter: no table."""
    from fi_toolkit.cli.app import command_flags, error_line

    ev = command_flags(["eval", "--task", "passkey"])
    assert ev["samples"] == "--samples" and ev["free_tokens"] == "--free-tokens" and ev["device_map"] == "--device-map"
    assert ev["pool_kernel"] == "--pool" and ev["out"] == "--out" and ev["tasks"] == "--task"
    assert command_flags(["scores"])["out"] == "--out" and command_flags(["fit"])["out_file"] == "--out"
    assert command_flags(["probe"])["selections"] == "--select" and command_flags(["eval"])["policies"] == "--policy"
    assert command_flags(["nosuchcommand"]) == {}
    assert (
        error_line(FIError("samples must be at most 10,000, got 99", parameter="samples"), ["correlate"])
        == "--samples must be at most 10,000, got 99"
    )
    assert (
        error_line(
            FIError("sinks, seed and resamples must be >= 0", parameter=("sinks", "seed", "resamples")),
            ["correlate"],
        )
        == "--sinks, --seed and --resamples must be >= 0"
    )


def test_prose_before_a_colon_keeps_its_word():
    exc = FIError("cannot resume: 'r' holds a 'probe' run (resume only continues the same command)", parameter="resume")
    assert (
        exc.naming({"resume": "--resume"})
        == "cannot resume: 'r' holds a 'probe' run (--resume only continues the same command)"
    )
