"""The ``fi`` command line: real runs on the embedded model, and one clear line for every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from fi_toolkit import cli


def run_cli(args, capsys):
    sys_argv, sys.argv = sys.argv, ["fi", *args]
    try:
        with pytest.raises(SystemExit) as exc:
            cli.main()
    finally:
        sys.argv = sys_argv
    captured = capsys.readouterr()
    return exc.value.code, captured.out, captured.err


@pytest.fixture(scope="module")
def empty_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "empty.txt"
    path.write_text("   \n")
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (["probe", "missing.txt", "--chunk", "100:200"], "document not found: 'missing.txt'"),
        (["probe", "--chunk", "9:3"], "start must be smaller than end"),
        (["probe", "--chunk", "100:200", "--select", "entropy:abc"], "is not a number"),
        (["probe", "--chunk", "100:200", "--select", "magic:0.1"], "unknown selector 'magic'"),
        (["probe", "--chunk", "100:200", "--select", "random:0.1@x"], "seed must be an integer"),
        (["probe", "--chunk", "100:200", "--select", "entropy:1.5"], "fraction"),
        (["probe", "--chunk", "100:200", "--alpha", "nan"], "alpha must lie in [0, 1]"),
        (["probe", "--chunk", "100:200", "--tau", "inf"], "tau must be a finite number"),
        (["probe", "--chunk", "100:200", "--model", "no-such/model"], "unknown model 'no-such/model'"),
        (["probe", "--chunk", "100:200", "--device", "tpu"], "unknown device"),
        (["probe", "--chunk", "100:200", "--dtype", "int8"], "unknown dtype"),
        (["probe", "--chunk", "100:200", "--prefix", "150"], "starts before the compression point"),
        (["probe", "--chunk", "2048:9000"], "past the model's context of 8,192"),
        (["probe", "--chunk", "2048:99999"], "past the document's end"),
        (["probe", "--chunk", "100:200", "--select", "entropy:500"], "larger than the 64 candidate positions"),
        (["probe", "--chunk", "100:200", "--select", "positions:150"], "outside the prefix"),
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
    code, _, err = run_cli(["probe", str(empty_file), "--chunk", "1:2"], capsys)
    assert code == 2 and err == f"error: document 'empty' ({empty_file}) is empty\n"


def test_probe_writes_table_and_manifest_and_refuses_to_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["probe", "hamlet", "--chunk", "256:320", "--chunk", "448:512", "--select", "entropy:0.1",
            "--select", "random:0.1@0-1", "--select", "positions:0", "--out", str(out)]
    code, stdout, _ = run_cli(args, capsys)
    assert code == 0
    table = pd.read_csv(out / "fi.csv")
    assert len(table) == 4 * 2 and (table["fi"] > 0).all()
    assert list(table["chunk"].unique()) == ["256:320", "448:512"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["prefix"] == 256 and manifest["sinks"] == 4
    assert manifest["documents"][0]["name"] == "hamlet" and len(manifest["documents"][0]["sha256"]) == 64
    assert manifest["signals"]["top_k"] == 256 and "torch" in manifest["versions"]
    assert "entropy:0.1" in stdout and "FI 256:320" in stdout
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "fi.csv").stat().st_mode & 0o777 == 0o666 & ~umask  # like open(), not mkstemp's 0600
    before = (out / "fi.csv").read_bytes()
    code, _, err = run_cli(args, capsys)
    assert code == 2 and "already holds results" in err
    assert (out / "fi.csv").read_bytes() == before  # results already written are never lost


def test_scores_writes_per_token_signals(tmp_path, capsys):
    path = tmp_path / "scores.csv"
    code, _, _ = run_cli(["scores", "alice", "--prefix", "128", "--out", str(path)], capsys)
    assert code == 0
    table = pd.read_csv(path, keep_default_na=False)
    assert len(table) == 128 and {"token", "entropy", "attention", "distance", "infokv", "D_0", "E_29", "A_29"} <= set(table)
    assert table["in_window"].astype(str).eq("True").sum() == 32


def test_real_process_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "fi_toolkit.cli", "probe", "--chunk", "100:200", "--select", "entropy:500"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --select entropy:500: budget of 500 tokens is larger than the 64 candidate positions [4, 68) of the prefix"
    ]
