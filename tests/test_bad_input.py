"""Every bad input of the command line, table-driven: exit 2 with exactly one line ``error: ...`` on stderr, no
traceback, nothing half-written and the results already on disk unchanged byte for byte.

All cases fail before the embedded model is loaded (the model-dependent ones live in test_cli.py,
marked ``smollm``); the finished run they need is made with the tiny random model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from cli_runner import run_cli

from fi_toolkit import Document, SignalConfig
from fi_toolkit.cli import INTERRUPTED_LINE
from fi_toolkit.documents import MAX_DOCUMENT_BYTES
from fi_toolkit.runs import results
from fi_toolkit.runs.resumable import Part, ResumableRun
from fi_toolkit.runs.settings import RunSettings
from fi_toolkit.studies import NearfarSettings, run_nearfar

NO_SUCH_HUB_ID = "no-such-owner/no-such-model"


def snapshot(root):
    """Every path under ``root`` with its bytes (None for a directory): catches changes, new and temp files."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def finished_run(tiny, tmp_path_factory):
    """A finished nearfar run (tiny model, one document) to point commands at."""
    out = tmp_path_factory.mktemp("bad_input") / "nf"
    doc = Document("doc", "text", torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(5)), "test")
    run_nearfar(
        tiny, [doc], NearfarSettings(96, [0, 32], 16, budget="remove=0.1", seeds=1, signals=SignalConfig(window=8)), out
    )
    return out


# --- set-ups: each writes what the case needs under tmp (the working directory) and returns nothing ---

HAS_KVPRESS = importlib.util.find_spec("kvpress") is not None
KVPRESS_MISSING = "install it with: pip install 'fi_toolkit[kvpress]'"


def without_kvpress(tmp, run, monkeypatch):
    monkeypatch.setitem(sys.modules, "kvpress", None)  # `import kvpress` fails as where it is not installed


def a_file(tmp):
    (tmp / "f").write_text("a regular file\n")


def a_run(tmp, run):
    shutil.copytree(run, tmp / "run")


def a_run_with(name, content):
    def setup(tmp, run):
        a_run(tmp, run)
        (tmp / "run" / name).write_text(content)

    return setup


def a_run_of_world(size):
    """The finished run, as if its units had been computed by ``size`` ranks under torchrun."""

    def setup(tmp, run):
        a_run(tmp, run)
        for done in (tmp / "run" / "per_document").glob("*/done.json"):
            record = json.loads(done.read_text())
            record["computed_by"]["world_size"] = size
            done.write_text(json.dumps(record))

    return setup


def a_report(tmp, run):
    a_run(tmp, run)
    (tmp / "report").mkdir()
    (tmp / "report" / "report.html").write_text("<html>an earlier report</html>\n")


def an_lmeval_dir(results=True, config=None, text=None, samples=None):
    """lm-eval's output of one fi lm-eval run (results and samples file), spoiled as asked."""

    def setup(tmp):
        out = tmp / "lm" / "smollm2-135m"
        out.mkdir(parents=True)
        date = "2026-01-01T00-00-00.000000"
        line = {"doc_id": 0, "filter": "none", "metrics": ["acc"], "acc": 1.0, "fi_toolkit": []}
        (out / f"samples_fi_mc_{date}.jsonl").write_text((samples or json.dumps(line)) + "\n")
        if results:
            data = {
                "results": {"fi_mc": {"alias": "fi_mc", "acc,none": 1.0, "acc_stderr,none": 0.0}},
                "config": config or {"model": "fi", "fi_policy": "snapkv@keep=0.25"},
            }
            (out / f"results_{date}.json").write_text(text or json.dumps(data))

    return setup


def a_probe_run(tmp):
    (tmp / "probe").mkdir()
    (tmp / "probe" / "manifest.json").write_text(json.dumps({"command": "probe", "prefix": 128}))
    (tmp / "probe" / "fi.csv").write_text("selection,chunk,fi\nentropy:0.1,128:160,0.25\n")


def jsonl(second_line):
    def setup(tmp):
        (tmp / "docs.jsonl").write_text(json.dumps({"text": "a fine document"}) + "\n" + second_line + "\n")

    return setup


def a_directory(name):
    def setup(tmp):
        (tmp / name).mkdir()

    return setup


def a_big_sparse_file(tmp):
    """257 MiB that take no disk (a hole): past the 256 MiB a document file may hold."""
    with open(tmp / "big.txt", "wb") as fh:
        fh.truncate(MAX_DOCUMENT_BYTES + 2**20)


def short_text(tmp):
    (tmp / "short.txt").write_text("A short document of a few words. " * 4)


def existing_scores(tmp):
    (tmp / "s.csv").write_text("position,entropy\n0,1.5\n")


def unknown_architecture(tmp):
    (tmp / "bad-model").mkdir()
    (tmp / "bad-model" / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (tmp / "bad-model" / "model.safetensors").write_bytes(b"")  # weights in name: transformers reads the config


def a_model_dir(*names):
    """A ``--model`` directory ``m`` holding the files ``names`` (empty ones: read before they would load)."""

    def setup(tmp):
        (tmp / "m").mkdir()
        for name in names:
            (tmp / "m" / name).write_text("{}" if name.endswith(".json") else "")

    return setup


def a_checkpoint(tmp):
    """A checkpoint ``ckpt`` whose tokenizer.json makes one token per word (weights empty: never loaded), and
    ``doc.txt``: 100 words, 500 bytes (a token per byte would allow 160 tokens; the tokenizer makes 100)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    (tmp / "ckpt").mkdir()
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "word": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp / "ckpt" / "tokenizer.json"))
    (tmp / "ckpt" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp / "ckpt" / "model.safetensors").write_bytes(b"")
    (tmp / "doc.txt").write_text("word " * 100)


def other_files(*names):
    """A directory ``mine`` of the user's own files (``name/`` a directory)."""

    def setup(tmp):
        for name in names:
            path = tmp / "mine" / name.rstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir() if name.endswith("/") else path.write_text("mine\n")

    return setup


def surrogate_dir(config: str | None, weights: bytes | None = None):
    """A surrogate directory ``s`` holding ``config`` as config.json and ``weights`` as model.safetensors."""

    def setup(tmp):
        (tmp / "s").mkdir()
        if config is not None:
            (tmp / "s" / "config.json").write_text(config)
        if weights is not None:
            (tmp / "s" / "model.safetensors").write_bytes(weights)

    return setup


def fitted_file(text):
    """A fitted-policy file ``p.json`` holding ``text``."""

    def setup(tmp):
        (tmp / "p.json").write_text(text)

    return setup


def fitted_record(**change):
    record = {
        "format": "fi_toolkit.fitted/1",
        "features": ["attention"],
        "mean": [0.0],
        "scale": [1.0],
        "coefficients": [1.0],
        "model": {"name": "smollm2-135m", "layers": 30, "kv_heads": 3, "head_dim": 64},
        "signals": {"window": 32, "entropy_of": "produced", "tau": 1.0},
    }
    return json.dumps({**record, **change})  # NaN is written as NaN, as a careless writer would


def fit_data_run(documents):
    """A ``fi fit-data`` run directory ``fd`` with rows of ``documents``."""

    def setup(tmp):
        (tmp / "fd").mkdir()
        rows = pd.DataFrame(
            {
                "document": [d for d in documents for _ in range(4)],
                "layer": 0,
                "head": 0,
                "position": list(range(4)) * len(documents),
                "fi": 1.0,
                "attention": 0.5,
            }
        )
        rows.to_parquet(tmp / "fd" / "fit_rows.parquet")
        manifest = {
            "command": "fit-data",
            "model": {"name": "tiny", "layers": 1, "kv_heads": 1, "head_dim": 4},
            "signals": {
                "window": 2,
                "top_k": 8,
                "pool_kernel": 1,
                "tau": 1.0,
                "entropy_of": "produced",
                "final_norm": False,
            },
            "prefix": 8,
            "chunks": ["8:10"],
            "sinks": 0,
            "samples": 1,
            "documents": [{"name": d, "source": "test", "sha256": "-"} for d in documents],
        }
        (tmp / "fd" / "manifest.json").write_text(json.dumps(manifest))

    return setup


SINKS = "error: --sinks 99999 leaves no candidates: the scored prefix [0, 96) has 96 positions"

CASES = [
    # --out under a regular file, or a file where a directory is wanted (and the reverse)
    (
        "probe-out-under-file",
        a_file,
        ["probe", "--chunk", "128:160", "--out", "f/run"],
        "lies under 'f', which is a file",
    ),
    ("correlate-out-under-file", a_file, ["correlate", "--chunk", "128:160", "--out", "f/run"], "lies under 'f'"),
    ("nearfar-out-under-file", a_file, ["nearfar", "--out", "f/run"], "lies under 'f'"),
    (
        "report-out-under-file",
        lambda t, r: (a_file(t), a_run(t, r)),
        ["report", "run", "--out", "f/r"],
        "lies under 'f'",
    ),
    (
        "report-out-is-file",
        lambda t, r: (a_file(t), a_run(t, r)),
        ["report", "run", "--out", "f"],
        "--out 'f' is a file, not a directory",
    ),
    ("scores-out-is-directory", a_directory("d.csv"), ["scores", "--out", "d.csv"], "--out 'd.csv' is a directory"),
    ("scores-out-under-file", a_file, ["scores", "--out", "f/s.csv"], "lies under 'f'"),
    # results already there are never replaced without --overwrite, nor mixed with another command's
    (
        "scores-out-exists",
        existing_scores,
        ["scores", "--out", "s.csv"],
        "--out 's.csv' exists; choose another file or pass --overwrite",
    ),
    ("report-into-a-report", a_report, ["report", "run", "--out", "report"], "already holds results (report.html)"),
    ("report-into-its-run", a_run, ["report", "run", "--out", "run", "--overwrite"], "is the result directory"),
    (
        "report-inside-its-run",
        a_run,
        ["report", "run", "--out", "run/report", "--overwrite"],
        "--out 'run/report' lies inside the result directory 'run'; choose an --out outside it",
    ),
    (
        "report-into-other-files",
        lambda t, run: (a_run(t, run), other_files("notes.txt", "b.png")(t)),
        ["report", "run", "--out", "mine"],
        "--out 'mine' holds 2 entries that fi report did not write (b.png, notes.txt); choose a new or empty --out, "
        "or pass --overwrite",
    ),
    (
        "report-overwrite-replacing-other-figures",
        lambda t, run: (a_run(t, run), other_files("notes.txt", "figures/plot.png")(t)),
        ["report", "run", "--out", "mine", "--overwrite"],
        "--out 'mine' holds a 'figures' directory that fi report did not write",
    ),
    ("nearfar-into-a-probe-run", a_probe_run, ["nearfar", "--out", "probe"], "already holds results (a 'probe' run)"),
    (
        "nearfar-resumes-a-probe-run",
        a_probe_run,
        ["nearfar", "--out", "probe", "--resume"],
        "holds a 'probe' run, not 'nearfar' (--resume only continues the same command)",
    ),
    (
        "probe-into-a-nearfar-run",
        a_run,
        ["probe", "--chunk", "128:160", "--out", "run"],
        "already holds results (a 'nearfar' run)",
    ),
    (
        "correlate-resumes-a-nearfar-run",
        a_run,
        ["correlate", "--chunk", "128:160", "--out", "run", "--resume"],
        "holds a 'nearfar' run, not 'correlate'",
    ),
    (
        "resume-and-overwrite",
        a_run,
        ["nearfar", "--out", "run", "--resume", "--overwrite"],
        "--resume and --overwrite contradict each other",
    ),
    (
        "resume-and-overwrite-correlate",
        None,
        ["correlate", "--chunk", "128:160", "--resume", "--overwrite"],
        "--resume and --overwrite contradict each other",
    ),
    # files a run or a report reads
    (
        "settings-is-a-list",
        a_run_with("settings.json", "[]"),
        ["nearfar", "--out", "run", "--resume"],
        "settings.json' is not a run's settings",
    ),
    (
        "settings-is-garbage",
        a_run_with("settings.json", "{garbage"),
        ["nearfar", "--out", "run", "--resume"],
        "settings.json' is not a run's settings",
    ),
    ("report-manifest-is-a-list", a_run_with("manifest.json", "[]"), ["report", "run"], "is not a run manifest"),
    (
        "report-manifest-lacks-command",
        a_run_with("manifest.json", json.dumps({"settings": {}})),
        ["report", "run"],
        "lacks the field 'command'",
    ),
    (
        "report-manifest-lacks-settings",
        a_run_with("manifest.json", json.dumps({"command": "nearfar"})),
        ["report", "run"],
        "lacks the field 'settings'",
    ),
    # lm-eval output (fi lm-eval) given to fi report
    (
        "report-lmeval-without-results",
        an_lmeval_dir(results=False),
        ["report", "lm"],
        "holds lm-eval samples but no results_*.json",
    ),
    (
        "report-lmeval-without-fi-policy",
        an_lmeval_dir(config={"model": "hf"}),
        ["report", "lm"],
        "lacks 'config.fi_policy'",
    ),
    ("report-lmeval-corrupt-results", an_lmeval_dir(text="{not json"), ["report", "lm"], "is not valid JSON"),
    ("report-lmeval-corrupt-samples", an_lmeval_dir(samples="{not json"), ["report", "lm"], ":1: not valid JSON"),
    (
        "report-lmeval-bad-policy",
        an_lmeval_dir(config={"fi_policy": "infokv@lots"}),
        ["report", "lm"],
        "whose budget is not a budget",
    ),
    (
        "jsonl-text-null",
        jsonl('{"text": null}'),
        ["probe", "docs.jsonl", "--chunk", "128:160"],
        "docs.jsonl:2: 'text' must be a string",
    ),
    (
        "jsonl-text-number",
        jsonl('{"text": 42}'),
        ["probe", "docs.jsonl", "--chunk", "128:160"],
        "docs.jsonl:2: 'text' must be a string",
    ),
    (
        "jsonl-text-list",
        jsonl('{"text": ["a", "b"]}'),
        ["nearfar", "docs.jsonl"],
        "docs.jsonl:2: 'text' must be a string",
    ),
    (
        "jsonl-not-an-object",
        jsonl('"just text"'),
        ["probe", "docs.jsonl", "--chunk", "128:160"],
        "docs.jsonl:2: expected a JSON object",
    ),
    ("empty-document", lambda t: (t / "e.txt").write_text(" \n"), ["probe", "e.txt", "--chunk", "128:160"], "is empty"),
    # a document must be a regular file of bounded size: refused before it is opened (a FIFO: test_fifo_document)
    (
        "document-dev-zero",
        None,
        ["probe", "/dev/zero", "--chunk", "128:160"],
        "error: '/dev/zero' is a character device, not a document: give a text or JSONL file",
    ),
    ("document-dev-zero-nearfar", None, ["nearfar", "alice", "/dev/zero"], "'/dev/zero' is a character device"),
    (
        "document-is-directory",
        a_directory("d"),
        ["probe", "d", "--chunk", "128:160"],
        "error: 'd' is a directory, not a document",
    ),
    (
        "eval-document-is-directory",
        a_directory("d.txt"),
        ["eval", "d.txt"],
        "error: 'd.txt' is a directory, not a document",
    ),
    (
        "document-too-large",
        a_big_sparse_file,
        ["scores", "big.txt"],
        "error: 'big.txt' is 257 MiB; a document file holds at most 256 MiB (split it into several files)",
    ),
    # values
    (
        "generate-temperature-nan",
        None,
        ["generate", "hi", "--temperature", "nan"],
        "--temperature must be a finite number, got nan",
    ),
    (
        "generate-temperature-inf",
        None,
        ["generate", "hi", "--temperature", "inf"],
        "--temperature must be a finite number, got inf",
    ),
    ("generate-top-p-nan", None, ["generate", "hi", "--top-p", "nan"], "--top-p must be a finite number"),
    (
        "generate-file-is-directory",
        a_directory("d"),
        ["generate", "--file", "d"],
        "--file 'd' is a directory, not a prompt file",
    ),
    (
        "generate-entropy-of",
        None,
        ["generate", "hi", "--entropy-of", "current"],
        "--entropy-of must be one of produced, next",
    ),
    (
        "probe-entropy-of",
        None,
        ["probe", "--chunk", "128:160", "--entropy-of", "x"],
        "--entropy-of must be one of produced, next",
    ),
    (
        "scores-prefix-0",
        None,
        ["scores", "--prefix", "0"],
        "--prefix 0 leaves nothing to score: it must be larger than the window (32)",
    ),
    ("probe-sinks", None, ["probe", "--chunk", "128:160", "--sinks", "99999"], SINKS),
    ("correlate-sinks", None, ["correlate", "--chunk", "128:160", "--sinks", "99999"], SINKS),
    ("nearfar-sinks", None, ["nearfar", "--prefix", "128", "--sinks", "99999"], SINKS),
    (
        "correlate-prefix-after-chunk",
        None,
        ["correlate", "--chunk", "100:200", "--prefix", "150"],
        "starts before the compression point",
    ),
    # budgets, set sizes and unbounded work: refused up front, before any model work
    (
        "select-seed-range-huge",
        None,
        ["probe", "--chunk", "128:160", "--select", "random:remove=0.1@0-99999999999"],
        "seeds; at most 1000 per spec",
    ),
    (
        "select-positions-huge",
        None,
        ["probe", "--chunk", "128:160", "--select", "positions:0-99999999"],
        "position 99,999,999 is past any model's context",
    ),
    (
        "select-budget-side",
        None,
        ["probe", "--chunk", "128:160", "--select", "entropy:hold=0.1"],
        "write keep=X or remove=X",
    ),
    (
        "select-budget-nan",
        None,
        ["probe", "--chunk", "128:160", "--select", "attention:remove=nan"],
        "invalid budget in --select attention:remove=nan: 'nan' is not a number",
    ),
    (
        "select-budget-inf-share",
        None,
        ["probe", "--chunk", "128:160", "--select", "attention:remove=1e999"],
        "a share must lie in [0, 1]",
    ),
    (
        "select-policy-budget",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:snapkv@keep=1.5"],
        "a share must lie in [0, 1]",
    ),
    (
        "select-removes-nothing",
        None,
        ["probe", "--chunk", "128:160", "--select", "entropy:remove=0.001"],
        "removes 0 of the 128 prefix positions",
    ),
    (
        "select-more-than-candidates",
        None,
        ["probe", "--chunk", "128:160", "--select", "entropy:remove=0.9"],
        "needs more than the 92 candidate positions [4, 96)",
    ),
    (
        "select-policy-keeps-all",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:snapkv@keep=1.0"],
        "keeps all 128 prefix positions: nothing to measure",
    ),
    (
        "select-policy-window-only",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:infokv@keep=0.2"],
        "budget keep=0.2 keeps 26 of 128 tokens, not above the window of 32",
    ),
    ("chunk-twice", None, ["probe", "--chunk", "128:160", "--chunk", "128:160"], "chunk 128:160 is given twice"),
    ("nearfar-seeds-huge", None, ["nearfar", "--seeds", "99999999999"], "--seeds must lie in [1, 1000]"),
    (
        "nearfar-budget-tiny",
        None,
        ["nearfar", "--prefix", "128", "--budget", "remove=0.001"],
        "removes 0 of the 128 prefix positions",
    ),
    ("nearfar-budget-all", None, ["nearfar", "--budget", "remove=1.0"], "removes nothing or everything"),
    ("correlate-seed-negative", None, ["correlate", "--chunk", "128:160", "--seed=-1"], "--seed"),
    # the gradient estimator: its options, and options it would ignore
    (
        "estimator-unknown",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "taylor"],
        "unknown --estimator 'taylor' (choose exact or fisher)",
    ),
    (
        "estimator-samples-0",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--samples", "0"],
        "--samples must be >= 1, got 0",
    ),
    (
        "estimator-validate-too-many",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--validate", "93"],
        "--validate 93 must lie in [0, 92], the number of candidate positions",
    ),
    (
        "estimator-fisher-candidates",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--candidates", "all"],
        "--candidates goes with --estimator exact",
    ),
    (
        "estimator-fisher-batch-size",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--batch-size", "4"],
        "--batch-size sets the batches of exact FI: with --estimator fisher it needs --validate N",
    ),
    (
        "estimator-exact-samples",
        None,
        ["correlate", "--chunk", "128:160", "--samples", "8"],
        "--samples and --validate go with --estimator fisher",
    ),
    (
        "estimator-exact-validate",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "exact", "--validate", "8"],
        "--samples and --validate go with --estimator fisher",
    ),
    ("scores-estimator-without-chunk", None, ["scores", "--estimator", "fisher"], "go with --fi-chunk START:END"),
    (
        "scores-estimator-unknown",
        None,
        ["scores", "--prefix", "128", "--fi-chunk", "128:160", "--estimator", "x"],
        "unknown --estimator 'x'",
    ),
    (
        "scores-samples-0",
        None,
        ["scores", "--prefix", "128", "--fi-chunk", "128:160", "--samples", "0"],
        "--samples must be >= 1, got 0",
    ),
    (
        "scores-exact-samples",
        None,
        ["scores", "--prefix", "128", "--fi-chunk", "128:160", "--estimator", "exact", "--samples", "4"],
        "--samples and --seed go with --estimator fisher",
    ),
    (
        "scores-fi-chunk-before-prefix",
        None,
        ["scores", "--prefix", "128", "--fi-chunk", "100:160"],
        "starts before the compression point",
    ),
    ("generate-budget-side", None, ["generate", "hi", "--budget", "hold=0.2"], "write keep=X or remove=X"),
    # fi eval: lists, tasks, policies and budgets are checked before the model is loaded
    ("eval-unknown-task", None, ["eval", "--task", "sudoku"], "unknown task 'sudoku'"),
    ("eval-unknown-policy", None, ["eval", "--policy", "infokv,lru"], "unknown policy 'lru'"),
    (
        "eval-malformed-policy-list",
        None,
        ["eval", "--policy", "infokv,,snapkv"],
        "--policy must be a comma-separated list without empty items",
    ),
    (
        "eval-malformed-budget-list",
        None,
        ["eval", "--budget", "0.1,abc"],
        "invalid budget in --budget: 'abc' is not a number",
    ),
    ("eval-budget-trailing-comma", None, ["eval", "--budget", "0.1,"], "--budget must be a comma-separated list"),
    (
        "eval-malformed-context",
        None,
        ["eval", "--task", "passkey", "--context", "1024,2k"],
        "--context must list whole numbers, got '2k'",
    ),
    ("eval-repeated-task", None, ["eval", "--task", "passkey,passkey"], "--task lists an item twice"),
    (
        "eval-unknown-protocol",
        None,
        ["eval", "--task", "passkey", "--protocol", "question-first"],
        "unknown protocol 'question-first'",
    ),
    ("eval-interval-0", None, ["eval", "--interval", "0"], "--interval must be >= 1, got 0"),
    (
        "eval-budget-below-window",
        None,
        ["eval", "--budget", "0.01", "--prompt", "512", "--length", "1024"],
        "budget keep=0.01 keeps at most 10 of the 1024 tokens it may compress, not above the window of 32",
    ),
    (
        "eval-task-budget-below-window",
        None,
        ["eval", "--task", "passkey", "--context", "512", "--budget", "0.05"],
        "budget keep=0.05 keeps 26 of a 512-token context, not above the window of 32",
    ),
    ("eval-generated-0", None, ["eval", "--future", "generated:0"], "--future generated:0 generates nothing"),
    (
        "eval-future-and-length",
        None,
        ["eval", "--future", "generated:64", "--length", "900"],
        "--length and --future generated:64 both set the length",
    ),
    ("eval-docs-and-task", None, ["eval", "alice", "--task", "passkey"], "give documents or --task, not both"),
    (
        "eval-length-not-after-prompt",
        None,
        ["eval", "--prompt", "1024", "--length", "1024"],
        "leaves nothing after the 1024-token prompt",
    ),
    ("eval-into-a-nearfar-run", a_run, ["eval", "--out", "run"], "already holds results (a 'nearfar' run)"),
    (
        "correlate-fisher-samples-huge",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--samples", "99999999999"],
        "--samples must be at most 10,000",
    ),
    (
        "scores-fisher-samples-huge",
        None,
        ["scores", "--prefix", "128", "--fi-chunk", "128:160", "--estimator", "fisher", "--samples", "99999999999"],
        "--samples must be at most 10,000",
    ),
    (
        "eval-samples-huge",
        None,
        ["eval", "--task", "passkey", "--samples", "99999999999"],
        "--samples must lie in [1, 1,000]",
    ),
    (
        "eval-samples-0",
        None,
        ["eval", "--task", "passkey", "--samples", "0"],
        "--samples must lie in [1, 1,000], got 0",
    ),
    ("eval-resamples-huge", None, ["eval", "--resamples", "99999999999"], "--resamples must lie in [0, 100,000]"),
    ("eval-resamples-negative", None, ["eval", "--resamples=-1"], "--resamples must lie in [0, 100,000], got -1"),
    (
        "correlate-resamples-huge",
        None,
        ["correlate", "--chunk", "128:160", "--resamples", "99999999999"],
        "--resamples must lie in [0, 100,000]",
    ),
    ("eval-free-tokens-negative", None, ["eval", "--free-tokens=-1"], "--free-tokens must be >= 0, got -1"),
    ("eval-interval-nan", None, ["eval", "--interval", "nan"], "Invalid value for '--interval'"),
    ("eval-budget-nan", None, ["eval", "--budget", "0.25,nan"], "invalid budget in --budget: 'nan' is not a number"),
    (
        "eval-future-nan",
        None,
        ["eval", "--future", "generated:nan"],
        "--future must be 'document' or 'generated:N[@SEED]'",
    ),
    ("probe-generated-0", None, ["probe", "--chunk", "128:160", "--future", "generated:0"], "generates nothing"),
    (
        "probe-chunk-past-generated",
        None,
        ["probe", "--chunk", "128:260", "--future", "generated:64"],
        "chunk 128:260 ends past p + N = 192",
    ),
    # sharded runs and placement
    (
        "nearfar-into-a-run-of-another-world-size",
        a_run_of_world(2),
        ["nearfar", "--out", "run"],
        "already holds results (a 'nearfar' run computed with world size 2, this run has 1); pass --resume to continue "
        "it with any world size or --overwrite to replace it",
    ),
    (
        "device-map-and-device",
        None,
        ["probe", "--chunk", "128:160", "--device", "cpu", "--device-map", "auto"],
        "--device-map places the model's layers across devices; it does not go with --device (give one)",
    ),
    (
        "device-map-and-device-nearfar",
        None,
        ["nearfar", "--device", "cuda", "--device-map", "auto"],
        "it does not go with --device",
    ),
    (
        "unit-sets-negative",
        None,
        ["nearfar", "--unit-sets", "-2"],
        "--unit-sets must be >= 0 (0: one unit per document), got -2",
    ),
    (
        "unit-sets-huge",
        None,
        ["nearfar", "--unit-sets", "99999999999999999999999"],
        "--unit-sets must be at most 1,000,000 items per unit (0: one unit per document), got 99999999999999999999999",
    ),
    (
        "unit-candidates-huge",
        None,
        ["correlate", "--chunk", "128:160", "--unit-candidates", "1000001"],
        "--unit-candidates must be at most 1,000,000 items per unit (0: one unit per document), got 1000001",
    ),
    (
        "unit-policies-huge",
        None,
        ["eval", "--unit-policies", "10000000"],
        "--unit-policies must be at most 1,000,000 items per unit (0: one unit per document), got 10000000",
    ),
    ("unit-sets-nan", None, ["nearfar", "--unit-sets", "nan"], "Invalid value for '--unit-sets'"),
    (
        "unit-candidates-inf",
        None,
        ["correlate", "--chunk", "128:160", "--unit-candidates", "inf"],
        "Invalid value for '--unit-candidates'",
    ),
    ("unit-policies-float", None, ["eval", "--unit-policies", "1.5"], "Invalid value for '--unit-policies'"),
    (
        "unit-candidates-negative",
        None,
        ["correlate", "--chunk", "128:160", "--unit-candidates", "-1"],
        "--unit-candidates must be >= 0 (0: one unit per document), got -1",
    ),
    (
        "unit-candidates-fisher",
        None,
        ["correlate", "--chunk", "128:160", "--estimator", "fisher", "--unit-candidates", "8"],
        "--unit-candidates splits exact per-token FI; the fisher estimate is one unit per document",
    ),
    (
        "unit-policies-negative",
        None,
        ["eval", "--unit-policies", "-3"],
        "--unit-policies must be >= 0 (0: one unit per document), got -3",
    ),
    (
        "unit-policies-tasks",
        None,
        ["eval", "--task", "passkey", "--unit-policies", "2"],
        "--unit-policies splits text documents; a task run's unit is already one sample",
    ),
    (
        "device-map-bad-json",
        None,
        ["correlate", "--chunk", "128:160", "--device-map", "{layers: 0}"],
        "--device-map '{layers: 0}' is not valid JSON",
    ),
    ("device-map-not-a-map", None, ["eval", "--device-map", "[0, 1]"], "must map module names to devices"),
    (
        "device-map-no-file",
        None,
        ["scores", "--device-map", "nomap.json"],
        "--device-map 'nomap.json' is neither auto, balanced, balanced_low_0, sequential, a JSON object nor a readable "
        "JSON file",
    ),
    # models: say what really failed
    (
        "model-unknown-architecture",
        unknown_architecture,
        ["probe", "--chunk", "128:160", "--model", "bad-model"],
        "cannot load model from 'bad-model': The checkpoint you are trying to load has model type "
        "`no-such-architecture`",
    ),
    (
        "model-not-in-cache",
        None,
        ["probe", "--chunk", "128:160", "--model", NO_SUCH_HUB_ID],
        f"unknown model '{NO_SUCH_HUB_ID}': not 'smollm2-135m', not a local model directory, and not in the local "
        f"Hugging Face cache",
    ),
    (
        "generate-model-unknown-architecture",
        unknown_architecture,
        ["generate", "hi", "--model", "bad-model"],
        "model type `no-such-architecture`",
    ),
    # a --model directory without a model: said from its listing, before transformers reads it
    (
        "model-empty-directory",
        a_model_dir(),
        ["probe", "--chunk", "128:160", "--model", "m"],
        "--model 'm' is an empty",
    ),
    (
        "model-without-config",
        a_model_dir("notes.txt"),
        ["correlate", "--chunk", "128:160", "--model", "m"],
        "--model 'm' holds no config.json, only 1 entry (notes.txt)",
    ),
    (
        "model-gguf-directory",
        a_model_dir("x.gguf"),
        ["generate", "hi", "--model", "m"],
        "--model 'm' holds no config.json, only a GGUF file (x.gguf), which only smollm2-135m is read from",
    ),
    (
        "model-without-weights",
        a_model_dir("config.json", "tokenizer.json"),
        ["tasks", "export", "--task", "passkey", "--out", "t", "--model", "m"],
        "--model 'm' holds config.json but no weights",
    ),
    ("model-is-a-file", a_file, ["view", "alice", "--model", "f"], "--model 'f' is a file"),
    # a chunk past the document's end: counted before the model's weights load (bounded by the bytes, or the
    # embedded model's tokenizer.json once its converted copy exists), for every command that reads documents
    *[
        (f"{argv[0]}-past-the-document", None, argv, message + " ends past the end of document 'alice' (")
        for argv, message in [
            (["probe", "--chunk", "512:99999999"], "chunk 512:99999999"),
            (["correlate", "--chunk", "512:99999999"], "chunk 512:99999999"),
            (["nearfar", "--distances", "0,99999999"], "the farthest chunk 100001023:100001279"),
            (["scores", "--prefix", "99999999"], "--prefix 99,999,999"),
            (["fit-data", "--chunk", "512:99999999", "--out", "fd"], "chunk 512:99999999"),
            (["eval", "--length", "99999999", "--interval", "9999999"], "the replay's length 99,999,999 (--length)"),
            (["field", "alice", "--distances", "0,99999999"], "the farthest chunk 100001023:100001151"),
            (["view", "alice", "--chunk", "1024:99999999"], "chunk 1024:99999999"),
        ]
    ],
    (
        "probe-past-the-tokenizers-count",
        a_checkpoint,
        ["probe", "doc.txt", "--model", "ckpt", "--chunk", "128:160"],
        "chunk 128:160 ends past the end of document 'doc' (100 tokens)",
    ),
    # kvpress presses: a budget is checked before kvpress is imported; the name and whether it takes one need kvpress
    (
        "kvpress-no-budget",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:SnapKVPress"],
        "give SnapKVPress's budget, kvpress:SnapKVPress@keep=X or @remove=X" if HAS_KVPRESS else KVPRESS_MISSING,
    ),
    # a press's budget spells its side: kvpress's compression_ratio is the share removed, a bare budget elsewhere
    # the share kept, so a bare number is refused with both spellings of it (in the spec: without kvpress too)
    (
        "kvpress-bare-ratio",
        None,
        ["probe", "alice", "--chunk", "512:640", "--select", "kvpress:SnapKVPress@0.75"],
        "error: --select kvpress:SnapKVPress@0.75: write keep=0.25 or remove=0.75: kvpress's compression_ratio is "
        "the share removed",
    ),
    (
        "kvpress-bare-ratio-without-kvpress",
        without_kvpress,
        ["probe", "alice", "--chunk", "512:640", "--select", "kvpress:AdaKVPress/SnapKVPress@0.7:window_size=16"],
        "--select kvpress:AdaKVPress/SnapKVPress@0.7:window_size=16: write keep=0.3 or remove=0.7: ",
    ),
    (
        "kvpress-bare-ratio-1",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:SnapKVPress@1.0"],
        "write keep=X or remove=X, X a share of the prefix strictly between 0 and 1",
    ),
    (
        "kvpress-budget-count",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:SnapKVPress@keep=100"],
        "keep=100 is a token count; a press takes a share of the prefix",
    ),
    (
        "kvpress-budget-text",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:SnapKVPress@most"],
        "'most' is not a number",
    ),
    (
        "kvpress-budget-keeps-all",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:SnapKVPress@keep=1.0"],
        "keep=1.0 must keep some and remove some",
    ),
    (
        "kvpress-budget-nan",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:TOVAPress@remove=nan"],
        "'nan' is not a number",
    ),
    (
        "kvpress-bad-option",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:SnapKVPress@keep=0.5:7"],
        "expected options like window_size=32",
    ),
    (
        "kvpress-unknown-press",
        None,
        ["probe", "--chunk", "128:160", "--select", "kvpress:NoSuchPress@keep=0.5"],
        "unknown kvpress press 'NoSuchPress'" if HAS_KVPRESS else KVPRESS_MISSING,
    ),
    (
        "eval-kvpress-budget",
        None,
        ["eval", "--policy", "kvpress:TOVAPress@0.75"],
        "--policy kvpress:TOVAPress@0.75: write keep=0.25 or remove=0.75: kvpress's compression_ratio is the share",
    ),
    # one method spec, NAME[@BUDGET][:key=value,...]: what a command cannot measure is refused by name
    ("select-without-budget", None, ["probe", "--chunk", "128:160", "--select", "snapkv"], "needs a budget"),
    (
        "select-budget-after-options",
        None,
        ["probe", "--chunk", "128:160", "--select", "infokv:alpha=0.5@keep=0.25"],
        "write the budget before the options: infokv@keep=0.25:OPTIONS",
    ),
    (
        "eval-token-set",
        None,
        ["eval", "--policy", "set:entropy@remove=0.1"],
        "--policy set:entropy@remove=0.1: set:entropy@remove=0.1 is a token set of the probe's analysis",
    ),
    (
        "field-method-budget-not-mapped",
        None,
        ["field", "--policy", "snapkv@keep=0.3", "--budget", "keep=0.25"],
        "--policy snapkv@keep=0.3: its budget keep=0.3 is none of the map's (keep=0.25)",
    ),
    # the oracle anchor's options (--oracle): fi-oracle's own names and ranges; chunk and seed are the map's
    (
        "field-oracle-unknown-option",
        None,
        ["field", "--oracle", "bogus=1"],
        "--oracle bogus=1: fi-oracle has no option 'bogus'",
    ),
    ("field-oracle-out-of-range", None, ["field", "--oracle", "samples=0"], "samples must lie in [1, 10,000], got 0"),
    (
        "field-oracle-not-key-value",
        None,
        ["field", "--oracle", "samples"],
        "--oracle samples: expected options like fi-oracle:key=value,key=value, got 'samples'",
    ),
    (
        "field-oracle-sets-chunk",
        None,
        ["field", "--oracle", "samples=4,chunk=1:2"],
        "--oracle may not set chunk: the field map sets it",
    ),
    ("eval-kvpress-not-installed", without_kvpress, ["eval", "--policy", "kvpress:TOVAPress"], KVPRESS_MISSING),
    (
        "kvpress-not-installed",
        without_kvpress,
        ["probe", "--chunk", "128:160", "--select", "kvpress:TOVAPress@keep=0.5"],
        KVPRESS_MISSING,
    ),
    # policy options, spelled NAME[:key=value,...]: refused by name or by the policy's own validation
    (
        "select-policy-option-unknown",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:snapkv@0.25:alpha=0.5"],
        "--select policy:snapkv@0.25:alpha=0.5: snapkv has no option 'alpha' (its options: window)",
    ),
    (
        "select-policy-option-nan",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:infokv@0.5:alpha=nan"],
        "alpha must lie in [0, 1], got nan",
    ),
    (
        "select-policy-option-trace",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:infokv@0.5:top_k=8"],
        "top_k is a signal option every policy of this run shares; give it with --top-k",
    ),
    (
        "select-policy-adaptive-streaming",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:adaptive(streaming)@0.5"],
        "adaptive(streaming): streaming keeps tokens by position, with no scores to weigh layers by",
    ),
    (
        "eval-policy-alpha-nan",
        None,
        ["eval", "--policy", "infokv:alpha=nan"],
        "--policy infokv:alpha=nan: alpha must lie in [0, 1], got nan",
    ),
    (
        "eval-policy-alpha-2",
        None,
        ["eval", "--policy", "infokv:alpha=2"],
        "--policy infokv:alpha=2: alpha must lie in [0, 1], got 2.0",
    ),
    (
        "eval-policy-top-k-0",
        None,
        ["eval", "--policy", "infokv:top_k=0"],
        "--policy infokv:top_k=0: top_k must be >= 1, got 0",
    ),
    (
        "eval-policy-top-k-shared",
        None,
        ["eval", "--policy", "snapkv,infokv:top_k=8"],
        "--policy infokv:top_k=8: top_k is a signal option every policy of this run shares; give it with --top-k",
    ),
    (
        "eval-policy-option-unknown",
        None,
        ["eval", "--policy", "infokv:nonsense=1,snapkv"],
        "--policy infokv:nonsense=1: infokv has no option 'nonsense' (its options: window, alpha, tau, top_k)",
    ),
    (
        "eval-policy-option-not-a-number",
        None,
        ["eval", "--policy", "infokv:tau=high"],
        "tau must be a number, got 'high'",
    ),
    (
        "eval-policy-adaptive-streaming",
        None,
        ["eval", "--policy", "adaptive(streaming)"],
        "--policy adaptive(streaming): adaptive(streaming): streaming keeps tokens by position",
    ),
    (
        "generate-policy-alpha-nan",
        None,
        ["generate", "hi", "--policy", "infokv:alpha=nan"],
        "--policy infokv:alpha=nan: alpha must lie in [0, 1], got nan",
    ),
    (
        "generate-policy-alpha-2",
        None,
        ["generate", "hi", "--policy", "infokv:alpha=2"],
        "alpha must lie in [0, 1], got 2.0",
    ),
    (
        "generate-policy-top-k-0",
        None,
        ["generate", "hi", "--policy", "infokv:top_k=0"],
        "--policy infokv:top_k=0: top_k must be >= 1, got 0",
    ),
    (
        "generate-policy-option-unknown",
        None,
        ["generate", "hi", "--policy", "infokv:nonsense=1"],
        "infokv has no option 'nonsense' (its options: window, alpha, tau, top_k)",
    ),
    (
        "generate-policy-option-of-another",
        None,
        ["generate", "hi", "--policy", "snapkv:tau=2"],
        "snapkv has no option 'tau'",
    ),
    (
        "generate-policy-adaptive-streaming",
        None,
        ["generate", "hi", "--policy", "adaptive(streaming)"],
        "adaptive(streaming): streaming keeps tokens by position",
    ),
    (
        "generate-policy-adaptive-random",
        None,
        ["generate", "hi", "--policy", "random-adaptive"],
        "adaptive(random): random draws its scores at random",
    ),
    ("generate-policy-unknown", None, ["generate", "hi", "--policy", "lru:alpha=1"], "unknown policy 'lru'"),
    # the install hint names what the user wrote: a policy is a policy, a selection a selection
    (
        "eval-kvpress-hint-names-the-policy",
        without_kvpress,
        ["eval", "--policy", "kvpress:TOVAPress"],
        "error: --policy kvpress:TOVAPress needs the kvpress extra (",
    ),
    (
        "probe-kvpress-hint-names-the-selection",
        without_kvpress,
        ["probe", "--chunk", "128:160", "--select", "kvpress:TOVAPress@keep=0.5"],
        "error: --select kvpress:TOVAPress@keep=0.5 needs the kvpress extra (",
    ),
    # fi lm-eval: --model fi's model arguments are checked before lm-eval or a model loads
    (
        "lmeval-unknown-policy",
        None,
        ["lm-eval", "--model", "fi", "--model_args", "policy=bogus", "--tasks", "x"],
        "unknown policy 'bogus'",
    ),
    (
        "lmeval-budget-below-window",
        None,
        ["lm-eval", "--model", "fi", "--model_args", "policy=infokv,budget=keep=16", "--tasks", "x"],
        "budget=keep=16 cannot hold the observation window of 32",
    ),
    (
        "lmeval-interval-zero",
        None,
        ["lm-eval", "--model", "fi", "--model_args", "policy=infokv,interval=0", "--tasks", "x"],
        "interval=0: need an integer >= 1",
    ),
    (
        "lmeval-nan-option",
        None,
        ["lm-eval", "--model", "fi", "--model_args", "policy=infokv,alpha=nan", "--tasks", "x"],
        "alpha=nan: not a finite number",
    ),
    (
        "lmeval-unknown-option",
        None,
        ["lm-eval", "--model", "fi", "--model_args", "policy=snapkv,alpha=0.5", "--tasks", "x"],
        "policy snapkv has no option alpha",
    ),
    (
        "lmeval-bad-pair",
        None,
        ["lm-eval", "--model=fi", "--model_args=policy", "--tasks", "x"],
        "write KEY=VALUE pairs separated by commas",
    ),
    (
        "lmeval-batch-size-zero",
        None,
        ["lm-eval", "--model", "fi", "--batch_size", "0", "--tasks", "x"],
        "batch_size='0': need an integer >= 1, auto or auto:N",
    ),
    (
        "lmeval-batch-size-text",
        None,
        ["lm-eval", "--model", "fi", "--model_args", "batch_size=many", "--tasks", "x"],
        "batch_size='many': need an integer >= 1, auto or auto:N",
    ),
    (
        "lmeval-device-unknown",
        None,
        ["lm-eval", "--model", "fi", "--device", "tpu", "--tasks", "x"],
        "device 'tpu' does not exist (use auto, cpu, cuda, cuda:N or mps)",
    ),
    # equal specifications, compared after parsing: refused in one line naming both spellings
    (
        "eval-budget-equal",
        None,
        ["eval", "--budget", "0.75,keep=0.75"],
        "--budget gives one budget twice: '0.75' and 'keep=0.75' are both keep=0.75",
    ),
    (
        "eval-task-alias",
        None,
        ["eval", "--task", "multikey_needle,niah"],
        "--task names one task twice: 'multikey_needle' and 'niah' are both multikey_needle",
    ),
    (
        "eval-context-equal",
        None,
        ["eval", "--task", "passkey", "--context", "1024,01024"],
        "--context lists an item twice: 1024, 1024",
    ),
    (
        "eval-policy-default-option",
        None,
        ["eval", "--policy", "infokv,infokv:alpha=0.9"],
        "--policy gives one policy twice: 'infokv' and 'infokv:alpha=0.9' are the same policy with the same options",
    ),
    (
        "eval-policy-adaptive-spellings",
        None,
        ["eval", "--policy", "adaptive(infokv),snapkv,infokv-adaptive"],
        "--policy gives one policy twice: 'adaptive(infokv)' and 'infokv-adaptive' are the same policy",
    ),
    (
        "eval-documents-twice",
        None,
        ["eval", "alice", "alice"],
        "documents 'alice' (bundled:alice) and 'alice' (bundled:alice) hold the same text; give each document once",
    ),
    ("probe-documents-twice", None, ["probe", "alice", "alice", "--chunk", "128:160"], "hold the same text"),
    ("nearfar-documents-twice", None, ["nearfar", "alice", "alice"], "hold the same text"),
    (
        "select-equal-budgets",
        None,
        ["probe", "--chunk", "128:160", "--select", "entropy:0.1", "--select", "entropy:keep=0.1"],
        "--select entropy:0.1 and --select entropy:keep=0.1 select the same set (entropy:keep=0.1); give it once",
    ),
    (
        "select-random-seed-twice",
        None,
        ["probe", "--chunk", "128:160", "--select", "random:remove=0.1@0-2", "--select", "random:remove=0.1@1"],
        "select the same set (random:remove=0.1@1)",
    ),
    (
        "select-policy-default-option",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:snapkv@0.5", "--select", "policy:snapkv@keep=0.5"],
        "select the same set (policy:snapkv@keep=0.5)",
    ),
    # fitted policies and fi fit; a file fitted on another architecture: tests/test_fit.py (needs a model)
    (
        "select-fitted-missing",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fitted@0.25:path=no.json"],
        "--select policy:fitted@0.25:path=no.json: fitted policy 'no.json': no such file (make one with fi fit)",
    ),
    (
        "select-fitted-no-path",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fitted@0.25"],
        "fitted needs the fitted JSON: fitted:path=FILE",
    ),
    (
        "select-fitted-corrupt",
        fitted_file("{not json"),
        ["probe", "--chunk", "128:160", "--select", "policy:fitted@0.25:path=p.json"],
        "not a fitted-policy JSON",
    ),
    (
        "select-fitted-nan",
        fitted_file(fitted_record(coefficients=[float("nan")])),
        ["probe", "--chunk", "128:160", "--select", "policy:fitted@0.25:path=p.json"],
        "'coefficients' holds a non-finite value",
    ),
    (
        "eval-fitted-inf",
        fitted_file(fitted_record(scale=[float("inf")])),
        ["eval", "--policy", "fitted:path=p.json"],
        "'scale' holds a non-finite value",
    ),
    (
        "eval-fitted-missing-features",
        fitted_file(fitted_record(features=["attention", "gaze"])),
        ["eval", "--policy", "fitted:path=p.json"],
        "unknown feature 'gaze'",
    ),
    (
        "eval-fitted-no-features",
        fitted_file(fitted_record(features=None)),
        ["eval", "--policy", "fitted:path=p.json"],
        "no features listed",
    ),
    ("generate-fitted-missing", None, ["generate", "hi", "--policy", "fitted:path=no.json"], "'no.json': no such file"),
    # the surrogate's directory: read as JSON and safetensors only (a pickle is never loaded)
    (
        "select-surrogate-missing",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:surrogate@0.25:path=no"],
        "surrogate 'no' is not a directory (it holds config.json and model.safetensors)",
    ),
    (
        "select-surrogate-foreign",
        surrogate_dir('{"model_type": "llama"}'),
        ["probe", "--chunk", "128:160", "--select", "policy:surrogate@0.25:path=s"],
        "surrogate 's': config.json is not a KVzap model's (model_type must be 'kvzap')",
    ),
    (
        "eval-surrogate-pickle",
        surrogate_dir(
            '{"model_type": "kvzap", "input_dim": 4, "output_dim": 1, "n_modules": 1, "hidden_dim": null}',
            b"\x80\x04\x95 a pickle, not safetensors",
        ),
        ["eval", "--policy", "surrogate:path=s"],
        "surrogate 's': model.safetensors is not a safetensors file",
    ),
    (
        "generate-fitted-no-architecture",
        fitted_file(fitted_record(model={"name": "x"})),
        ["generate", "hi", "--policy", "fitted:path=p.json"],
        "the model's architecture (layers, kv_heads, head_dim) is missing",
    ),
    (
        "fit-run-without-fi",
        a_run,
        ["fit", "run", "--out", "p.json"],
        "'run' holds no per-token FI per layer and KV head (fit_rows.parquet): make it with fi fit-data",
    ),
    (
        "fit-manifest-incomplete",
        lambda t: (
            fit_data_run(["a", "b"])(t),
            (t / "fd" / "manifest.json").write_text(json.dumps({"command": "fit-data"})),
        ),
        ["fit", "fd", "--out", "p.json"],
        "its manifest.json lacks 'model'",
    ),
    ("fit-no-such-run", None, ["fit", "nowhere", "--out", "p.json"], "'nowhere' is not a run directory"),
    (
        "fit-one-document",
        fit_data_run(["a"]),
        ["fit", "fd", "--out", "p.json"],
        "fi fit needs rows of at least two documents to cross-validate (leaving one out), got 1",
    ),
    (
        "fit-unknown-feature",
        fit_data_run(["a", "b"]),
        ["fit", "fd", "--out", "p.json", "--features", "attention,gaze"],
        "--features names an unknown feature 'gaze'",
    ),
    (
        "fit-ridge-nan",
        fit_data_run(["a", "b"]),
        ["fit", "fd", "--out", "p.json", "--ridge", "nan"],
        "--ridge must be a finite number >= 0, got nan",
    ),
    (
        "fit-ridge-negative",
        fit_data_run(["a", "b"]),
        ["fit", "fd", "--out", "p.json", "--ridge", "-1"],
        "--ridge must be a finite number >= 0, got -1.0",
    ),
    (
        "fit-target-unknown",
        fit_data_run(["a", "b"]),
        ["fit", "fd", "--out", "p.json", "--target", "top"],
        "--target must be one of rank, log, got 'top'",
    ),
    (
        "fit-exclude-unknown",
        fit_data_run(["a", "b"]),
        ["fit", "fd", "--out", "p.json", "--exclude", "c"],
        "--exclude 'c': no such document in the runs (a, b)",
    ),
    (
        "fit-exclude-to-one",
        fit_data_run(["a", "b"]),
        ["fit", "fd", "--out", "p.json", "--exclude", "a"],
        "needs rows of at least two documents",
    ),
    ("fit-out-not-json", fit_data_run(["a", "b"]), ["fit", "fd", "--out", "p.txt"], "--out must end in .json"),
    (
        "fit-data-samples-0",
        None,
        ["fit-data", "--chunk", "128:160", "--out", "fd", "--samples", "0"],
        "--samples must be >= 1, got 0",
    ),
    (
        "fit-data-sinks-negative",
        None,
        ["fit-data", "--chunk", "128:160", "--out", "fd", "--sinks", "-1"],
        "--sinks must lie in [0, 96), got -1",
    ),
    # fi view: every option checked before the model loads
    ("view-missing-document", None, ["view", "no-such-file.txt"], "no-such-file.txt"),
    ("view-policy-unknown", None, ["view", "alice", "--policy", "infokv,lru"], "unknown policy 'lru'"),
    ("view-budget-nan", None, ["view", "alice", "--budget", "keep=nan"], "--budget"),
    ("view-budget-keeps-all", None, ["view", "alice", "--budget", "keep=1.0"], "keeps all 1,024 prefix tokens"),
    (
        "view-chunk-before-p",
        None,
        ["view", "alice", "--chunk", "512:768"],
        "starts before the compression point p=1024",
    ),
    (
        "view-chunk-past-document",
        short_text,
        ["view", "short.txt", "--prefix", "160", "--chunk", "160:400"],
        "chunk 160:400 ends past the end of document 'short",
    ),
    ("view-chunk-malformed", None, ["view", "alice", "--chunk", "a:b"], "invalid chunk 'a:b'"),
    ("view-samples-0", None, ["view", "alice", "--samples", "0"], "--samples must be >= 1"),
    ("view-out-not-html", None, ["view", "alice", "--out", "page.txt"], "--out must end in .html"),
    (
        "view-out-exists",
        lambda t: (t / "page.html").write_text("old"),
        ["view", "alice", "--out", "page.html"],
        "--out 'page.html' exists",
    ),
    ("view-out-under-file", a_file, ["view", "alice", "--out", "f/page.html"], "lies under 'f'"),
    # the FI oracle: it sees the future, so only fi probe measures it; its options
    (
        "generate-fi-oracle",
        None,
        ["generate", "hi", "--policy", "fi-oracle"],
        "--policy fi-oracle: fi-oracle is an oracle that sees the future text",
    ),
    (
        "eval-fi-oracle",
        None,
        ["eval", "--task", "passkey", "--policy", "snapkv,fi-oracle:rounds=2"],
        "fi-oracle is an oracle that sees the future text",
    ),
    (
        "select-oracle-chunk-before-p",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:chunk=64:96"],
        "the oracle's chunk 64:96 starts before the compression point p=128",
    ),
    (
        "select-oracle-chunk-malformed",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:chunk=160"],
        "chunk must be START:END with integers",
    ),
    (
        "select-oracle-rounds-0",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:rounds=0"],
        "rounds must lie in [1, 64], got 0",
    ),
    (
        "select-oracle-rounds-negative",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:rounds=-2"],
        "rounds must lie in [1, 64], got -2",
    ),
    (
        "select-oracle-rounds-nan",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:rounds=nan"],
        "rounds must be a whole number, got 'nan'",
    ),
    (
        "select-oracle-rounds-huge",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:rounds=99999999999"],
        "rounds must lie in [1, 64], got 99999999999",
    ),
    (
        "select-oracle-estimator",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:fi-oracle@0.5:estimator=taylor"],
        "unknown estimator 'taylor' (choose fisher or exact)",
    ),
    # the decoding oracle: fi eval on documents looks ahead; no continuation, no oracle
    (
        "generate-fi-oracle-options",
        None,
        ["generate", "hi", "--policy", "fi-oracle:samples=4", "--budget", "0.5"],
        "--policy fi-oracle:samples=4: fi-oracle is an oracle that sees the future text",
    ),
    (
        "eval-task-fi-oracle",
        None,
        ["eval", "--task", "passkey", "--policy", "fi-oracle"],
        "--policy fi-oracle: fi-oracle is an oracle that sees the future text; it is measured only where the "
        "continuation is known",
    ),
    (
        "eval-fi-oracle-exact",
        None,
        ["eval", "alice", "--policy", "snapkv,fi-oracle:estimator=exact"],
        "--policy fi-oracle:estimator=exact: fi-oracle in a replay scores every cache entry by the Fisher estimate",
    ),
    (
        "eval-fi-oracle-chunk",
        None,
        ["eval", "alice", "--policy", "fi-oracle:chunk=1024:1100"],
        "chunk=1024:1100 is the prefill oracle's",
    ),
    (
        "eval-fi-oracle-samples-0",
        None,
        ["eval", "alice", "--policy", "fi-oracle:samples=0"],
        "samples must lie in [1, 10,000], got 0",
    ),
    (
        "eval-fi-oracle-samples-nan",
        None,
        ["eval", "alice", "--policy", "fi-oracle:samples=nan"],
        "samples must be a whole number, got 'nan'",
    ),
    (
        "eval-fi-oracle-rounds-huge",
        None,
        ["eval", "alice", "--policy", "fi-oracle:rounds=1000"],
        "rounds must lie in [1, 64], got 1000",
    ),
    (
        "eval-fi-oracle-unknown-option",
        None,
        ["eval", "alice", "--policy", "fi-oracle:horizon=64"],
        "fi-oracle has no option 'horizon'",
    ),  # --- the defects found by trying about 150 hostile inputs ---
    ("fit-out-in-proc", fit_data_run(["a", "b"]), ["fit", "fd", "--out", "/proc/x.json"], "cannot be written"),
    (
        "probe-default-runs-is-a-file",
        lambda t: (t / "runs").write_text("x\n"),
        ["probe", "--chunk", "128:160"],
        "the default results directory 'runs' is a file, not a directory",
    ),
    ("view-out-in-proc", None, ["view", "alice", "--out", "/proc/x.html"], "cannot be written"),
    ("tasks-export-out-is-a-file", a_file, ["tasks", "export", "--out", "f"], "--out 'f' is a file, not a directory"),
    (
        "tasks-export-replaces-a-users-file",
        lambda t: (a_directory("t")(t), (t / "t" / "fi_passkey.yaml").write_text("mine\n")),
        ["tasks", "export", "--task", "passkey", "--out", "t"],
        "--out 't' already holds fi_passkey.yaml; choose another directory or pass --overwrite",
    ),
    (
        "tasks-export-task-twice",
        None,
        ["tasks", "export", "--task", "passkey,passkey", "--out", "t"],
        "--task names 'passkey' twice",
    ),
    (
        "tasks-export-one-option-per-error",
        None,
        ["tasks", "export", "--max-gen-toks", "0", "--out", "t"],
        "error: --max-gen-toks must be >= 1, got 0",
    ),
    (
        "fit-manifest-wrong-types",
        lambda t: (
            fit_data_run(["a", "b"])(t),
            (t / "fd" / "manifest.json").write_text(
                json.dumps({**json.loads((t / "fd" / "manifest.json").read_text()), "documents": "a,b", "signals": []})
            ),
        ),
        ["fit", "fd", "--out", "p.json"],
        "its manifest.json's 'signals' must be an object of the signals",
    ),
    ("report-same-dir-twice", a_run, ["report", "run", "run/../run"], "'run/../run' and 'run' are the same directory"),
    (
        "report-unfinished-eval",
        lambda t: (a_directory("ev")(t), (t / "ev" / "settings.json").write_text('{"command": "eval"}')),
        ["report", "ev"],
        "holds an unfinished fi eval run (no manifest.json yet): finish it by running the same fi eval command "
        "again with --resume",
    ),
    (
        "fitted-feature-ten-times",
        fitted_file(
            fitted_record(features=["attention"] * 10, mean=[0.0] * 10, scale=[1.0] * 10, coefficients=[1.0] * 10)
        ),
        ["eval", "--policy", "fitted:path=p.json"],
        "the feature 'attention' is listed twice",
    ),
    (
        "fitted-true-coefficient",
        fitted_file(fitted_record(coefficients=[True])),
        ["eval", "--policy", "fitted:path=p.json"],
        "'coefficients' must list 1 numbers, one per feature",
    ),
    (
        "fitted-coefficient-overflows",
        fitted_file(fitted_record(coefficients=[1e308])),
        ["eval", "--policy", "fitted:path=p.json"],
        "'coefficients' holds a value beyond 1e+100 (the score would overflow)",
    ),
    (
        "fitted-path-a-directory",
        a_directory("pd"),
        ["eval", "--policy", "fitted:path=pd"],
        "fitted policy 'pd': is a directory",
    ),
    (
        "fitted-path-dev-null",
        None,
        ["eval", "--policy", "fitted:path=/dev/null"],
        "fitted policy '/dev/null': not a regular file",
    ),
    (
        "view-fi-oracle-refused-as-view",
        None,
        ["view", "alice", "--policy", "fi-oracle"],
        "--policy fi-oracle: fi view marks what compression-time methods evict",
    ),
    (
        "select-budget-under-window-names-select",
        None,
        ["probe", "--chunk", "128:160", "--select", "policy:snapkv@keep=10"],
        "--select policy:snapkv@keep=10: budget keep=10",
    ),
    (
        "select-equal-sets-spelled-apart",
        None,
        ["probe", "--chunk", "128:160", "--select", "entropy:remove=0.1", "--select", "entropy:0.9"],
        "--select entropy:remove=0.1 and --select entropy:0.9 select the same set (both remove 13 of the 128",
    ),
]


@pytest.mark.parametrize("setup, args, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(setup, args, message, finished_run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # default outputs (runs/, report/, scores.csv) would land here
    if setup is not None:
        setup(*(tmp_path, finished_run, monkeypatch)[: setup.__code__.co_argcount])
    before = snapshot(tmp_path)
    code, out, err = run_cli(args, capsys)
    assert code == 2, (code, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and err.count("\n") == 1 and lines[0].startswith("error: "), err
    assert message in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert snapshot(tmp_path) == before  # nothing created, nothing half-written, nothing changed


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(spec):
        raise KeyboardInterrupt

    monkeypatch.setattr("fi_toolkit.documents.read_texts", interrupted)
    code, out, err = run_cli(["probe", "--chunk", "128:160"], capsys)
    assert code == 130
    assert err == "interrupted: results already written are intact\n" and out == ""


def test_sigint_to_a_running_command(tmp_path):
    """A real SIGINT while a command works (here: while it reads its documents) prints the one line."""
    script = textwrap.dedent("""
        import signal, sys, time
        import fi_toolkit.documents as documents
        from fi_toolkit.cli import app as cli

        # A job started in the background (CI runners, `cmd &`) inherits SIGINT as ignored, and Python
        # then installs no KeyboardInterrupt handler; a user's terminal has it. Restore it.
        signal.signal(signal.SIGINT, signal.default_int_handler)

        def slow(spec):
            print("ready", flush=True)
            time.sleep(120)

        documents.read_texts = slow
        sys.argv = ["fi", "probe", "--chunk", "128:160"]
        cli.main()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert err == "interrupted: results already written are intact\n"
    assert list(tmp_path.iterdir()) == []


def _sigint_default():
    """In the child: SIGINT as a terminal delivers it (a job started in the background inherits it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


IMPORTED = "fi_toolkit.cli.entry"  # the console script's guard: from here on Ctrl-C is the one line


@pytest.mark.parametrize(
    "moment, marker, delay",
    [
        ("0.2 s after start", IMPORTED, 0.2),  # the app's modules (typer, rich, the commands) are importing
        ("the app importing", "typer.", 0.0),  # typer's own submodules, under the app's import
        ("the command importing", "torch.", 0.0),  # the command body's imports: torch and the model code
    ],
)
def test_sigint_while_the_modules_import(tmp_path, moment, marker, delay):
    """Ctrl-C while ``python -m fi_toolkit probe`` imports its modules: one line and exit 130, no traceback.

    ``-X importtime`` reports each import as it finishes, so the signal goes at a known moment: ``delay``
    s after start, once ``marker`` was imported (a loaded machine can take longer than 0.2 s to get
    through Python's own start-up, before any of the package runs)."""
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "fi_toolkit", "probe", "--chunk", "128:160"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default,
    )
    started, lines = time.monotonic(), []
    try:
        for line in proc.stderr:
            lines.append(line)
            module = line.rsplit("|", 1)[-1].strip() if line.startswith("import time:") else ""
            if module == marker or (marker.endswith(".") and module.startswith(marker)):
                break
        time.sleep(max(0.0, started + delay - time.monotonic()))
        assert proc.poll() is None, "".join(lines[-5:])  # still importing when the signal goes
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = [line for line in lines + rest.splitlines(keepends=True) if not line.startswith("import time:")]
    assert (proc.returncode, "".join(err), out) == (130, INTERRUPTED_LINE + "\n", ""), moment
    assert list(tmp_path.iterdir()) == []


def test_fifo_document_is_refused_without_waiting_for_a_writer(tmp_path):
    """A FIFO nobody writes to would block ``open()`` forever: refused from its stat, never opened."""
    os.mkfifo(tmp_path / "pipe")
    proc = subprocess.run(
        [sys.executable, "-m", "fi_toolkit", "probe", "pipe", "--chunk", "128:160"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr == "error: 'pipe' is a FIFO (named pipe), not a document: give a text or JSONL file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_document_named_007_keeps_its_name_in_every_merged_table(tiny, tmp_path):
    """Names that look like numbers stay names: per document, merged, and after a resume."""
    ids = torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(5))
    docs = [Document("007", "text", ids, "test"), Document("1e3", "text", ids.flip(0), "test")]
    config = SignalConfig(window=8)
    tables = run_nearfar(
        tiny, docs, NearfarSettings(96, [0, 32], 16, budget="remove=0.1", seeds=1, signals=config), tmp_path / "nf"
    )
    for name in ("nearfar", "token_classes"):
        text = pd.read_csv(tmp_path / "nf" / f"{name}.csv", dtype=str, keep_default_na=False)
        assert set(text["document"]) == {"007", "1e3"}, name
        assert set(tables[name]["document"]) == {"007", "1e3"}, name
    before = (tmp_path / "nf" / "nearfar.csv").read_bytes()
    again = run_nearfar(
        tiny,
        docs,
        NearfarSettings(96, [0, 32], 16, budget="remove=0.1", seeds=1, signals=config),
        RunSettings(tmp_path / "nf", resume=True),
    )
    assert (tmp_path / "nf" / "nearfar.csv").read_bytes() == before
    assert list(again["nearfar"]["document"].unique()) == ["007", "1e3"]


ANSWERS = {"a": [" 3498605.", " 100.", "100"], "b": ["7", "1.50", "-0"]}


class Unit:
    def __init__(self, name):
        self.name, self.sha256 = name, name

    def __len__(self):
        return 10


def _answers(doc, rows=slice(None)):
    """A task run's answers table for a fake sample: answers exactly as a model wrote them."""
    answers = ANSWERS[doc.name][rows]
    return pd.DataFrame(
        {
            "document": doc.name,
            "answer": answers,
            "output": answers,
            "correct": [a.strip() == "100" for a in answers],
            "answer_kl": [0.1, 1e-05, 2.5][rows],
        }
    )


@pytest.mark.parametrize("split", [False, True])
def test_answers_that_look_numeric_stay_text_through_the_merge(tmp_path, split):
    """The merge (and its parts' assembly) joins the units' files: every answer is written back as
    the unit wrote it (" 100." is not 100.0), and numbers stay numbers, read back exactly."""
    docs = [Unit("a"), Unit("b")]
    run = ResumableRun(tmp_path / "run", "eval", {"kind": "tasks"})
    if split:  # each sample in parts of one answer, joined per document by the merge's assemble step
        units = [Part(d, i, 3) for d in docs for i in range(3)]
        tables = run.run(
            units,
            lambda u: {"answers": _answers(u.doc, slice(u.index, u.index + 1))},
            assemble=lambda doc, parts: parts,
        )
    else:
        tables = run.run(docs, lambda d: {"answers": _answers(d)})
    merged = pd.read_csv(tmp_path / "run" / "answers.csv", dtype=str, keep_default_na=False)
    assert list(merged["answer"]) == ANSWERS["a"] + ANSWERS["b"]
    assert list(merged["output"]) == ANSWERS["a"] + ANSWERS["b"]
    assert list(tables["answers"]["answer"]) == ANSWERS["a"] + ANSWERS["b"]
    assert list(tables["answers"]["answer_kl"]) == [0.1, 1e-05, 2.5] * 2  # numbers still numbers, exact
    assert tables["answers"]["correct"].tolist() == [False, False, True, False, False, False]
    if not split:  # the merged file is its units' files one after the other
        parts = [(tmp_path / "run" / "per_document" / d / "answers.csv").read_text().splitlines() for d in "ab"]
        assert (tmp_path / "run" / "answers.csv").read_text().splitlines() == parts[0] + parts[1][1:]


def test_free_tokens_0_leaves_1st_diff_empty_and_floor_kl_is_not_negative(capsys):
    """``fi eval``'s text table: no free generation, no 1st diff; the full cache's mean KL (float rounding
    around 0, here negative) prints as what it is, at most the noise floor, never as a negative KL."""
    from fi_toolkit.cli.eval import _print_text
    from fi_toolkit.evaluation import TextSetting, parse_future
    from fi_toolkit.evaluation.summaries import summarise_replays

    nan = float("nan")
    replays = pd.DataFrame(
        {
            "document": ["d0", "d1", "d0", "d1"],
            "future": "document",
            "policy": ["full", "full", "snapkv", "snapkv"],
            "budget": ["keep=1", "keep=1", "keep=0.25", "keep=0.25"],
            "retention": [1.0, 1.0, 0.25, 0.25],
            "mean_kl": [-4.2e-10, 1e-10, 0.25, 0.35],
            "top1_agreement": [1.0, 1.0, 0.8, 0.9],
            "delta_nll": [0.0, 0.0, 0.1, 0.2],
            "free_first_divergence": [nan] * 4,
            "kept_share": [1.0, 1.0, 0.3, 0.3],
        }
    )
    summary = summarise_replays(replays, n_resamples=0)
    _print_text({"replay_summary": summary}, 2, TextSetting(64, 128, 32, parse_future("document"), 0))
    out = capsys.readouterr().out
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in out.splitlines()
        if line.count("│") > 3 and line.split("│")[1].strip() in ("full", "snapkv")
    }
    assert rows["full"][1] == "≤4.2e-10 (noise floor)" and not rows["full"][1].startswith("-")
    assert rows["snapkv"][1] == "0.3"  # (0.25 + 0.35) / 2
    assert rows["full"][4] == rows["snapkv"][4] == ""  # 1st diff: nothing generated


def test_bare_fi_prints_only_the_help(capsys):
    code, out, err = run_cli([], capsys)
    assert code == 0 and err == ""
    assert "Usage" in out and "probe" in out and "nearfar" in out


def test_parquet_error_leaves_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "t.parquet"

    def broken(self, path, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"PAR1 half")
        raise ValueError("cannot convert column")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", broken)
    with pytest.raises(ValueError):
        results.write_table(target, pd.DataFrame({"a": [1]}))
    assert list(tmp_path.iterdir()) == []


def test_default_directories_are_unique(tmp_path, monkeypatch):
    """Two runs in the same second get different directories; a name taken meanwhile is skipped."""
    names = iter(["beef", "beef", "cafe"])
    monkeypatch.setattr(results.secrets, "token_hex", lambda n: next(names))
    first = results.new_default_dir("probe", tmp_path)
    second = results.new_default_dir("probe", tmp_path)
    assert first != second and first.name.endswith("-beef") and second.name.endswith("-cafe")
    assert first.is_dir() and second.is_dir()


# --- every command answers its argument errors at once, and an unwritable --out before the model ---

HEAVY = ["torch", "transformers", "pandas", "scipy", "numpy"]
ROOT = Path(__file__).resolve().parents[1]
# one error per command that its arguments (and the paths) alone decide: no heavy library is needed for it
ARGUMENT_ERRORS = [
    (["probe", "alice", "--chunk", "160:128"], "invalid chunk '160:128'"),
    (["correlate", "alice", "--chunk", "128:160", "--estimator", "fisher", "--samples", "0"], "--samples must be >= 1"),
    (["nearfar", "alice", "--unit-sets=-1"], "--unit-sets must be >= 0"),
    (["eval", "alice", "--policy", "nosuch"], "unknown policy 'nosuch'"),
    (["generate", "hi", "--max-new", "-1"], "--max-new must be >= 1"),
    (["scores", "alice", "--fi-chunk", "9:3"], "invalid chunk '9:3'"),
    (["fit-data", "alice", "--chunk", "128:160", "--samples", "0", "--out", "fd"], "--samples must be >= 1, got 0"),
    (["fit", "no-such-run", "--out", "p.json"], "'no-such-run' is not a run directory"),
    (["view", "alice", "--policy", "nosuch", "--out", "v.html"], "unknown policy 'nosuch'"),
    (["report", "no-such-run"], "'no-such-run' does not exist"),
    (["lm-eval", "--model", "fi", "--model_args", "policy=nosuch"], "unknown policy 'nosuch'"),
    (["tasks", "export", "--task", "passkey", "--samples", "0", "--out", "t"], "--samples must be >= 1, got 0"),
    (["field", "alice", "--seeds", "0"], "--seeds must lie in [1, 1000], got 0"),
    (["labels", "alice", "--samples", "0", "--out", "l"], "--samples must be >= 1, got 0"),
    (["fit-surrogate", "no-such-run", "--out", "s"], "'no-such-run' is not a directory of fi labels"),
]


def test_every_command_has_an_argument_error_case():
    import typer.main

    from fi_toolkit.cli.app import app

    names = set(typer.main.get_command(app).commands) - {"models"}  # models takes no argument
    assert names == {argv[0] for argv, _ in ARGUMENT_ERRORS}


@pytest.mark.parametrize("argv, message", ARGUMENT_ERRORS, ids=[a[0] + " " + a[-1] for a, _ in ARGUMENT_ERRORS])
def test_argument_errors_answer_in_one_line_under_2_s_without_heavy_imports(argv, message, tmp_path):
    """``fi ARGS`` as a process (the console script's entry point): exit 2, one line, under 2 s of wall time,
    and no heavy library imported by then (what keeps it fast on any machine: torch alone takes seconds)."""
    assert_answered_at_once(argv, message, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing written


def assert_answered_at_once(argv: list[str], message: str, cwd: Path) -> None:
    """``fi ARGS`` run in ``cwd`` as a process: exit 2, one line holding ``message``, under 2 s of wall time and
    no heavy library imported by its end (the structural reason it is fast: torch alone takes seconds)."""
    code = f"""
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps([m for m in {HEAVY!r} if m in sys.modules])))
        sys.argv = ["fi", *{argv!r}]
        from fi_toolkit.cli.entry import main
        main()
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=cwd, env=env
    )
    seconds = time.perf_counter() - t0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert seconds < 2, f"{seconds:.2f} s"


# Errors that used to wait for the model's weights (5-7 s): each is decided by the arguments, a document and the
# model's tokenizer.json, a directory's listing or the paths, so it is answered as the argument errors are.
WAITED_FOR_THE_MODEL = [
    (None, ["probe", "alice", "--chunk", "512:99999999"], "chunk 512:99999999 ends past the end of document 'alice'"),
    *[
        (
            a_checkpoint,
            [command, "doc.txt", "--model", "ckpt", *argv],
            f"{reads} ends past the end of document 'doc' (100 tokens)",
        )
        for command, argv, reads in [
            ("probe", ["--chunk", "128:160"], "chunk 128:160"),
            ("correlate", ["--chunk", "128:160"], "chunk 128:160"),
            ("nearfar", ["--prefix", "64", "--distances", "0,32", "--chunk-len", "32"], "the farthest chunk 96:128"),
            ("scores", ["--prefix", "160"], "--prefix 160"),
            ("fit-data", ["--chunk", "128:160", "--out", "fd"], "chunk 128:160"),
            (
                "field",
                ["--prefix", "96", "--distances", "0,32", "--chunk-len", "32", "--window", "16"],
                "the farthest chunk 128:160",
            ),
            ("view", ["--prefix", "128", "--budget", "keep=0.5", "--chunk", "128:160"], "chunk 128:160"),
            ("eval", ["--prompt", "64", "--length", "160", "--budget", "0.5"], "the replay's length 160 (--length)"),
            ("labels", ["--point", "64", "--far", "24:48", "--out", "l"], "--point 64's near chunk 64:192"),
        ]
    ],
    *[
        (a_run, [command, "alice", *argv, "--out", "run"], "'run' already holds results")
        for command, argv in [
            ("nearfar", []),
            ("correlate", ["--chunk", "128:160"]),
            ("field", []),
            ("eval", []),
            ("fit-data", ["--chunk", "128:160"]),
            ("labels", []),
        ]
    ],
    (a_run, ["report", "run", "--out", "run"], "--out 'run' is the result directory 'run'"),
    (a_run, ["report", "run", "--out", "run/r"], "--out 'run/r' lies inside the result directory 'run'"),
    (
        lambda t, run: (a_run(t, run), other_files("notes.txt")(t)),
        ["report", "run", "--out", "mine"],
        "--out 'mine' holds 1 entry that fi report did not write (notes.txt)",
    ),
    (a_model_dir(), ["probe", "alice", "--chunk", "128:160", "--model", "m"], "--model 'm' is an empty directory"),
    (
        None,
        ["probe", "alice", "--chunk", "128:160", "--out", "/proc/fi-no-such-dir/out"],
        "cannot be written: no directory can be created in '/proc': it exists, but its file system refuses new entries",
    ),
]


@pytest.mark.parametrize(
    "setup, argv, message", WAITED_FOR_THE_MODEL, ids=[" ".join(a[:1] + a[-2:]) for _, a, _ in WAITED_FOR_THE_MODEL]
)
def test_errors_that_waited_for_the_model_answer_in_one_line_under_2_s(setup, argv, message, finished_run, tmp_path):
    """A chunk past a document's end (in bytes, or in the tokens of the model's tokenizer.json), a report into its
    own run or among other files, a model directory without a model, an --out the system refuses: exit 2, one
    line, under 2 s, no heavy import, nothing written or changed."""
    if setup is not None:
        setup(*(tmp_path, finished_run)[: setup.__code__.co_argcount])
    before = snapshot(tmp_path)
    assert_answered_at_once(argv, message, tmp_path)
    assert snapshot(tmp_path) == before


@pytest.mark.smollm
def test_a_chunk_past_the_document_is_counted_with_the_embedded_tokenizer_before_it_loads(smollm, tmp_path):
    """The embedded model's tokenizer.json (its converted copy, there once the model has loaded) counts what its
    loaded tokenizer counts; a chunk 3 tokens past the end is refused by that count, before torch loads."""
    from fi_toolkit.documents import BUNDLED, read_texts
    from fi_toolkit.model.settings import ModelSettings

    count = ModelSettings().token_counter()
    assert count is not None
    for name in BUNDLED:
        ((_, text, _),) = read_texts(name)
        assert count(text) == len(smollm.tokenizer(text)["input_ids"]), name
    n = count(read_texts("alice")[0][1])
    message = f"chunk 512:{n + 3} ends past the end of document 'alice' ({n:,} tokens)"
    assert_answered_at_once(["probe", "alice", "--chunk", f"512:{n + 3}"], message, tmp_path)
    assert list(tmp_path.iterdir()) == []


class ModelLoaded(Exception):
    """Raised by the stand-in for load_model: a command got past its checks to the model."""


def _unwritable(kind, tmp):
    if kind == "proc":
        return "/proc/fi-no-such-dir/out"
    (tmp / "a-file").write_text("x")
    return str(tmp / "a-file" / "out")


UNWRITABLE_OUT = [
    ["probe", "alice", "--chunk", "128:160", "--out", "{out}"],
    ["correlate", "alice", "--chunk", "128:160", "--out", "{out}"],
    ["nearfar", "alice", "--out", "{out}"],
    ["eval", "alice", "--out", "{out}"],
    ["field", "alice", "--policy", "snapkv", "--out", "{out}"],
    ["scores", "alice", "--out", "{out}.csv"],
    ["fit-data", "alice", "--chunk", "128:160", "--out", "{out}"],
    ["fit", "{run}", "--out", "{out}.json"],
    ["view", "alice", "--out", "{out}.html"],
    ["report", "{run}", "--out", "{out}"],
    ["tasks", "export", "--task", "passkey", "--out", "{out}"],
    ["lm-eval", "--model", "fi", "--model_args", "policy=snapkv", "--tasks", "x", "--output_path", "{out}"],
]


@pytest.mark.parametrize("kind", ["proc", "under-a-file"])
@pytest.mark.parametrize(
    "argv", UNWRITABLE_OUT, ids=[a[0] if a[0] != "tasks" else "tasks-export" for a in UNWRITABLE_OUT]
)
def test_unwritable_out_is_one_line_before_the_model_loads(argv, kind, finished_run, tmp_path, monkeypatch, capsys):
    """--out in /proc (mkdir fails there even for root) or under a regular file: one line, exit 2, and the
    model loader never called (a stand-in raises if it is), so no forward runs."""

    def load_model(*args, **kwargs):
        raise ModelLoaded

    monkeypatch.setattr("fi_toolkit.model.loading.load_model", load_model)
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "fd"
    if argv[0] == "fit":
        fit_data_run(["a", "b"])(tmp_path)
    else:
        run = finished_run
    out = _unwritable(kind, tmp_path)
    args = [a.format(out=out, run=run) for a in argv]
    before = snapshot(tmp_path)
    code, _out, err = run_cli(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert ("cannot be written" in lines[0]) if kind == "proc" else ("a-file" in lines[0]), lines[0]
    assert snapshot(tmp_path) == before


# --- an interrupted overwrite leaves the old output whole or the new one whole ---


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("writer", ["_write_html", "_write_markdown", "atomic_copy"])
def test_ctrl_c_during_report_overwrite_leaves_the_old_report_whole(
    writer, finished_run, tmp_path, monkeypatch, capsys
):
    """A report, then ``fi report --overwrite`` interrupted while it writes (a writer raises KeyboardInterrupt):
    exit 130 and the report directory is the old one byte for byte (the user's own file included), no
    temporary directory left beside it. Without the interruption the new report replaces the old."""
    out = tmp_path / "report"
    code, _, err = run_cli(["report", str(finished_run), "--out", str(out), "--format", "html,md,csv"], capsys)
    assert code == 0, err
    for f in [p for p in out.rglob("*") if p.is_file()]:  # every old file differs from what the new run writes
        f.write_text(f"the old {f.name}\n")
    (out / "notes.txt").write_text("mine\n")
    old = _tree(out)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    target = "fi_toolkit.runs.results.atomic_copy" if writer == "atomic_copy" else f"fi_toolkit.report.export.{writer}"
    with monkeypatch.context() as m:
        m.setattr(target, interrupt)
        code, _, err = run_cli(
            ["report", str(finished_run), "--out", str(out), "--overwrite", "--format", "html,md,csv"], capsys
        )
    assert code == 130 and err.startswith("interrupted"), err
    assert _tree(out) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    code, _, err = run_cli(
        ["report", str(finished_run), "--out", str(out), "--overwrite", "--format", "html,md,csv"], capsys
    )
    assert code == 0, err
    new = _tree(out)
    assert new["notes.txt"] == b"mine\n"
    assert not any(data.startswith(b"the old ") for data in new.values() if data is not None)
    assert set(new) == set(old)  # the same report's files (a full rewrite), the user's file kept


def test_ctrl_c_between_the_renames_puts_the_old_output_back(tmp_path, monkeypatch):
    """staged_dir's swap: Ctrl-C after the old directory is renamed aside and before the new one is in place
    (the second rename) leaves the old directory whole under its name."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.csv").write_text("old\n")
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(results.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with results.staged_dir(out, replaced=results.result_entry) as stage:
            (stage / "a.csv").write_text("new\n")
    monkeypatch.undo()
    assert len(calls) == 3 and _tree(out) == {"a.csv": b"old\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_ctrl_c_during_fit_overwrite_keeps_the_old_policy_file(tmp_path, monkeypatch, capsys):
    """Another writing command: ``fi fit --overwrite`` interrupted while it writes the policy file (inside the
    atomic write, after its temporary file exists) keeps the old file whole and leaves no temporary file;
    uninterrupted, it replaces the file with a fitted policy."""
    monkeypatch.chdir(tmp_path)
    fit_data_run(["a", "b"])(tmp_path)
    (tmp_path / "p.json").write_text("the old policy\n")
    record = {  # the fit itself is test_fit's; here only how its record is written
        "features": ["attention"],
        "coefficients": [1.0],
        "rows": 8,
        "documents": ["a", "b"],
        "cross_validation": {"mean": {"spearman_fitted": 0.5, "spearman_snapkv": None, "spearman_infokv": None}},
    }
    monkeypatch.setattr("fi_toolkit.fit.ridge.fit_policy", lambda *args: record)
    args = ["fit", "fd", "--features", "attention", "--out", "p.json", "--overwrite"]

    def interrupt(path):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(results, "_umask_mode", interrupt)
        code, _, err = run_cli(args, capsys)
    assert code == 130, err
    assert (tmp_path / "p.json").read_text() == "the old policy\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fd", "p.json"]
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "p.json").read_text())["features"] == ["attention"]


def test_unknown_policy_in_fi_view_lists_no_oracle(capsys):
    """fi view cannot show an oracle: its unknown-policy message does not offer fi-oracle (fi eval's does)."""
    _, _, view = run_cli(["view", "alice", "--policy", "nosuch"], capsys)
    _, _, ev = run_cli(["eval", "alice", "--policy", "nosuch"], capsys)
    assert "unknown policy 'nosuch'" in view and "fi-oracle" not in view and "snapkv" in view
    assert "fi-oracle" in ev


def test_the_oracle_chunk_is_read_from_the_document():
    """policy:fi-oracle@B:chunk=160:200 reads the document to token 200, past the last --chunk (128:160)."""
    from fi_toolkit.probe.selections import parse_selections

    oracle, plain = parse_selections(["policy:fi-oracle@keep=0.5:chunk=160:200", "entropy:0.5"])
    assert oracle.reads_until() == 200 and plain.reads_until() is None


def test_nearfar_prints_whole_sink_counts(capsys):
    from fi_toolkit.cli.study import _print_nearfar

    summary = pd.DataFrame(
        {
            "sinks": [4.0, 4.0],
            "selector": ["entropy", "attention"],
            "distance_from_p": [0, 0],
            "fi_mean": [0.1, 0.2],
            "fi_share_near_mean": [1.0, 1.0],
        }
    )
    tests = pd.DataFrame(
        {
            "sinks": [4.0],
            "distance_from_p": [0],
            "metric": ["fi"],
            "a_wins": [1],
            "n_documents": [1],
            "wilcoxon_p": [float("nan")],
        }
    )
    _print_nearfar({"nearfar_summary": summary, "nearfar_tests": tests}, 1)
    out = capsys.readouterr().out
    assert "4.0" not in out and " 4 " in out.replace("\n", " ")


def test_nearfar_prints_what_the_report_shows(capsys):
    """The terminal's tests table reads as the report's: a missing statistic is n/a with its reason (never NaN),
    the columns carry the report's names (no a_wins), and a small FI keeps its digits (not 0.00000)."""
    import re

    from fi_toolkit.cli.study import _print_nearfar
    from fi_toolkit.report.display import NEEDS_DOCUMENTS, reader_name

    summary = pd.DataFrame(
        {
            "sinks": [4, 4],
            "selector": ["entropy", "attention"],
            "distance_from_p": [0, 0],
            "fi_mean": [3.2e-7, 0.2],
            "fi_share_near_mean": [1.0, float("nan")],
        }
    )
    tests = pd.DataFrame(
        {
            "sinks": [4, 4],
            "distance_from_p": [0, 256],
            "metric": ["fi", "fi"],
            "a_wins": [1, 2],
            "n_documents": [1, 3],
            "wilcoxon_p": [float("nan"), 0.125],
        }
    )
    _print_nearfar({"nearfar_summary": summary, "nearfar_tests": tests}, 3)
    out = capsys.readouterr().out
    assert "nan" not in out.lower() and "a_wins" not in out and "0.00000" not in out
    assert NEEDS_DOCUMENTS in out and reader_name("a_wins") in out and reader_name("wilcoxon_p") in out
    near = out.split("FI / nearest-chunk FI")[1].split("entropy > attention")[0]
    assert "3.2e-07" in out and "0.125" in out and re.search(r"attention +n/a", near)


def test_tasks_names_agree_with_the_export():
    """fi tasks export checks names against evaluation.settings (no torch); the export's own table agrees."""
    from fi_toolkit.evaluation.settings import DEFAULT_TASKS
    from fi_toolkit.evaluation.tasks import TASKS

    assert sorted(DEFAULT_TASKS) == sorted(TASKS)
