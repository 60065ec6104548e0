"""Settings objects: the commands build the same objects as Python does, each check() refuses
bad values with one line, and the library entry points take them (results equal to the keyword forms)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import typer
from cli_runner import run_cli

from fi_toolkit import Document
from fi_toolkit.cli.app import app
from fi_toolkit.errors import FIError
from fi_toolkit.evaluation.settings import TaskSettings
from fi_toolkit.model import loading
from fi_toolkit.model.settings import ModelSettings
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies import NearfarSettings, run_nearfar

STOP = "stop here"


@pytest.fixture
def built(monkeypatch):
    """Record every settings object a command checks, and stop the command where it would load the model."""
    seen: dict = {}

    def recorder(cls):
        original = cls.check

        def check(self, *args):
            seen[cls.__name__] = self
            return original(self, *args)

        monkeypatch.setattr(cls, "check", check)

    for cls in (ModelSettings, SignalConfig, RunSettings, TaskSettings):
        recorder(cls)

    def stop(self, **kwargs):
        raise FIError(STOP)

    monkeypatch.setattr(ModelSettings, "load", stop)
    return seen


SIGNAL_ARGS = ["--window", "16", "--top-k", "64", "--alpha", "0.5", "--tau", "2", "--pool", "3", "--entropy-of", "next"]
SIGNALS = SignalConfig(top_k=64, window=16, pool_kernel=3, tau=2.0, alpha=0.5, entropy_of="next")
MODEL_ARGS = ["--model", "some/model", "--device-map", "auto", "--dtype", "bfloat16", "--no-upcast"]
MODEL = ModelSettings("some/model", None, "auto", "bfloat16", False)


@pytest.mark.parametrize(
    "command, run",
    [
        (["probe", "--chunk", "128:160"], None),
        (["scores", "--prefix", "128"], RunSettings(Path("scores.csv"))),  # the table's file
        (["correlate", "--chunk", "128:160", "--out", "c", "--resume"], RunSettings(Path("c"), resume=True)),
        (["nearfar", "--prefix", "128", "--out", "n", "--overwrite"], RunSettings("n", overwrite=True)),
        (["eval", "--prompt", "512", "--length", "1024", "--out", "e"], RunSettings(Path("e"))),
    ],
)
def test_cli_builds_what_python_builds(command, run, built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([*command, *MODEL_ARGS, *SIGNAL_ARGS], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    assert built["ModelSettings"] == MODEL and built["SignalConfig"] == SIGNALS
    assert built.get("RunSettings") == run


@pytest.mark.parametrize(
    "command, run",
    [
        (["probe", "--chunk", "128:160"], None),
        (["scores", "--prefix", "128"], RunSettings(Path("scores.csv"))),  # the table's file
        (["correlate", "--chunk", "128:160"], RunSettings(Path("runs/correlate"))),
        (["nearfar"], RunSettings(Path("runs/nearfar"))),
        (["eval"], RunSettings(Path("runs/eval"))),
    ],
)
def test_cli_defaults_are_the_dataclass_defaults(command, run, built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(command, capsys)[0] == 2
    assert built["ModelSettings"] == ModelSettings() and built["SignalConfig"] == SignalConfig()
    assert built.get("RunSettings") == run


def test_eval_tasks_builds_task_settings(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(
        [
            "eval",
            "--task",
            "niah,passkey",
            "--context",
            "600,900",
            "--samples",
            "3",
            "--protocol",
            "question-aware,question-agnostic",
            "--max-new",
            "5",
        ],
        capsys,
    )
    assert (code, err) == (2, f"error: {STOP}\n")
    assert built["TaskSettings"] == TaskSettings(
        ("niah", "passkey"), (600, 900), 3, ("question-aware", "question-agnostic"), 5
    )
    assert built["TaskSettings"].check().tasks == ("multikey_needle", "passkey")  # aliases resolved


def test_generate_model_settings(monkeypatch, capsys):
    seen = {}

    def stop(self, **kwargs):
        seen["model"] = self
        raise FIError(STOP)

    monkeypatch.setattr(ModelSettings, "load", stop)
    assert run_cli(["generate", "hi", "--policy", "none", "--dtype", "float16"], capsys)[0] == 2
    assert seen["model"] == ModelSettings(dtype="float16", upcast=False)  # generate computes in the weights' dtype
    code, _, err = run_cli(["generate", "hi", "--device-map", "auto"], capsys)  # generate has no --device-map
    assert code == 2 and "No such option" in err


def test_help_defaults_are_the_fields(monkeypatch):
    """Every settings option of every command: the flags and default the field's metadata declares."""
    commands = typer.main.get_command(app).commands
    for name in ("probe", "scores", "correlate", "nearfar", "eval", "generate"):
        options = {p.name: p for p in commands[name].params}
        for cls in (ModelSettings, SignalConfig):
            default = ModelSettings(upcast=False) if (name, cls) == ("generate", ModelSettings) else cls()
            for f in dataclasses.fields(cls):
                if "flags" not in f.metadata or (name, f.name) == ("generate", "device_map"):
                    continue
                param = options[f"{'model' if cls is ModelSettings else 'signals'}__{f.name}"]
                flags = [flag for spec in f.metadata["flags"] for flag in spec.split("/")]
                assert set(param.opts + param.secondary_opts) == set(flags), (name, f.name)
                assert param.default == getattr(default, f.name), (name, f.name)


NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SignalConfig(alpha=NAN), "alpha must lie in [0, 1], got nan"),
        (lambda: SignalConfig(alpha=-0.1), "alpha must lie in [0, 1], got -0.1"),
        (lambda: SignalConfig(tau=INF), "tau must be a finite number, got inf"),
        (lambda: SignalConfig(tau=NAN), "tau must be a finite number, got nan"),
        (lambda: SignalConfig(window=-1), "window must be >= 1, got -1"),
        (lambda: SignalConfig(window=True), "window must be a whole number, got True"),
        (lambda: SignalConfig(top_k=1.5), "top_k must be a whole number, got 1.5"),
        (lambda: SignalConfig(top_k="64"), "top_k must be a whole number, got '64'"),
        (lambda: SignalConfig(pool_kernel=4), "pool_kernel must be an odd number >= 1, got 4"),
        (lambda: SignalConfig(pool_kernel=-3), "pool_kernel must be >= 1, got -3"),
        (lambda: SignalConfig(entropy_of="previous"), "entropy_of must be one of produced, next, got 'previous'"),
        (lambda: SignalConfig(alpha="0.5"), "alpha must be a number, got '0.5'"),
        (lambda: ModelSettings(model=3), "model must be a str, got 3"),
        (lambda: ModelSettings(device=0), "device must be a str or None, got 0"),
        (lambda: ModelSettings(upcast="yes"), "upcast must be a bool, got 'yes'"),
        (lambda: ModelSettings(device="cpu", device_map="auto"), "it does not go with device"),
        (lambda: ModelSettings(device_map="{bad json"), "is not valid JSON"),
        (lambda: RunSettings(out=3), "out must be a Path, got 3"),
        (lambda: RunSettings(resume=1), "resume must be a bool, got 1"),
        (lambda: RunSettings(resume=True, overwrite=True), "resume and overwrite contradict each other"),
        (lambda: TaskSettings(samples=0), "samples must lie in [1, 1,000], got 0"),
        (lambda: TaskSettings(samples=NAN), "samples must lie in [1, 1,000], got nan"),
        (lambda: TaskSettings(samples=10**12), "samples must lie in [1, 1,000]"),
        (lambda: TaskSettings(max_new=-1), "max_new must be >= 1, got -1"),
        (lambda: TaskSettings(max_new=INF), "max_new must be a whole number, got inf"),
        (lambda: TaskSettings(contexts=(0,)), "contexts must be >= 1, got 0"),
        (lambda: TaskSettings(contexts=(1.5,)), "contexts must be a whole number, got 1.5"),
        (lambda: TaskSettings(tasks=("sudoku",)), "unknown task 'sudoku'"),
        (
            lambda: TaskSettings(tasks=("niah", "multikey_needle")),
            "tasks names one task twice: 'niah' and 'multikey_needle' are both multikey_needle",
        ),
        (lambda: TaskSettings(protocols=("question-first",)), "unknown protocol 'question-first'"),
        (lambda: TaskSettings(tasks="passkey"), "tasks must be a tuple, got 'passkey'"),
    ],
)
def test_check_refuses_in_one_line(make, message):
    with pytest.raises(FIError) as exc:
        make().check()
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_checks_pass_the_defaults():
    assert SignalConfig().check() == SignalConfig() and ModelSettings().check() == ModelSettings()
    assert RunSettings().check() == RunSettings(Path("runs")) and TaskSettings().check() == TaskSettings()
    assert TaskSettings(tasks=["passkey"], contexts=[512]) == TaskSettings(("passkey",), (512,))  # lists: tuples


def test_model_settings_load_is_load_model(monkeypatch):
    calls = []
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: calls.append((a, k)))
    ModelSettings("m", "cpu", None, "float16", False).load(attn_implementation="eager")
    ModelSettings("m", None, '{"model": "cpu"}').load()
    assert calls == [
        (("m", "cpu", "float16"), {"upcast": False, "device_map": None, "attn_implementation": "eager"}),
        (("m", None, "float32"), {"upcast": True, "device_map": {"model": "cpu"}}),
    ]
    assert loading.DEFAULT_MODEL == ModelSettings().model


def test_run_settings_equal_the_directory_form(tiny, tmp_path):
    """run_nearfar with a RunSettings writes what it writes given the directory alone (and resumes alike)."""
    doc = Document("doc", "text", torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(5)), "test")
    settings = NearfarSettings(96, [0, 32], 16, budget="remove=0.1", seeds=1, signals=SignalConfig(window=8))
    by_directory = run_nearfar(tiny, [doc], settings, tmp_path / "a")
    by_settings = run_nearfar(tiny, [doc], settings, RunSettings(tmp_path / "b"))
    for name in ("nearfar", "nearfar_summary", "token_class_summary"):
        pd.testing.assert_frame_equal(by_directory[name], by_settings[name])
    resumed = run_nearfar(tiny, [doc], settings, RunSettings(tmp_path / "b", resume=True))
    pd.testing.assert_frame_equal(resumed["nearfar"], by_directory["nearfar"])
    with pytest.raises(FIError, match="already holds results"):
        run_nearfar(tiny, [doc], settings, RunSettings(tmp_path / "b"))


def test_the_cli_parses_without_heavy_imports():
    """Importing the command line (with a lazy package root) imports no torch, transformers, pandas, scipy, seaborn:
    the settings dataclasses it reads while parsing live in light modules."""
    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('fi_toolkit'); pkg.__path__ = [{str(Path(loading.__file__).parents[1])!r}]\n"
        "sys.modules['fi_toolkit'] = pkg\n"
        "import fi_toolkit.cli.app\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'pandas', 'scipy', 'seaborn')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
