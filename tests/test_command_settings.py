"""Command settings (``ProbeSettings``, ``FieldSettings``): checked on construction with one line naming the
Python parameter, the command line builds the object Python builds (and names its flags in the same
messages), the parsed values are what the options say, and the settings modules import nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import run_cli

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.field_settings import FieldSettings
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.field_spec import POLICY, Method
from fi_toolkit.studies.probe_settings import DEFAULT_SELECTIONS, ProbeSettings

STOP = "stop here"


@pytest.fixture
def built(monkeypatch):
    """Record every command settings object built, and stop the command where it would load the model."""
    seen: dict = {}
    for cls in (ProbeSettings, FieldSettings):
        original = cls.__post_init__

        def record(self, original=original, name=cls.__name__):
            original(self)
            seen[name] = self

        monkeypatch.setattr(cls, "__post_init__", record)
    monkeypatch.setattr(ModelSettings, "load", lambda self, **kwargs: (_ for _ in ()).throw(FIError(STOP)))
    return seen


def test_probe_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["probe", "--chunk", "128:160", "--chunk", "150:190", "--select", "entropy:remove=0.1", "--select"]
    args += ["random:keep=0.5@1-2", "--prefix", "120", "--sinks", "2", "--future", "generated:80", "--batch-size", "3"]
    code, _, err = run_cli([*args, "--window", "16"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = ProbeSettings(
        ["128:160", "150:190"],
        ["entropy:remove=0.1", "random:keep=0.5@1-2"],
        prefix=120,
        sinks=2,
        future="generated:80",
        signals=SignalConfig(window=16),
        batch_size=3,
    )
    assert built["ProbeSettings"] == python
    # what the options say, parsed: a seed range is one selection per seed; p + N = 200 tokens per document
    assert python.chunks == (Chunk(128, 160), Chunk(150, 190))
    assert [s.label for s in python.selections] == ["entropy:remove=0.1", "random:keep=0.5@1", "random:keep=0.5@2"]
    assert (python.future.tokens, python.document_tokens()) == (80, 120)


def test_probe_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["probe", "--chunk", "128:160"], capsys)[0] == 2
    default = ProbeSettings(["128:160"])
    assert built["ProbeSettings"] == default
    assert default.prefix == 128 and default.document_tokens() == 160 and default.future.label == "document"
    assert len(default.selections) == len(DEFAULT_SELECTIONS) + 2  # random:remove=0.1@0-2 is three sets


def test_field_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["field", "alice", "--policy", "snapkv", "--policy", "infokv:alpha=0.5", "--budget", "keep=0.5"]
    args += ["--budget", "remove=0.25", "--prefix", "128", "--distances", "0,32", "--chunk-len", "16", "--seeds", "2"]
    args += ["--replay", "--interval", "8", "--length", "200", "--resamples", "10", "--batch-size", "2"]
    code, _, err = run_cli([*args, "--out", "o"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = FieldSettings(
        methods=["snapkv", "infokv:alpha=0.5"],
        budgets=["keep=0.5", "remove=0.25"],
        prefix=128,
        distances="0,32",
        chunk_len=16,
        seeds=2,
        replay=True,
        interval=8,
        length=200,
        resamples=10,
        batch_size=2,
    )
    assert built["FieldSettings"] == python
    assert python.methods == (Method("snapkv", POLICY), Method("infokv:alpha=0.5", POLICY)) and not python.presses
    assert python.budgets == (Budget.parse("keep=0.5"), Budget.parse("remove=0.25"))
    assert python.chunks == [Chunk(128, 144), Chunk(160, 176)] and python.document_tokens() == 200


def test_field_without_methods_places_every_policy_and_the_presses():
    from fi_toolkit.policies.registry import POLICY as REGISTRY_POLICY
    from fi_toolkit.policies.registry import entries

    s = FieldSettings(prefix=256, distances=(0,), chunk_len=32)
    assert s.presses and [m.name for m in s.methods] == [e.name for e in entries() if e.kind == REGISTRY_POLICY]
    assert s.document_tokens() == 288 and s.replay_length() is None
    assert not FieldSettings(methods=["h2o"], prefix=256, distances=(0,), chunk_len=32).presses


@pytest.mark.parametrize(
    "make, message, parameter",
    [
        (lambda: ProbeSettings(["128:160"], batch_size=0), "batch_size must be >= 1, got 0", "batch_size"),
        (lambda: ProbeSettings(["128:160"], sinks=200), "sinks 200 leaves no candidates", "sinks"),
        (lambda: ProbeSettings(["128:160"], sinks=-1), "sinks must be >= 0, got -1", "sinks"),
        (lambda: ProbeSettings(["20:40"]), "prefix 20 leaves nothing to score", "prefix"),
        (lambda: ProbeSettings(["128:160"], prefix=150), "starts before the compression point p=150", None),
        (lambda: ProbeSettings(["128:260"], future="generated:64"), "ends past p + N = 192: future", "future"),
        (lambda: ProbeSettings(["128:160"], future="later"), "future must be 'document'", "future"),
        (lambda: ProbeSettings([]), "no chunk given", "chunks"),
        (lambda: ProbeSettings("128:160"), "chunks must be a list", "chunks"),
        (lambda: ProbeSettings(["128:160"], ["magic:0.1"]), "unknown selector 'magic'", None),
        (lambda: ProbeSettings(["128:160"], signals=SignalConfig(alpha=2.0)), "alpha must lie in [0, 1]", "alpha"),
        (lambda: FieldSettings(prefix=256, seeds=0), "seeds must lie in [1, 1000], got 0", "seeds"),
        (lambda: FieldSettings(prefix=256, resamples=-1), "resamples must lie in [0, 100,000]", "resamples"),
        (lambda: FieldSettings(prefix=256, length=300), "length sets the replay: it goes with replay", "length"),
        (lambda: FieldSettings(prefix=256, replay=True, interval=0), "interval must be >= 1, got 0", "interval"),
        (lambda: FieldSettings(prefix=256, budgets=["keep=100"]), "not a token count", None),
        (lambda: FieldSettings(prefix=256, methods=["fi-oracle"]), "anchor", None),
        (lambda: FieldSettings(prefix=256, methods=[]), "methods lists nothing", "methods"),
        (lambda: FieldSettings(prefix=16), "prefix 16 leaves nothing to score", "prefix"),
        (lambda: FieldSettings(prefix=256, distances="0,x"), "invalid distances '0,x'", "distances"),
    ],
)
def test_settings_refuse_on_construction_in_one_line(make, message, parameter):
    with pytest.raises(FIError) as exc:
        make()
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.parameter == parameter


@pytest.mark.parametrize(
    "args, line",
    [
        (["probe", "--chunk", "128:160", "--batch-size", "0"], "error: --batch-size must be >= 1, got 0"),
        (["probe", "--chunk", "128:160", "--sinks", "-1"], "error: --sinks must be >= 0, got -1"),
        (["field", "alice", "--prefix", "256", "--seeds", "0"], "error: --seeds must lie in [1, 1000], got 0"),
        (
            ["field", "alice", "--prefix", "256", "--length", "300"],
            "error: --length sets the replay: it goes with --replay",
        ),
    ],
)
def test_the_cli_names_its_flags_in_the_settings_messages(args, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, line + "\n")


def test_settings_are_frozen():
    s = ProbeSettings(["128:160"])
    with pytest.raises(AttributeError):
        s.prefix = 100


def test_the_settings_modules_import_nothing_heavy():
    code = (
        "import sys; import fi_toolkit.studies.probe_settings, fi_toolkit.evaluation.field_settings; "
        "from fi_toolkit.evaluation.field_settings import FieldSettings; FieldSettings(prefix=256); "
        "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'transformers') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert done.stdout.strip() == "[]"
