"""Command settings (``ProbeSettings``, ``FieldSettings``, ``CorrelateSettings``, ``NearfarSettings``, the eval
settings, ``ScoresSettings``, ``GenerateSettings``): checked on construction with one line naming the Python
parameter, the command line builds the object Python builds (and names its flags in the same messages), the
parsed values are what the options say, and the settings modules import nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runner import STOP, assert_refused_in_one_line, record_settings, run_cli

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.field.settings import FieldSettings
from fi_toolkit.policies.method import POLICY, Method
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.signals.config import SignalConfig
from fi_toolkit.studies.correlate_settings import CorrelateSettings
from fi_toolkit.studies.nearfar_settings import NearfarSettings
from fi_toolkit.studies.probe_settings import DEFAULT_SELECTIONS, ProbeSettings


@pytest.fixture
def built(monkeypatch):
    """Record every command settings object built, and stop the command where it would load the model."""
    return record_settings(monkeypatch, ProbeSettings, FieldSettings, CorrelateSettings, NearfarSettings)


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
    assert built["ProbeSettings"] == default == ProbeSettings(["128:160"], DEFAULT_SELECTIONS)  # None: the default
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
    assert python.methods == (Method(POLICY, "snapkv"), Method(POLICY, "infokv", options="alpha=0.5"))
    assert not python.presses
    assert python.budgets == (Budget.parse("keep=0.5"), Budget.parse("remove=0.25"))
    assert python.chunks == [Chunk(128, 144), Chunk(160, 176)] and python.document_tokens() == 200


def test_field_without_methods_places_every_policy_and_the_presses():
    from fi_toolkit.policies.registry import POLICY as REGISTRY_POLICY
    from fi_toolkit.policies.registry import entries

    s = FieldSettings(prefix=256, distances=(0,), chunk_len=32)
    assert s.presses and [m.name for m in s.methods] == [e.name for e in entries() if e.kind == REGISTRY_POLICY]
    assert s.document_tokens() == 288 and s.replay_length() is None
    assert not FieldSettings(methods=["h2o"], prefix=256, distances=(0,), chunk_len=32).presses


def test_field_task_options_build_what_python_builds(built, tmp_path, monkeypatch, capsys):
    """fi field's --task group (FieldTasks: the lists as typed) becomes FieldSettings' TaskSettings."""
    from fi_toolkit.evaluation.settings import TaskSettings
    from fi_toolkit.field.settings import FieldTasks

    monkeypatch.chdir(tmp_path)
    args = ["field", "alice", "--policy", "snapkv", "--budget", "0.5", "--prefix", "128", "--distances", "0,32"]
    args += [
        "--chunk-len",
        "16",
        "--task",
        "passkey,niah",
        "--task-context",
        "300,400",
        "--task-samples",
        "2",
        "--max-new",
        "5",
    ]
    code, _, err = run_cli([*args, "--out", "o"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    tasks = TaskSettings(("passkey", "niah"), (300, 400), 2, max_new=5)
    common = dict(methods=["snapkv"], budgets=["keep=0.5"], prefix=128, distances="0,32", chunk_len=16)
    python = FieldSettings(**common, tasks=tasks)
    assert built["FieldSettings"] == python and python.tasks.tasks == ("passkey", "multikey_needle")
    spelled = FieldTasks("passkey,niah", "300,400", samples=2, max_new=5)
    assert FieldSettings(**common, tasks=spelled) == python
    assert FieldTasks().task_settings() is None


def test_field_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["field", "alice", "--out", "o"], capsys)[0] == 2
    default = FieldSettings()
    assert built["FieldSettings"] == default and default.tasks is None and default.presses
    assert (default.prefix, default.distances, default.chunk_len, default.seeds) == (1024, (0, 256), 128, 3)


def test_correlate_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["correlate", "--chunk", "128:160", "--chunk", "192:224", "--prefix", "120", "--candidates", "stratified:32"]
    args += ["--sinks", "2", "--seed", "5", "--resamples", "40", "--batch-size", "3", "--unit-candidates", "8"]
    code, _, err = run_cli([*args, "--window", "16"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = CorrelateSettings(
        ["128:160", "192:224"],
        prefix=120,
        candidates="stratified:32",
        sinks=2,
        seed=5,
        resamples=40,
        signals=SignalConfig(window=16),
        batch_size=3,
        unit_candidates=8,
    )
    assert built["CorrelateSettings"] == python
    assert python.chunks == (Chunk(128, 160), Chunk(192, 224)) and python.document_tokens() == 224
    assert (python.estimator, python.samples, python.validate) == ("exact", None, None)


def test_correlate_fisher_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["correlate", "--chunk", "128:160", "--estimator", "FISHER", "--validate", "6", "--batch-size", "2"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = CorrelateSettings(["128:160"], estimator="fisher", validate=6, batch_size=2)
    assert built["CorrelateSettings"] == python
    # the fisher estimate covers every position: no candidates; 16 label draws unless told
    assert (python.estimator, python.candidates, python.samples, python.validate) == ("fisher", None, 16, 6)
    assert replace(python, seed=3).seed == 3 and replace(python, seed=3).samples == 16  # built again: same checks


def test_correlate_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["correlate", "--chunk", "128:160"], capsys)[0] == 2
    default = CorrelateSettings(["128:160"])
    assert built["CorrelateSettings"] == default
    assert (default.prefix, default.candidates, default.sinks, default.resamples) == (128, "sample:256", 4, 1000)
    assert replace(default, seed=1).candidates == "sample:256"


def test_nearfar_cli_builds_what_python_builds(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["nearfar", "--prefix", "128", "--distances", "0,64", "--chunk-len", "32", "--budget", "keep=0.8"]
    args += ["--seeds", "2", "--sinks", "2", "--protected-only", "--batch-size", "4", "--unit-sets", "3"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = NearfarSettings(
        prefix=128,
        distances="0,64",
        chunk_len=32,
        budget="keep=0.8",
        seeds=2,
        sinks=2,
        with_unprotected=False,
        batch_size=4,
        unit_sets=3,
    )
    assert built["NearfarSettings"] == python
    assert python.distances == (0, 64) and python.budget == Budget.parse("keep=0.8") and python.sink_options == (2,)
    assert python.chunks == [Chunk(128, 160), Chunk(192, 224)] and python.document_tokens() == 224


def test_nearfar_defaults_are_the_cli_defaults(built, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["nearfar"], capsys)[0] == 2
    default = NearfarSettings()
    assert built["NearfarSettings"] == default
    assert default.distances == (0, 256, 512, 1024) and default.sink_options == (4, 0)
    assert default.document_tokens() == 1024 + 1024 + 256 and NearfarSettings(sinks=0).sink_options == (0,)


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
        (lambda: ProbeSettings(["128:160"], ["magic:0.1"]), "unknown selector 'magic'", "selections"),
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
        (lambda: CorrelateSettings([]), "no chunk given", "chunks"),
        (lambda: CorrelateSettings(["128:160"], prefix=150), "starts before the compression point p=150", None),
        (lambda: CorrelateSettings(["128:160"], sinks=99999), "sinks 99999 leaves no candidates", "sinks"),
        (lambda: CorrelateSettings(["128:160"], estimator="taylor"), "unknown estimator 'taylor'", "estimator"),
        (lambda: CorrelateSettings(["128:160"], samples=8), "samples and validate go with estimator fisher", "samples"),
        (
            lambda: CorrelateSettings(["128:160"], estimator="fisher", candidates="all"),
            "candidates goes with estimator exact",
            "candidates",
        ),
        (
            lambda: CorrelateSettings(["128:160"], estimator="fisher", batch_size=4),
            "batch_size sets the batches of exact FI: with estimator fisher it needs validate N",
            "batch_size",
        ),
        (
            lambda: CorrelateSettings(["128:160"], estimator="fisher", validate=93),
            "validate 93 must lie in [0, 92], the number of candidate positions",
            "validate",
        ),
        (lambda: CorrelateSettings(["128:160"], estimator="fisher", samples=0), "samples must be >= 1", "samples"),
        (lambda: CorrelateSettings(["128:160"], candidates="some"), "invalid candidates 'some'", "candidates"),
        (
            lambda: CorrelateSettings(["128:160"], estimator="fisher", unit_candidates=8),
            "unit_candidates splits exact per-token FI",
            "unit_candidates",
        ),
        (lambda: CorrelateSettings(["128:160"], resamples=-1), "resamples must lie in [0, 100,000]", "resamples"),
        (lambda: CorrelateSettings(["128:160"], batch_size=0), "batch_size must be >= 1, got 0", "batch_size"),
        (lambda: CorrelateSettings(["128:160"], seed=-1), "seed must be >= 0, got -1", "seed"),
        (lambda: NearfarSettings(distances="0,x"), "invalid distances '0,x'", "distances"),
        (lambda: NearfarSettings(distances=(0, 0)), "distances holds a distance twice", "distances"),
        (lambda: NearfarSettings(chunk_len=0), "chunk_len must be >= 1, got 0", "chunk_len"),
        (lambda: NearfarSettings(seeds=0), "seeds must lie in [1, 1000], got 0", "seeds"),
        (lambda: NearfarSettings(budget="remove=1.0"), "removes nothing or everything", "budget"),
        (lambda: NearfarSettings(prefix=128, budget="remove=0.001"), "removes 0 of the 128 prefix positions", None),
        (lambda: NearfarSettings(prefix=16), "prefix 16 leaves nothing to score", "prefix"),
        (lambda: NearfarSettings(prefix=128, sinks=99999), "sinks 99999 leaves no candidates", "sinks"),
        (lambda: NearfarSettings(batch_size=0), "batch_size must be >= 1, got 0", "batch_size"),
        (lambda: NearfarSettings(unit_sets=-2), "unit_sets must be >= 0 (0: one unit per document)", "unit_sets"),
        (lambda: NearfarSettings(with_unprotected="yes"), "with_unprotected must be a bool", "with_unprotected"),
        (lambda: NearfarSettings(selections="entropy:remove=0.1"), "selections must be a list", "selections"),
        (lambda: NearfarSettings(selections=["magic:0.1"]), "unknown selector 'magic'", None),
    ],
)
def test_settings_refuse_on_construction_in_one_line(make, message, parameter):
    assert_refused_in_one_line(make, message, parameter)


@pytest.mark.parametrize(
    "args, line",
    [
        (["probe", "--chunk", "128:160", "--batch-size", "0"], "error: --batch-size must be >= 1, got 0"),
        (["probe", "--chunk", "128:160", "--sinks", "-1"], "error: --sinks must be >= 0, got -1"),
        (["field", "alice", "--prefix", "256", "--seeds", "0"], "error: --seeds must lie in [1, 1000], got 0"),
        (["correlate", "--chunk", "128:160", "--seed=-1"], "error: --seed must be >= 0, got -1"),
        (
            ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--candidates", "all"],
            "error: --candidates goes with --estimator exact: --estimator fisher covers every position of "
            "[sinks, p - w) (use --validate N for exact FI at N of them)",
        ),
        (
            ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--batch-size", "4"],
            "error: --batch-size sets the batches of exact FI: with --estimator fisher it needs --validate N",
        ),
        (
            ["correlate", "--chunk", "128:160", "--samples", "8"],
            "error: --samples and --validate go with --estimator fisher",
        ),
        (["nearfar", "--chunk-len", "0"], "error: --chunk-len must be >= 1, got 0"),
        (["nearfar", "--unit-sets=-2"], "error: --unit-sets must be >= 0 (0: one unit per document), got -2"),
        (
            ["nearfar", "--prefix", "128", "--budget", "remove=0.001"],
            "error: --budget remove=0.001 removes 0 of the 128 prefix positions; give a larger share or a count",
        ),
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


def test_report_cli_builds_what_python_builds(tmp_path, monkeypatch, capsys):
    """``fi report``'s formats are a ReportSettings; its directory a RunSettings whose messages name ``--out``."""
    from fi_toolkit.report.report_settings import ReportSettings, report_dir

    monkeypatch.chdir(tmp_path)
    built = record_settings(monkeypatch, ReportSettings)
    code, _, err = run_cli(["report", "missing", "--format", "MD, html"], capsys)
    assert code == 2 and "'missing' does not exist" in err
    assert built["ReportSettings"] == ReportSettings("md,html") == ReportSettings(["MD", "html"])
    assert ReportSettings().formats == ("html", "md", "csv", "json")
    assert_refused_in_one_line(lambda: ReportSettings("pdf"), "invalid format 'pdf'", "formats")
    assert_refused_in_one_line(lambda: ReportSettings(["md", 3]), "formats must be a str, got 3", "formats")
    (tmp_path / "run").mkdir()
    assert_refused_in_one_line(
        lambda: report_dir(RunSettings("run"), ["run"]), "out_dir 'run' is the result directory 'run'", "out"
    )
    assert_refused_in_one_line(lambda: report_dir(RunSettings("r", resume=True), []), "does not resume", "resume")
    assert report_dir(RunSettings("r"), ["run"]) == RunSettings("r") and not (tmp_path / "r").exists()


def test_the_settings_modules_import_nothing_heavy():
    code = (
        "import sys; import fi_toolkit.studies.probe_settings, fi_toolkit.field.settings; "
        "from fi_toolkit.field.settings import FieldSettings; FieldSettings(prefix=256); "
        "from fi_toolkit.studies.correlate_settings import CorrelateSettings; CorrelateSettings(['128:160']); "
        "from fi_toolkit.studies.nearfar_settings import NearfarSettings; NearfarSettings(); "
        "from fi_toolkit.report.report_settings import ReportSettings; ReportSettings(); "
        "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'transformers', 'matplotlib') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert done.stdout.strip() == "[]"


# ---- fi eval: TextEvalSettings (documents) and TaskEvalSettings (--task) ------------------------------------


@pytest.fixture
def built_eval(monkeypatch):
    """Record the eval settings objects a command builds, and stop it where it would load the model."""
    from fi_toolkit.evaluation.settings import TaskEvalSettings, TextEvalSettings

    return record_settings(monkeypatch, TextEvalSettings, TaskEvalSettings)


def test_eval_text_cli_builds_what_python_builds(built_eval, tmp_path, monkeypatch, capsys):
    from fi_toolkit.compress.future import DOCUMENT
    from fi_toolkit.evaluation.settings import TextEvalSettings

    monkeypatch.chdir(tmp_path)
    args = ["eval", "alice", "--policy", "snapkv,infokv:alpha=0.5,tau=2", "--budget", "0.5,remove=0.25"]
    args += ["--prompt", "128", "--length", "224", "--interval", "32", "--free-tokens", "8", "--resamples", "50"]
    code, _, err = run_cli([*args, "--window", "16", "--unit-policies", "2", "--out", "o"], capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = TextEvalSettings(
        policies=["snapkv", "infokv:alpha=0.5,tau=2"],
        budgets=["keep=0.5", "remove=0.25"],
        interval=32,
        resamples=50,
        signals=SignalConfig(window=16),
        prompt=128,
        length=224,
        free_tokens=8,
        unit_policies=2,
    )
    assert built_eval["TextEvalSettings"] == python
    assert built_eval["TextEvalSettings"].policy_runs() == python.policy_runs()
    # what the options say, parsed: each policy at each budget, name by name; 224 tokens per document
    assert python.policies == ("snapkv", "infokv:alpha=0.5,tau=2") and python.future == DOCUMENT
    assert python.budgets == (Budget.parse("keep=0.5"), Budget.parse("remove=0.25"))
    labels = ["snapkv@keep=0.5", "snapkv@remove=0.25", "infokv:alpha=0.5,tau=2.0@keep=0.5"]
    assert [p.label for p in python.policy_runs()] == [*labels, "infokv:alpha=0.5,tau=2.0@remove=0.25"]
    assert {p.window for p in python.policy_runs()} == {16}
    assert (python.document_tokens(), python.text_setting().total()) == (224, 224)


def test_eval_text_defaults_are_the_cli_defaults(built_eval, tmp_path, monkeypatch, capsys):
    from fi_toolkit.evaluation.settings import TextEvalSettings

    monkeypatch.chdir(tmp_path)
    assert run_cli(["eval", "--out", "o"], capsys)[0] == 2
    default = TextEvalSettings()
    assert built_eval["TextEvalSettings"] == default
    assert len(default.policy_runs()) == 7 * 3 and default.budgets[0] == Budget.parse("keep=0.1")
    assert (default.prompt, default.document_tokens(), default.interval, default.free_tokens) == (1024, 2048, 256, 64)
    generated = TextEvalSettings(policies="snapkv", budgets="0.5", prompt=128, future="generated:64")
    assert (generated.document_tokens(), generated.text_setting().total()) == (128, 192)  # the model writes 64


def test_eval_task_cli_builds_what_python_builds(built_eval, tmp_path, monkeypatch, capsys):
    from fi_toolkit.evaluation.settings import TaskEvalSettings, TaskSettings

    monkeypatch.chdir(tmp_path)
    args = ["eval", "--task", "niah,passkey", "--context", "300,400", "--samples", "2", "--max-new", "5"]
    args += ["--policy", "snapkv", "--budget", "0.5", "--interval", "8", "--resamples", "20", "--out", "o"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    tasks = TaskSettings(("niah", "passkey"), (300, 400), 2, max_new=5)
    python = TaskEvalSettings(policies=["snapkv"], budgets=["keep=0.5"], interval=8, resamples=20, tasks=tasks)
    assert built_eval["TaskEvalSettings"] == python and "TextEvalSettings" not in built_eval
    assert python.tasks.tasks == ("multikey_needle", "passkey")  # checked on construction: aliases resolved
    assert [p.label for p in python.policy_runs()] == ["snapkv@keep=0.5"]


def test_eval_options_build_the_settings_of_their_kind():
    """EvalOptions (fi eval's options as typed) -> a TextEvalSettings, or with tasks a TaskEvalSettings."""
    from fi_toolkit.evaluation.settings import EvalOptions, TaskEvalSettings, TaskSettings, TextEvalSettings

    assert EvalOptions().settings() == TextEvalSettings()
    typed = EvalOptions("snapkv", "0.5", tasks="niah,passkey", contexts="300,400", samples=2, max_new=5)
    tasks = TaskSettings(("niah", "passkey"), (300, 400), 2, max_new=5)
    assert typed.settings(SignalConfig(window=16)) == TaskEvalSettings(
        policies=["snapkv"], budgets=["keep=0.5"], signals=SignalConfig(window=16), tasks=tasks
    )


def _text(**kwargs):
    from fi_toolkit.evaluation.settings import TextEvalSettings

    return TextEvalSettings(**{"policies": "snapkv", "budgets": "0.5", **kwargs})


def _task(**kwargs):
    from fi_toolkit.evaluation.settings import TaskEvalSettings

    return TaskEvalSettings(**{"policies": "snapkv", "budgets": "0.5", **kwargs})


def _tasks(**kwargs):
    from fi_toolkit.evaluation.settings import TaskSettings

    return TaskSettings(**kwargs)


@pytest.mark.parametrize(
    "make, message, parameter",
    [
        (lambda: _text(interval=0), "interval must be >= 1, got 0", "interval"),
        (lambda: _text(resamples=-1), "resamples must lie in [0, 100,000], got -1", "resamples"),
        (lambda: _text(unit_policies=-3), "unit_policies must be >= 0 (0: one unit per document)", "unit_policies"),
        (lambda: _text(free_tokens=-1), "free_tokens must be >= 0, got -1", "free_tokens"),
        (lambda: _text(prompt=1024, length=1024), "length 1024 leaves nothing after the 1024-token prompt", "length"),
        (lambda: _text(future="generated:64", length=900), "length and future generated:64 both set", "length"),
        (lambda: _text(future="generated:0"), "future generated:0 generates nothing", "future"),
        (lambda: _text(budgets="0.1,"), "budgets must be a comma-separated list without empty items", "budgets"),
        (lambda: _text(budgets="0.5,keep=0.5"), "budgets gives one budget twice", "budgets"),
        (lambda: _text(policies=["infokv", "lru"]), "unknown policy 'lru'", None),
        (lambda: _text(policies=5), "policies must be a list or a comma-separated string, got 5", "policies"),
        (lambda: _text(budgets="0.01", prompt=512, length=1024), "keeps at most 10 of the 1024 tokens", None),
        (lambda: _text(signals=SignalConfig(alpha=2.0)), "alpha must lie in [0, 1]", "alpha"),
        (lambda: _task(policies="fi-oracle"), "--policy fi-oracle: fi-oracle is an oracle that sees the future", None),
        (lambda: _task(tasks=_tasks(samples=0)), "samples must lie in [1, 1,000], got 0", "samples"),
        (lambda: _task(tasks=_tasks(tasks=("sudoku",))), "unknown task 'sudoku'", None),
        (lambda: _task(budgets="0.05", tasks=_tasks(contexts=(512,))), "keeps 26 of a 512-token context", None),
        (lambda: _task(tasks=("passkey",)), "tasks must be a TaskSettings", "tasks"),
    ],
)
def test_eval_settings_refuse_on_construction_in_one_line(make, message, parameter):
    assert_refused_in_one_line(make, message, parameter)


@pytest.mark.parametrize(
    "args, line",
    [
        (["eval", "--unit-policies", "-3"], "error: --unit-policies must be >= 0 (0: one unit per document), got -3"),
        (["eval", "--free-tokens=-1"], "error: --free-tokens must be >= 0, got -1"),
        (
            ["eval", "--future", "generated:64", "--length", "900"],
            "error: --length and --future generated:64 both set the length: give one",
        ),
        (["eval", "--task", "passkey", "--samples", "0"], "error: --samples must lie in [1, 1,000], got 0"),
    ],
)
def test_fi_eval_names_its_flags_in_the_settings_messages(args, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, line + "\n")


def test_run_eval_refuses_a_mismatch_before_touching_the_model(tmp_path):
    from fi_toolkit.evaluation import run_eval

    with pytest.raises(FIError, match="a text run needs documents"):
        run_eval(None, None, _text(), tmp_path / "o")
    with pytest.raises(FIError, match="give documents or a task run's settings, not both"):
        run_eval(None, ["doc"], _task(), tmp_path / "o")
    with pytest.raises(FIError, match="settings must be a TextEvalSettings or TaskEvalSettings"):
        run_eval(None, None, "snapkv", tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_eval_settings_are_frozen_and_their_module_imports_nothing_heavy():
    s = _text()
    with pytest.raises(AttributeError):
        s.prompt = 64
    code = (
        "import sys; import fi_toolkit.evaluation.settings; "
        "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'transformers') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert done.stdout.strip() == "[]"


# ---- fi scores: ScoresSettings (and scores_file, where the table goes); fi generate: GenerateSettings -------


@pytest.fixture
def built_sg(monkeypatch):
    """Record the ScoresSettings and GenerateSettings a command builds, and stop it where it would load the model."""
    from fi_toolkit.compress.generate_settings import GenerateSettings
    from fi_toolkit.studies.scores_settings import ScoresSettings

    return record_settings(monkeypatch, ScoresSettings, GenerateSettings)


def test_scores_cli_builds_what_python_builds(built_sg, tmp_path, monkeypatch, capsys):
    from fi_toolkit.studies.scores_settings import ScoresSettings

    monkeypatch.chdir(tmp_path)
    args = ["scores", "alice", "--prefix", "128", "--fi-chunk", "128:160", "--fi-chunk", "150:192"]
    args += ["--estimator", "FISHER", "--samples", "4", "--seed", "3", "--window", "16", "--out", "s.parquet"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = ScoresSettings(
        prefix=128,
        fi_chunks=["128:160", "150:192"],
        estimator="fisher",
        samples=4,
        seed=3,
        signals=SignalConfig(window=16),
    )
    assert built_sg["ScoresSettings"] == python
    # what the options say, parsed: 192 tokens read; the options rebuilt from the fields give the same object
    assert python.fi_chunks == (Chunk(128, 160), Chunk(150, 192)) and python.document_tokens() == 192
    assert replace(python, seed=5).samples == 4 and replace(python, prefix=120).fi_chunks == python.fi_chunks


def test_scores_defaults_are_the_cli_defaults(built_sg, tmp_path, monkeypatch, capsys):
    from fi_toolkit.studies.scores_settings import ScoresSettings

    monkeypatch.chdir(tmp_path)
    assert run_cli(["scores"], capsys)[0] == 2
    default = ScoresSettings()
    assert built_sg["ScoresSettings"] == default
    assert (default.prefix, default.fi_chunks, default.estimator, default.document_tokens()) == (2048, (), None, 2048)
    # with chunks: fisher unless told, 16 label draws from seed 0; exact takes neither
    fisher = ScoresSettings(prefix=128, fi_chunks=["128:160"])
    assert (fisher.estimator, fisher.samples, fisher.seed) == ("fisher", 16, 0) and replace(fisher) == fisher
    exact = ScoresSettings(prefix=128, fi_chunks=["128:160"], estimator="exact")
    assert (exact.estimator, exact.samples, exact.seed) == ("exact", None, None) and replace(exact) == exact


def test_generate_cli_builds_what_python_builds(built_sg, tmp_path, monkeypatch, capsys):
    from fi_toolkit.compress.generate_settings import GenerateSettings

    monkeypatch.chdir(tmp_path)
    args = ["generate", "hi", "--policy", "snapkv", "--budget", "0.5", "--interval", "8", "--max-new", "5"]
    args += ["--keep-prompt", "--temperature", "0.7", "--top-p", "0.9", "--seed", "3", "--raw", "--window", "16"]
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, f"error: {STOP}\n")
    python = GenerateSettings(
        policy="snapkv",
        budget="keep=0.5",
        interval=8,
        max_new=5,
        compress_prompt=False,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        chat=False,
        signals=SignalConfig(window=16),
    )
    assert built_sg["GenerateSettings"] == python
    # what the options say, parsed: the budget, the policy at it (the run's window), a fresh copy each time
    assert python.budget == Budget.parse("keep=0.5") and python.label == "snapkv@keep=0.5"
    policy = python.make_policy()
    assert policy.window == 16 and policy.budget == Budget.parse("keep=0.5") and policy is not python.make_policy()


def test_generate_defaults_are_the_cli_defaults(built_sg, tmp_path, monkeypatch, capsys):
    from fi_toolkit.compress.generate_settings import GenerateSettings

    monkeypatch.chdir(tmp_path)
    assert run_cli(["generate", "hi"], capsys)[0] == 2
    default = GenerateSettings()
    assert built_sg["GenerateSettings"] == default
    assert (default.label, default.max_new, default.interval, default.chat) == ("infokv@keep=0.25", 256, 1024, True)
    for full in ("none", "FULL", None):
        assert (
            GenerateSettings(policy=full).make_policy() is None and GenerateSettings(policy=full).label == "full cache"
        )


def _scores(**kwargs):
    from fi_toolkit.studies.scores_settings import ScoresSettings

    return ScoresSettings(**{"prefix": 128, **kwargs})


def _generate(**kwargs):
    from fi_toolkit.compress.generate_settings import GenerateSettings

    return GenerateSettings(**kwargs)


def _scores_file(run):
    from fi_toolkit.studies.scores_settings import scores_file

    return scores_file(run)


@pytest.mark.parametrize(
    "make, message, parameter",
    [
        (lambda: _scores(prefix=16), "prefix 16 leaves nothing to score", "prefix"),
        (lambda: _scores(prefix=128.0), "prefix must be a whole number, got 128.0", "prefix"),
        (lambda: _scores(estimator="fisher"), "estimator, samples and seed go with fi_chunks START:END", "estimator"),
        (lambda: _scores(seed=1), "estimator, samples and seed go with fi_chunks", "estimator"),
        (lambda: _scores(fi_chunks="128:160"), "fi_chunks must be a list of START:END chunks", "fi_chunks"),
        (lambda: _scores(fi_chunks=["9:3"]), "invalid chunk '9:3'", None),
        (lambda: _scores(fi_chunks=["100:160"]), "starts before the compression point p=128", None),
        (lambda: _scores(fi_chunks=["128:160"], estimator="taylor"), "unknown estimator 'taylor'", "estimator"),
        (
            lambda: _scores(fi_chunks=["128:160"], estimator="exact", samples=4),
            "samples and seed go with estimator fisher",
            "samples",
        ),
        (lambda: _scores(fi_chunks=["128:160"], seed=-1), "seed must be >= 0, got -1", "seed"),
        (lambda: _scores(fi_chunks=["128:160"], samples=0), "samples must be >= 1, got 0", "samples"),
        (lambda: _scores(fi_chunks=["128:160"], samples=10**9), "samples must be at most 10,000", "samples"),
        (lambda: _scores(signals=SignalConfig(alpha=2.0)), "alpha must lie in [0, 1]", "alpha"),
        (lambda: _scores_file("s.txt"), "out must end in .csv or .parquet, got 's.txt'", "out"),
        (lambda: _scores_file(5), "run must be a str or Path, got 5", "run"),
        (lambda: _scores_file(RunSettings("s.csv", resume=True)), "a scores table does not resume", "resume"),
        (lambda: _generate(interval=0), "interval must be >= 1, got 0", "interval"),
        (lambda: _generate(max_new=0), "max_new must be >= 1, got 0", "max_new"),
        (lambda: _generate(temperature=float("nan")), "temperature must be a finite number, got nan", "temperature"),
        (lambda: _generate(top_p=float("inf")), "top_p must be a finite number, got inf", "top_p"),
        (lambda: _generate(seed=1.5), "seed must be a whole number, got 1.5", "seed"),
        (lambda: _generate(compress_prompt="yes"), "compress_prompt must be a bool or None", "compress_prompt"),
        (lambda: _generate(chat=None), "chat must be a bool, got None", "chat"),
        (lambda: _generate(policy=3), "policy must be a str or None, got 3", "policy"),
        (lambda: _generate(signals=SignalConfig(entropy_of="current")), "entropy_of must be one of", "entropy_of"),
        (lambda: _generate(policy="lru"), "unknown policy 'lru'", None),
        (
            lambda: _generate(policy="fi-oracle"),
            "--policy fi-oracle: fi-oracle is an oracle that sees the future",
            None,
        ),
        (lambda: _generate(budget="hold=0.2"), "write keep=X or remove=X", None),
        (lambda: _generate(policy="none", budget="hold=0.2"), "invalid budget: 'hold=0.2'", None),
    ],
)
def test_scores_and_generate_settings_refuse_on_construction_in_one_line(make, message, parameter):
    assert_refused_in_one_line(make, message, parameter)


@pytest.mark.parametrize(
    "args, line",
    [
        (["scores", "--estimator", "fisher"], "error: --estimator, --samples and --seed go with --fi-chunk START:END"),
        (
            ["scores", "--prefix", "128", "--fi-chunk", "128:160", "--estimator", "exact", "--seed", "2"],
            "error: --samples and --seed go with --estimator fisher",
        ),
        (["scores", "--prefix", "128", "--fi-chunk", "128:160", "--seed=-1"], "error: --seed must be >= 0, got -1"),
        (["scores", "--out", "s.txt"], "error: --out must end in .csv or .parquet, got 's.txt'"),
        (["generate", "hi", "--max-new", "0"], "error: --max-new must be >= 1, got 0"),
        (["generate", "hi", "--top-p", "nan"], "error: --top-p must be a finite number, got nan"),
        (
            ["generate", "hi", "--entropy-of", "current"],
            "error: --entropy-of must be one of produced, next, got 'current'",
        ),
    ],
)
def test_scores_and_generate_name_their_flags_in_the_settings_messages(args, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(args, capsys)
    assert (code, err) == (2, line + "\n")


def test_scores_refuses_an_existing_table_before_the_model(tmp_path, monkeypatch, capsys):
    """The Python message names ``out`` and ``overwrite``; the command line's, ``--out`` and ``--overwrite``."""
    from fi_toolkit.studies.scores_settings import scores_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.csv").write_text("old\n")
    with pytest.raises(FIError, match="out 's.csv' exists; choose another file or pass overwrite$") as exc:
        scores_file("s.csv")
    assert exc.value.parameter == "out" and scores_file(RunSettings("s.csv", overwrite=True)).overwrite
    code, _, err = run_cli(["scores", "--out", "s.csv"], capsys)
    assert (code, err) == (2, "error: --out 's.csv' exists; choose another file or pass --overwrite\n")
    assert (tmp_path / "s.csv").read_text() == "old\n"


def test_run_scores_and_run_generate_refuse_a_mismatch_before_touching_the_model(tmp_path):
    from fi_toolkit.compress.generate_run import run_generate
    from fi_toolkit.studies.scores_run import run_scores

    with pytest.raises(FIError, match="settings must be a ScoresSettings"):
        run_scores(None, [], "prefix=128")
    with pytest.raises(FIError, match="out must end in .csv or .parquet"):
        run_scores(None, [], _scores(), tmp_path / "s.txt")
    with pytest.raises(FIError, match="no document given"):
        run_scores(None, [], _scores(), tmp_path / "s.csv")
    with pytest.raises(FIError, match="settings must be a GenerateSettings"):
        run_generate(None, "hi", "snapkv")
    assert list(tmp_path.iterdir()) == []


def test_scores_and_generate_settings_are_frozen_and_import_nothing_heavy():
    for settings, name in ((_scores(), "prefix"), (_generate(), "policy")):
        with pytest.raises(AttributeError):
            setattr(settings, name, None)
    code = (
        "import sys; from fi_toolkit.studies.scores_settings import ScoresSettings, scores_file; "
        "ScoresSettings(prefix=128, fi_chunks=['128:160']); scores_file('s.csv'); "
        "from fi_toolkit.compress.generate_settings import GenerateSettings; GenerateSettings(policy='snapkv'); "
        "print(sorted(m for m in ('torch', 'pandas', 'scipy', 'transformers') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert done.stdout.strip() == "[]"


def _imported(tree) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_scores_and_generate_commands_import_only_their_settings_and_run_function():
    """The commands parse, build the settings, load, call the run function and print: the work (the trace, the
    estimators, the decoder) is reached only through ``run_scores`` and ``run_generate``."""
    import ast

    import fi_toolkit.cli.app as app
    import fi_toolkit.cli.generate as generate

    tree = ast.parse(Path(app.__file__).read_text())
    (scores,) = [n for n in tree.body if getattr(n, "name", "") == "scores"]
    assert _imported(scores) == {"fi_toolkit.documents", "fi_toolkit.studies.scores_run"}
    # its settings (ScoresSettings, RunSettings) are the command's annotations, imported with the module
    assert {"fi_toolkit.studies.scores_settings", "fi_toolkit.runs.settings"} <= _imported(tree)
    assert {m for m in _imported(ast.parse(Path(generate.__file__).read_text())) if m.startswith("fi_toolkit")} == {
        "fi_toolkit.cli.options",
        "fi_toolkit.errors",
        "fi_toolkit.model.settings",
        "fi_toolkit.signals.config",
        "fi_toolkit.compress.generate_settings",
        "fi_toolkit.compress.generate_run",
        "fi_toolkit.report.numbers",  # the one number formatter (its byte sizes)
    }
