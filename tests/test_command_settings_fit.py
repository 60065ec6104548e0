"""``fi fit-data``, ``fi fit``, ``fi fit-surrogate``, ``fi view`` and ``fi tasks export``: their options are
generated from settings dataclasses, the command line builds the objects Python builds (settings, model and
output alike), every option's field is named as the library's messages name it, so an error names the user's flag
without any table of aliases, and ``tasks export``'s ``--device`` stays out of ``--help``."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer.main
from cli_runner import STOP, record_settings, run_cli

import fi_toolkit.cli.app as cli_app
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.export_settings import TaskExportSettings
from fi_toolkit.fit.settings import FitDataSettings, FitSettings
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.report.view_settings import ViewSettings
from fi_toolkit.runs.settings import OutDirSettings, OutFileSettings, RunSettings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.surrogate.train_settings import SurrogateFitSettings

COMMANDS = (["fit-data"], ["fit"], ["fit-surrogate"], ["view"], ["tasks", "export"])


@pytest.fixture
def built(monkeypatch):
    """Record the settings and output objects a command builds (the model's: ``built["ModelSettings"]``), and
    stop it where it would load the model (``fi fit``: where it would read the runs)."""
    seen = record_settings(
        monkeypatch, FitDataSettings, FitSettings, ViewSettings, TaskExportSettings, OutDirSettings, OutFileSettings
    )

    def load(self, **kwargs):
        seen["ModelSettings"] = self
        raise FIError(STOP)

    monkeypatch.setattr(ModelSettings, "load", load)
    monkeypatch.setattr("fi_toolkit.cli.fit.run_fit", lambda *args, **kwargs: (_ for _ in ()).throw(FIError(STOP)))
    return seen


class _Loaded:
    """A loaded model as far as the commands read it before their run function."""

    tokenizer = None


def _command(argv: list[str]):
    command = typer.main.get_command(cli_app.app)
    for word in argv:
        command = command.commands[word]
    return command


def test_fit_data_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["fit-data", "alice", "-c", "128:160", "--chunk", "192:224", "--prefix", "120", "--sinks", "4"]
    args += ["--samples", "3", "--seed", "7", "--window", "16", "--dtype", "bfloat16", "-o", "fd", "--overwrite"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = FitDataSettings(["128:160", "192:224"], prefix=120, sinks=4, samples=3, seed=7, signals=SignalConfig(16))
    assert built["FitDataSettings"] == python
    assert built["OutDirSettings"] == OutDirSettings("fd", overwrite=True)
    assert built["OutDirSettings"].out_dir == Path("fd")
    assert built["ModelSettings"] == ModelSettings(dtype="bfloat16")


def test_fit_data_hands_run_fit_data_the_run_settings(built, tmp_path, monkeypatch, capsys):
    """The rows' run directory as ``run_fit_data`` takes it: a RunSettings with the command's overwrite."""
    seen = {}

    def run_fit_data(lm, docs, settings, run, progress=None):
        seen.update(settings=settings, run=run)
        raise FIError(STOP)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ModelSettings, "load", lambda self, **kwargs: _Loaded())
    monkeypatch.setattr("fi_toolkit.documents.tokenize_texts", lambda texts, tokenizer, max_tokens=None: [])
    monkeypatch.setattr("fi_toolkit.cli.fit.run_fit_data", run_fit_data)
    code, _, err = run_cli(["fit-data", "--chunk", "128:160", "--out", "fd"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    assert seen == {"settings": FitDataSettings(["128:160"]), "run": RunSettings(Path("fd"))}


def test_fit_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["fit", "fd", "--learner", "lambdarank", "--group", "layer", "--exclude", "a", "--features", "decoding"]
    code, _, err = run_cli([*args, "--out", "p.json"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    assert built["FitSettings"] == FitSettings("lambdarank", "decoding", exclude=["a"], group="layer")
    assert built["OutFileSettings"] == OutFileSettings(Path("p.json"))


def test_view_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["view", "alice", "-p", "snapkv,h2o", "-b", "remove=0.5", "--prefix", "256", "-c", "300:340"]
    code, _, err = run_cli([*args, "--samples", "4", "--seed", "2", "--alpha", "0.5", "-o", "v.html"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = ViewSettings("snapkv,h2o", "remove=0.5", 256, "300:340", 4, 2, SignalConfig(alpha=0.5))
    assert built["ViewSettings"] == python
    assert built["OutFileSettings"] == OutFileSettings(Path("v.html"))
    assert [p.name for p in python.policies] == ["snapkv", "h2o"] and python.chunk.label == "300:340"


def test_view_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["view", "alice"], capsys)[0] == 2
    default = ViewSettings()
    assert built["ViewSettings"] == default and default.chunk.label == "1024:1280"
    assert built["OutFileSettings"] == OutFileSettings(Path("view.html"))
    assert built["ModelSettings"] == ModelSettings()


def test_tasks_export_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["tasks", "export", "--task", "passkey,variable_tracking", "--context", "512", "--samples", "3"]
    args += ["--seed", "5", "--max-gen-toks", "8", "--device", "cpu", "--out", "t", "--overwrite"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    assert built["TaskExportSettings"] == TaskExportSettings("passkey,variable_tracking", 512, 3, 5, 8)
    assert built["OutDirSettings"] == OutDirSettings(Path("t"), overwrite=True)
    assert built["ModelSettings"] == ModelSettings(device="cpu")  # dtype and upcast: load_model's defaults


def test_tasks_export_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["tasks", "export", "--out", "t"], capsys)[0] == 2
    assert built["TaskExportSettings"] == TaskExportSettings()
    assert built["ModelSettings"] == ModelSettings()


def test_tasks_export_keeps_device_out_of_its_help():
    params = {p.name: p for p in _command(["tasks", "export"]).params}
    assert params["model__device"].hidden and params["model__device"].opts == ["--device"]
    assert {"model__dtype", "model__upcast", "model__device_map"}.isdisjoint(params)
    assert not any(getattr(p, "hidden", False) for name, p in params.items() if name != "model__device")


def test_the_output_groups_are_settings_of_their_own():
    """Required unless given a default object; a string becomes a Path; overwrite is off unless asked."""
    assert OutDirSettings("d") == OutDirSettings(Path("d"), overwrite=False)
    assert OutFileSettings("f.json", True).out_file == Path("f.json")
    with pytest.raises(TypeError):
        OutDirSettings()


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_every_option_is_generated_and_named_as_its_field(argv):
    """No hand-written option; each generated option's field is a name ``command_flags`` gives its flag."""
    flags = cli_app.command_flags(argv)
    options = [p for p in _command(argv).params if p.param_type_name == "option" and p.name != "help"]
    assert options and all("__" in p.name for p in options)
    for p in options:
        assert flags[p.name.partition("__")[2]] == next(o for o in p.opts if o.startswith("--"))


@pytest.mark.parametrize(
    "args, line",
    [
        (["fit-data", "--chunk", "128:160", "--out", "f"], "error: --out 'f' is a file, not a directory"),
        (["fit-data", "--chunk", "128:160", "--sinks", "-1", "--out", "fd"], "error: --sinks must lie in [0, 96)"),
        (["fit-data", "--chunk", "a:b", "--out", "fd"], "error: invalid chunk 'a:b'"),
        (["fit", "fd", "--out", "p.txt"], "error: --out must end in .json, got 'p.txt'"),
        (
            ["fit", "fd", "--out", "p.json", "--learner", "lambdarank", "--target", "log"],
            "error: --target goes with --learner 'ridge', not 'lambdarank'",
        ),
        (["fit-surrogate", "r", "--out", "f"], "error: --out 'f' is a file, not a directory"),
        (["fit-surrogate", "r", "--out", "s", "--lr", "2"], "error: --lr must lie in (0, 1], got 2.0"),
        (["view", "alice", "--out", "f/v.html"], "error: --out 'f/v.html' lies under 'f'"),
        (["view", "alice", "--samples", "0"], "error: --samples must be >= 1, got 0"),
        (["view", "alice", "--budget", "keep=nan"], "error: --budget is invalid"),
        (["tasks", "export", "--out", "f"], "error: --out 'f' is a file, not a directory"),
        (["tasks", "export", "--task", "passkey,passkey", "--out", "t"], "error: --task names 'passkey' twice"),
        (["tasks", "export", "--max-gen-toks", "0", "--out", "t"], "error: --max-gen-toks must be >= 1, got 0"),
    ],
)
def test_errors_name_the_flags_without_an_alias_table(args, line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    monkeypatch.setattr(cli_app, "PARAMETER_ALIASES", {}, raising=False)
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == "" and err.startswith(line) and err.count("\n") == 1, err


def test_fit_surrogate_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    seen = {}

    def run_fit_surrogate(lm, runs, settings, out=None, **kwargs):
        seen.update(runs=runs, settings=settings, out=out)
        raise FIError(STOP)

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    monkeypatch.setattr(ModelSettings, "load", lambda self, **kwargs: _Loaded())
    monkeypatch.setattr("fi_toolkit.surrogate.train.run_fit_surrogate", run_fit_surrogate)
    args = ["fit-surrogate", "r", "--form", "mlp", "--loss", "listwise", "--epochs", "3", "--out", "s"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = SurrogateFitSettings(form="mlp", loss="listwise", epochs=3)
    assert seen == {"runs": [Path("r")], "settings": python, "out": Path("s")}
    assert built["OutDirSettings"] == OutDirSettings(Path("s"))
