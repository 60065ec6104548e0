"""The ``fi`` command line: real runs on the embedded model, and one clear line for every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from cli_runner import run_cli

from fi_toolkit import SignalConfig
from fi_toolkit.compress.decoder import signal_config_for
from fi_toolkit.errors import FIError
from fi_toolkit.model.loading import tiny_model


@pytest.fixture(scope="module")
def empty_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "empty.txt"
    path.write_text("   \n")
    return path


smollm = pytest.mark.smollm  # the case gets past the checks made before loading the model


@pytest.mark.parametrize(
    "args, message",
    [
        (["probe", "missing.txt", "--chunk", "100:200"], "document not found: 'missing.txt'"),
        (["probe", "--chunk", "9:3"], "start must be smaller than end"),
        (["probe", "--chunk", "100:200", "--select", "entropy:abc"], "is not a number"),
        (["probe", "--chunk", "100:200", "--select", "magic:0.1"], "unknown selector 'magic'"),
        (["probe", "--chunk", "100:200", "--select", "random:0.1@x"], "seed must be an integer"),
        (["probe", "--chunk", "100:200", "--select", "entropy:1.5"], "[0, 1]"),
        (["probe", "--chunk", "100:200", "--alpha", "nan"], "alpha must lie in [0, 1]"),
        (["probe", "--chunk", "100:200", "--tau", "inf"], "tau must be a finite number"),
        (["probe", "--chunk", "100:200", "--model", "no-such/model"], "unknown model 'no-such/model'"),
        (["probe", "--chunk", "100:200", "--device", "tpu"], "unknown device"),
        (["probe", "--chunk", "100:200", "--dtype", "int8"], "unknown dtype"),
        (["probe", "--chunk", "100:200", "--prefix", "150"], "starts before the compression point"),
        (["probe", "--chunk", "100:200", "--entropy-of", "previous"], "--entropy-of must be one of produced, next"),
        pytest.param(["probe", "--chunk", "2048:9000"], "past the model's context of 8,192", marks=smollm),
        pytest.param(["probe", "--chunk", "2048:99999"], "2048:99999 ends past the", marks=smollm),
        pytest.param(["probe", "--chunk", "100:200", "--select", "positions:150"], "outside the prefix", marks=smollm),
        (["probe", "--chunk", "100:200", "--bogus"], "No such option"),
        (["scores", "--prefix", "20"], "leaves nothing to score"),
        (["scores", "--out", "x.txt"], "--out must end in .csv or .parquet"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert message in err
    assert "Traceback" not in err + out


def test_empty_document(empty_file, capsys):
    code, _, err = run_cli(["probe", str(empty_file), "--chunk", "128:160"], capsys)
    assert code == 2 and err == f"error: document 'empty' ({empty_file}) is empty\n"


@pytest.mark.smollm
def test_probe_writes_table_and_manifest_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    args = [
        "probe",
        "hamlet",
        "--chunk",
        "256:320",
        "--chunk",
        "448:512",
        "--select",
        "positions:0",
        "--select",
        "positions:10-30",
        "--select",
        "positions:100-140,150",
        "--select",
        "positions:200",
        "--entropy-of",
        "next",
        "--out",
        str(out),
    ]
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0
    table = pd.read_csv(out / "fi.csv")
    assert len(table) == (2 + 4) * 2 and list(table["chunk"].unique()) == ["256:320", "448:512"]
    controls, measured = table[table.selector == "control"], table[table.selector != "control"]
    assert list(controls.selection.unique()) == ["control:null", "control:reorder"]  # reported first
    assert (table[table.selection == "control:null"]["fi"] == 0).all()  # float32 on the CPU: exactly 0
    assert (measured["fi"] > 0).all() and not measured["below_noise_floor"].any()
    manifest = json.loads((out / "manifest.json").read_text())
    floor = manifest["noise_floor"]["hamlet"]
    assert set(floor) == {"256:320", "448:512"} and all(0 <= v < 1e-8 for v in floor.values())
    assert floor["256:320"] == pytest.approx(controls[controls.chunk == "256:320"]["fi"].abs().max(), abs=1e-15)
    assert manifest["model"]["dtype"] == manifest["model"]["compute_dtype"] == "float32"
    assert manifest["prefix"] == 256 and manifest["sinks"] == 4
    assert manifest["documents"][0]["name"] == "hamlet" and len(manifest["documents"][0]["sha256"]) == 64
    assert manifest["signals"]["top_k"] == 256 and "torch" in manifest["versions"]
    assert manifest["signals"]["entropy_of"] == "next"
    assert "positions:10-30" in stdout and "FI 256:320" in stdout
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "fi.csv").stat().st_mode & 0o777 == 0o666 & ~umask  # like open(), not mkstemp's 0600
    before = (out / "fi.csv").read_bytes()
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "already holds results" in err
    assert (out / "fi.csv").read_bytes() == before  # results already written are never lost


@pytest.mark.smollm
def test_probe_failing_after_the_model_load_leaves_no_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for out in ([], ["--out", "named"]):  # the default runs/probe-... and a named --out
        code, _, err = run_cli(["probe", "--chunk", "100:200", "--select", "positions:150", *out], capsys)
        assert code == 2 and "outside the prefix" in err
        assert list(tmp_path.iterdir()) == []


@pytest.mark.smollm
def test_probe_default_directory_is_unique(tmp_path, capsys, monkeypatch):
    """runs/probe-<time>-<random>, created with mkdir(exist_ok=False) (test_bad_input: two in one second)."""
    import re

    monkeypatch.chdir(tmp_path)
    assert run_cli(["probe", "--chunk", "64:72", "--select", "positions:3"], capsys)[0] == 0
    [run] = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"probe-\d{8}-\d{6}-[0-9a-f]{4}", run.name) and (run / "fi.csv").is_file()


@pytest.mark.smollm
def test_scores_writes_per_token_signals(tmp_path, capsys):
    path = tmp_path / "scores.csv"
    code, _, _ = run_cli(["scores", "alice", "--prefix", "128", "--out", str(path)], capsys)
    assert code == 0
    before = path.read_bytes()
    code, _, err = run_cli(["scores", "alice", "--prefix", "128", "--out", str(path)], capsys)
    assert code == 2 and err == f"error: --out '{path}' exists; choose another file or pass --overwrite\n"
    assert path.read_bytes() == before
    code, _, _ = run_cli(["scores", "alice", "--prefix", "128", "--out", str(path), "--overwrite"], capsys)
    assert code == 0
    table = pd.read_csv(path, keep_default_na=False)
    assert len(table) == 128 and {"token", "entropy", "attention", "distance", "infokv", "D_0", "E_29", "A_29"} <= set(
        table
    )
    assert table["in_window"].astype(str).eq("True").sum() == 32


@pytest.mark.smollm
def test_real_process_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "fi_toolkit.cli.app", "probe", "--chunk", "100:200", "--select", "positions:150"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --select positions:150: position 150 is outside the prefix [0, 100)"
    ]


def test_generate_passes_a_full_signal_config(monkeypatch, capsys):
    """fi generate builds its SignalConfig with signal_config_for(policy, pool, entropy_of) and passes it on."""
    seen = {}

    def fake_generate(model, tokenizer, prompt, policy, **kwargs):
        seen.update(kwargs, policy=policy)
        raise FIError("stop here")

    monkeypatch.setattr("fi_toolkit.model.loading.load_model", lambda *a, **k: tiny_model())
    monkeypatch.setattr("fi_toolkit.compress.decoder.generate", fake_generate)
    code, _, err = run_cli(
        [
            "generate",
            "hi",
            "--policy",
            "snapkv",
            "--window",
            "16",
            "--pool",
            "3",
            "--entropy-of",
            "next",
            "--top-k",
            "64",
        ],
        capsys,
    )
    assert code == 2 and err == "error: stop here\n"
    config = seen["config"]
    assert (config.window, config.pool_kernel, config.entropy_of) == (16, 3, "next")
    assert config == signal_config_for(seen["policy"], pool_kernel=3, entropy_of="next")


@pytest.mark.parametrize("command", [["correlate", "--chunk", "128:160"], ["nearfar"]])
def test_studies_pass_entropy_of(command, monkeypatch, capsys):
    from fi_toolkit.cli import study as cli_study

    seen = []

    def fake_run_study(label, model, texts, max_tokens, study):
        seen.append(study)
        raise FIError("stop here")

    monkeypatch.setattr(cli_study, "_run_study", fake_run_study)
    monkeypatch.setattr("fi_toolkit.studies.study.run_correlate", lambda *a, **k: seen.append(a))
    monkeypatch.setattr("fi_toolkit.studies.study.run_nearfar", lambda *a, **k: seen.append(a))
    code, _, _ = run_cli([*command, "--entropy-of", "next", "--pool", "5"], capsys)
    assert code == 2
    seen[0](None, [], None)  # the study as the CLI built it
    config = next(a.signals for a in seen[1] if isinstance(getattr(a, "signals", None), SignalConfig))
    assert (config.entropy_of, config.pool_kernel) == ("next", 5)


@pytest.mark.smollm
def test_oracle_chunk_past_the_last_probed_chunk_is_measured(tmp_path, capsys):
    """policy:fi-oracle@B:chunk=160:200 on a document of about 580 tokens: the oracle's chunk lies past the last
    --chunk (128:160) but inside the document, so the probe reads that far and measures it."""
    doc = tmp_path / "doc.txt"
    doc.write_text("word " * 560)
    out = tmp_path / "run"
    args = ["probe", str(doc), "--chunk", "128:160", "--select", "policy:fi-oracle@keep=0.5:chunk=160:200"]
    code, _, err = run_cli([*args, "--out", str(out)], capsys)
    assert code == 0, err
    table = pd.read_csv(out / "fi.csv")
    assert "policy:fi-oracle@keep=0.5:chunk=160:200" in set(table["selection"])
