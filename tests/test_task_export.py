"""``fi tasks export`` as settings and a run function: Python's TaskExportSettings + run_task_export write the
files the command line writes, byte for byte; the settings refuse bad values in one line naming the parameter."""

from __future__ import annotations

import pytest

from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.lmeval.export_settings import TaskExportSettings


@pytest.mark.smollm
def test_run_task_export_writes_what_the_command_line_writes(tmp_path, capsys):
    from cli_runner import run_cli

    from fi_toolkit.evaluation.lmeval.export_run import run_task_export
    from fi_toolkit.model.loading import load_model

    args = ["--task", "passkey,variable_tracking", "--context", "200", "--samples", "2", "--seed", "3"]
    code, printed, err = run_cli(
        ["tasks", "export", *args, "--max-gen-toks", "9", "--out", str(tmp_path / "cli")], capsys
    )
    assert code == 0, err
    settings = TaskExportSettings(["passkey", "variable_tracking"], context=200, samples=2, seed=3, max_gen_toks=9)
    yamls = run_task_export(load_model(), settings, tmp_path / "py")
    assert [p.name for p in yamls] == ["fi_passkey.yaml", "fi_variable_tracking.yaml"]
    assert "".join(printed.split()) == "".join(str(tmp_path / "cli" / p.name) for p in yamls)  # (rich wraps)
    ours = sorted(p.name for p in (tmp_path / "py").iterdir())
    assert ours == sorted(settings.files()) == sorted(p.name for p in (tmp_path / "cli").iterdir())
    for name in ours:  # the YAMLs name their data file by its absolute path: the two directories differ there
        py, cli = ((tmp_path / d / name).read_text() for d in ("py", "cli"))
        assert py.replace(str(tmp_path / "py"), "OUT") == cli.replace(str(tmp_path / "cli"), "OUT"), name
    with pytest.raises(FIError, match="already holds fi_scoring.py"):
        run_task_export(load_model(), settings, tmp_path / "py")


@pytest.mark.parametrize(
    "kwargs, parameter, words",
    [
        (dict(tasks="passkey,nope"), "tasks", "unknown task nope"),
        (dict(tasks=""), "tasks", "unknown task (none)"),
        (dict(tasks=["passkey", "passkey"]), "tasks", "names 'passkey' twice"),
        (dict(context=0), "context", "context must be >= 1"),
        (dict(samples=1.5), "samples", "samples must be a whole number"),
        (dict(max_gen_toks=0), "max_gen_toks", "max_gen_toks must be >= 1"),
        (dict(seed=-1), "seed", "seed must be >= 0"),
    ],
)
def test_task_export_settings_refuse_in_one_line(kwargs, parameter, words):
    with pytest.raises(FIError) as caught:
        TaskExportSettings(**kwargs)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.parameter == parameter


def test_task_export_settings_are_frozen_and_parsed():
    settings = TaskExportSettings(" passkey , multikey_needle ")
    assert settings.tasks == ("passkey", "multikey_needle")
    with pytest.raises(AttributeError):
        settings.context = 5
