"""``fi fit-data`` and ``fi fit`` as settings and a run function (``FitDataSettings`` + ``run_fit_data``,
``FitSettings`` + ``run_fit``): checked on construction with one line naming the Python parameter, the command
line builds the object Python builds (and names its flags in the same messages), ``run_fit`` writes the bytes
``fi fit`` writes from the same runs, the settings modules import nothing heavy, and the command's module
leaves chunks, samples and features to the settings."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import STOP, assert_refused_in_one_line, record_settings, run_cli

from fi_toolkit.errors import FIError
from fi_toolkit.fit.settings import DECODING_FEATURES, DEFAULT_FEATURES, FitDataSettings, FitSettings
from fi_toolkit.policies.learned.features import EXTRA
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.signals.config import SignalConfig

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "pandas", "numpy", "scipy", "transformers", "lightgbm")


@pytest.fixture
def built(monkeypatch):
    """Record the fit settings a command builds; stop ``fi fit-data`` where it loads the model and ``fi fit``
    where it would read the runs."""
    seen = record_settings(monkeypatch, FitDataSettings, FitSettings)
    monkeypatch.setattr("fi_toolkit.cli.fit.run_fit", lambda *args, **kwargs: (_ for _ in ()).throw(FIError(STOP)))
    return seen


def test_fit_data_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["fit-data", "alice", "--chunk", "128:160", "--chunk", "192:224", "--prefix", "120", "--sinks", "4"]
    code, _, err = run_cli([*args, "--samples", "3", "--seed", "7", "--window", "16", "--out", "fd"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = FitDataSettings(["128:160", "192:224"], prefix=120, sinks=4, samples=3, seed=7, signals=SignalConfig(16))
    assert built["FitDataSettings"] == python
    assert python.chunks == (Chunk(128, 160), Chunk(192, 224)) and python.document_tokens() == 224
    assert replace(python, seed=1).prefix == 120  # built again from its fields: the same checks pass


def test_fit_data_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["fit-data", "--chunk", "128:160", "--out", "fd"], capsys)[0] == 2
    default = FitDataSettings(["128:160"])
    assert built["FitDataSettings"] == default
    assert (default.prefix, default.sinks, default.samples, default.seed) == (128, 0, 16, 0)


def test_fit_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["fit", "fd", "--out", "p.json", "--features", "attention, key_norm", "--target", "log", "--ridge", "0.5"]
    code, _, err = run_cli([*args, "--exclude", "alice", "--exclude", "hamlet"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = FitSettings(features=["attention", "key_norm"], target="log", ridge=0.5, exclude=["alice", "hamlet"])
    assert built["FitSettings"] == python
    assert (python.learner, python.features, python.exclude) == (
        "ridge",
        ("attention", "key_norm"),
        ("alice", "hamlet"),
    )


def test_fit_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["fit", "fd", "--out", "p.json"], capsys)[0] == 2
    default = FitSettings()
    assert built["FitSettings"] == default
    assert (default.features, default.target, default.ridge, default.exclude) == (DEFAULT_FEATURES, "rank", 1e-3, ())
    assert FitSettings(features="decoding").features == DECODING_FEATURES
    assert replace(default, exclude=("a",)).target == "rank"  # built again from its fields: the same object


def test_fit_lambdarank_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(
        ["fit", "fd", "--out", "p.json", "--learner", "lambdarank", "--features", "decoding"], capsys
    )
    assert (code, err) == (2, f"error: {STOP}\n")
    python = FitSettings(learner="lambdarank", features="decoding")
    assert built["FitSettings"] == python
    # the learned policy's features add the extra signals; no target or penalty: it ranks within heads
    assert python.features == DECODING_FEATURES + tuple(EXTRA) and (python.target, python.ridge) == (None, None)
    assert FitSettings(learner="lambdarank").features == DEFAULT_FEATURES + tuple(EXTRA)


@pytest.mark.parametrize(
    "make, message, parameter",
    [
        (lambda: FitDataSettings([]), "no chunk given", "chunks"),
        (lambda: FitDataSettings("128:160"), "chunks must be a list", "chunks"),
        (lambda: FitDataSettings(["160:128"]), "invalid chunk '160:128'", None),
        (lambda: FitDataSettings(["128:160"], prefix=150), "starts before the compression point p=150", None),
        (lambda: FitDataSettings(["20:40"]), "prefix 20 leaves nothing to score", "prefix"),
        (lambda: FitDataSettings(["128:160"], sinks=-1), "sinks must lie in [0, 96), got -1", "sinks"),
        (lambda: FitDataSettings(["128:160"], sinks=96), "sinks must lie in [0, 96), got 96", "sinks"),
        (lambda: FitDataSettings(["128:160"], samples=0), "samples must be >= 1, got 0", "samples"),
        (lambda: FitDataSettings(["128:160"], samples=10**6), "samples must be at most", "samples"),
        (lambda: FitDataSettings(["128:160"], samples=2.5), "samples must be a whole number", "samples"),
        (lambda: FitDataSettings(["128:160"], seed=-1), "seed must be >= 0, got -1", "seed"),
        (lambda: FitDataSettings(["128:160"], signals=SignalConfig(alpha=2.0)), "alpha must lie in [0, 1]", "alpha"),
        (lambda: FitDataSettings(["128:160"], signals="w=8"), "signals must be a SignalConfig", "signals"),
        (lambda: FitSettings(learner="forest"), "learner must be ridge or lambdarank, got 'forest'", "learner"),
        (lambda: FitSettings(features="attention,gaze"), "features names an unknown feature 'gaze'", "features"),
        (lambda: FitSettings(features=[]), "features lists no feature", "features"),
        (lambda: FitSettings(features=["key_norm", "key_norm"]), "features lists a feature twice", "features"),
        (lambda: FitSettings(features=5), "features must be a list of names or a string", "features"),
        (lambda: FitSettings(learner="lambdarank", features="depth,gaze"), "unknown feature 'gaze'", "features"),
        (lambda: FitSettings(features="depth"), "unknown feature 'depth'", "features"),  # lambdarank's only
        (lambda: FitSettings(target="top"), "target must be one of rank, log, got 'top'", "target"),
        (lambda: FitSettings(ridge=float("nan")), "ridge must be a finite number >= 0, got nan", "ridge"),
        (lambda: FitSettings(ridge=-1), "ridge must be a finite number >= 0, got -1", "ridge"),
        (lambda: FitSettings(ridge=True), "ridge must be a finite number >= 0, got True", "ridge"),
        (lambda: FitSettings(learner="lambdarank", target="log"), "target goes with learner 'ridge'", "target"),
        (lambda: FitSettings(learner="lambdarank", ridge=0.1), "ridge goes with learner 'ridge'", "ridge"),
        (lambda: FitSettings(exclude="alice"), "exclude must be a list of document names", "exclude"),
        (lambda: FitSettings(exclude=[3]), "exclude must be a str, got 3", "exclude"),
    ],
)
def test_fit_settings_refuse_on_construction_in_one_line(make, message, parameter):
    assert_refused_in_one_line(make, message, parameter)


@pytest.mark.parametrize(
    "args, line",
    [
        (["fit-data", "--chunk", "128:160", "--seed=-1", "--out", "fd"], "error: --seed must be >= 0, got -1"),
        (
            ["fit-data", "--chunk", "128:160", "--sinks", "96", "--out", "fd"],
            "error: --sinks must lie in [0, 96), got 96",
        ),
        (
            ["fit", "fd", "--out", "p.json", "--learner", "forest"],
            "error: --learner must be ridge or lambdarank, got 'forest'",
        ),
        (
            ["fit", "fd", "--out", "p.json", "--learner", "lambdarank", "--target", "log", "--ridge", "1"],
            "error: --target and --ridge go with --learner 'ridge', not 'lambdarank'",
        ),
        (["fit", "fd", "--out", "p.json", "--features", "depth"], "error: --features names an unknown feature 'depth'"),
    ],
)
def test_the_cli_names_its_flags_in_the_settings_messages(args, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(args, capsys)
    assert code == 2 and err.startswith(line), err


def test_run_fit_refuses_before_reading(tmp_path):
    """What the paths alone decide, named by the Python parameter (the command line: its flag)."""
    from fi_toolkit.fit.run import run_fit

    (tmp_path / "p.json").write_text("{}\n")
    for runs, out, message, parameter in (
        ([tmp_path / "nowhere"], None, "is not a run directory", None),
        ([tmp_path], None, "holds no per-token FI per layer and KV head", None),
        ([], None, "runs must list fi fit-data run directories", "runs"),
        ([tmp_path], tmp_path / "p.txt", "out_file must end in .json, got", "out_file"),
        ([tmp_path], tmp_path / "p.json", "exists; choose another file or pass overwrite", "out_file"),
    ):
        with pytest.raises(FIError, match=message) as exc:
            run_fit(FitSettings(), runs, out)
        assert exc.value.parameter == parameter
    with pytest.raises(FIError, match="settings must be a FitSettings"):
        run_fit("ridge", [tmp_path])
    assert (tmp_path / "p.json").read_text() == "{}\n"


def test_run_fit_data_refuses_before_the_model(tmp_path):
    from fi_toolkit.fit.run import run_fit_data
    from fi_toolkit.runs.settings import RunSettings

    settings = FitDataSettings(["128:160"])
    with pytest.raises(FIError, match="no document given"):
        run_fit_data(None, [], settings)
    with pytest.raises(FIError, match="fit data does not resume") as exc:
        run_fit_data(None, ["doc"], settings, RunSettings(tmp_path / "o", resume=True))
    assert exc.value.parameter == "resume"
    with pytest.raises(FIError, match="settings must be a FitDataSettings"):
        run_fit_data(None, ["doc"], FitSettings())


def _fit_data_run(root: Path, documents: list[str]) -> Path:
    """A small ``fi fit-data`` run (two features' worth of rows, FI a noisy function of them), no model."""
    import numpy as np
    import pandas as pd

    from fi_toolkit.fit.settings import DEFAULT_FEATURES
    from fi_toolkit.runs import results

    rng = np.random.default_rng(0)
    n = 40
    frames = []
    for d in documents:
        frame = pd.DataFrame(
            {"document": d, "layer": np.repeat([0, 1], n // 2), "head": 0, "position": np.tile(range(n // 2), 2)}
        )
        for f in (*DEFAULT_FEATURES, *[e for e in EXTRA if e not in ("depth", "kv_head")]):
            frame[f] = rng.random(n)
        frame["fi"] = np.exp(frame["attention"] * 3 + rng.normal(0, 0.3, n))
        frames.append(frame)
    out = root / "fd"
    out.mkdir()
    results.write_table(out / "fit_rows.parquet", pd.concat(frames, ignore_index=True))
    signals = {"window": 2, "top_k": 8, "pool_kernel": 1, "tau": 1.0, "entropy_of": "produced", "final_norm": False}
    manifest = {
        "command": "fit-data",
        "model": {"name": "tiny", "layers": 2, "kv_heads": 1, "head_dim": 4},
        "signals": signals,
        "prefix": 22,
        "chunks": ["22:30"],
        "sinks": 0,
        "samples": 1,
        "documents": [{"name": d, "source": "test", "sha256": "-"} for d in documents],
    }
    results.write_json(out / "manifest.json", manifest)
    return out


@pytest.mark.parametrize("learner", ["ridge", "lambdarank"])
def test_run_fit_writes_what_fi_fit_writes(learner, tmp_path, monkeypatch, capsys):
    """The same runs and options: ``run_fit`` returns the record and writes the bytes ``fi fit`` writes."""
    if learner == "lambdarank":
        pytest.importorskip("lightgbm")
    from fi_toolkit.fit.ridge import policy_json
    from fi_toolkit.fit.run import run_fit

    monkeypatch.chdir(tmp_path)
    _fit_data_run(tmp_path, ["a", "b", "c"])
    features = "attention,key_norm" if learner == "ridge" else "attention,key_norm,depth"
    code, _, err = run_cli(
        ["fit", "fd", "--learner", learner, "--features", features, "--exclude", "c", "--out", "cli.json"], capsys
    )
    assert code == 0, err
    record = run_fit(FitSettings(learner, features, exclude=["c"]), "fd", "py.json")
    assert (tmp_path / "py.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    assert policy_json(record) == (tmp_path / "py.json").read_text()
    assert record["documents"] == ["a", "b"] and record["fitted_on"]["runs"] == ["fd"]
    assert [d["name"] for d in record["fitted_on"]["documents"]] == ["a", "b"]
    assert run_fit(FitSettings(learner, features, exclude=["c"]), ["fd"]) == record  # None: nothing written


def test_the_settings_modules_import_nothing_heavy():
    code = (
        "import sys; from fi_toolkit.fit.settings import FitDataSettings, FitSettings; "
        "import fi_toolkit.fit.run, fi_toolkit.cli.fit; "
        "FitDataSettings(['128:160']); FitSettings(); FitSettings(learner='lambdarank', features='decoding'); "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "[]"


def test_settings_are_frozen():
    for s, name in ((FitDataSettings(["128:160"]), "prefix"), (FitSettings(), "ridge")):
        with pytest.raises(AttributeError):
            setattr(s, name, 1)


def test_the_command_module_leaves_the_checks_to_the_settings():
    """cli/fit.py imports the settings, the run functions and command-line helpers: chunks, samples and features
    are the settings' to check, rows and fits the run functions' to compute."""
    tree = ast.parse((ROOT / "fi_toolkit" / "cli" / "fit.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    kept_out = ("fi_toolkit.probe", "fi_toolkit.policies.learned", "pandas", "torch")
    assert not [m for m in imported if m.startswith(kept_out)]
    fit = {m for m in imported if m.startswith("fi_toolkit.fit")}
    assert fit == {"fi_toolkit.fit.settings", "fi_toolkit.fit.run"}
    assert sorted(m for m in imported if m.startswith("fi_toolkit.") and not m.startswith("fi_toolkit.cli")) == [
        "fi_toolkit.documents",
        "fi_toolkit.fit.run",
        "fi_toolkit.fit.settings",
        "fi_toolkit.model.settings",
        "fi_toolkit.report.numbers",
        "fi_toolkit.runs",
        "fi_toolkit.runs.settings",
        "fi_toolkit.signals.config",
    ]
