"""Resumable studies: a run stopped after k of n documents and resumed equals an uninterrupted run,
recomputes nothing finished, and refuses different settings."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from fi_toolkit import Document, SignalConfig
from fi_toolkit.analysis import read_table, run_correlate, run_nearfar, study
from fi_toolkit.errors import FIError
from fi_toolkit.probe import Chunk

CFG = SignalConfig(window=8)
P = 96


@pytest.fixture(scope="module")
def docs():
    gen = torch.Generator().manual_seed(7)
    return [Document(f"doc {i}", f"text {i}", torch.randint(0, 256, (200,), generator=gen), "test") for i in range(3)]


def _nearfar(tiny, docs, out, **kw):
    return run_nearfar(tiny, docs, out, P, [0, 32], 16, ratio=0.1, seeds=2, config=CFG, **kw)


class Counter:
    """Wraps a per-document function: counts calls, raises KeyboardInterrupt on call ``stop_at``."""

    def __init__(self, fn, stop_at=None):
        self.fn, self.stop_at, self.calls = fn, stop_at, []

    def __call__(self, model, doc, *args, **kwargs):
        self.calls.append(doc.name)
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        return self.fn(model, doc, *args, **kwargs)


TABLES = ["nearfar", "token_classes", "nearfar_summary", "nearfar_tests", "token_class_summary"]


def test_interrupted_nearfar_resumes_to_identical_tables(tiny, docs, tmp_path, monkeypatch):
    full = tmp_path / "full"
    _nearfar(tiny, docs, full)

    stopped = tmp_path / "stopped"
    first = Counter(study.nearfar_document, stop_at=3)  # dies while computing the third document
    monkeypatch.setattr(study, "nearfar_document", first)
    with pytest.raises(KeyboardInterrupt):
        _nearfar(tiny, docs, stopped)
    assert first.calls == ["doc 0", "doc 1", "doc 2"]
    finished = sorted(p.parent.name for p in (stopped / "per_document").glob("*/done.json"))
    assert finished == ["doc_0", "doc_1"]
    assert len(read_table(stopped / "per_document" / "doc_0" / "nearfar.csv")) > 0  # intact and readable
    assert not (stopped / "manifest.json").exists()

    second = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", second)
    _nearfar(tiny, docs, stopped, resume=True)
    assert second.calls == ["doc 2"]  # nothing finished is recomputed
    for name in TABLES:
        assert (stopped / f"{name}.csv").read_bytes() == (full / f"{name}.csv").read_bytes(), name
        pd.testing.assert_frame_equal(read_table(stopped / f"{name}.csv"), read_table(full / f"{name}.csv"))
    manifest = json.loads((stopped / "manifest.json").read_text())
    assert manifest["computed_this_session"] == ["doc 2"]

    third = Counter(study.nearfar_document)
    monkeypatch.setattr(study, "nearfar_document", third)
    _nearfar(tiny, docs, stopped, resume=True)  # everything finished: nothing recomputed
    assert third.calls == []


def test_resume_with_different_settings_is_refused(tiny, docs, tmp_path):
    out = tmp_path / "corr"
    chunks = [Chunk(P, P + 16)]
    run_correlate(tiny, docs[:1], out, P, chunks, "sample:4", n_resamples=20, config=CFG)
    with pytest.raises(FIError, match="different settings.*candidates"):
        run_correlate(tiny, docs[:1], out, P, chunks, "sample:5", n_resamples=20, config=CFG, resume=True)
    with pytest.raises(FIError, match="already holds a run"):
        run_correlate(tiny, docs[:1], out, P, chunks, "sample:4", n_resamples=20, config=CFG)
    with pytest.raises(FIError, match="not 'correlate'|'correlate' run"):
        _nearfar(tiny, docs[:1], out, resume=True)
    before = (out / "correlations.csv").read_bytes()
    run_correlate(tiny, docs[:1], out, P, chunks, "sample:4", n_resamples=20, config=CFG, resume=True)
    assert (out / "correlations.csv").read_bytes() == before
    run_correlate(tiny, docs[:1], out, P, chunks, "sample:5", n_resamples=20, config=CFG, overwrite=True)
    assert read_table(out / "tokens.csv")["position"].nunique() == 5


def test_cli_refuses_different_settings_in_one_line(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    out.mkdir()
    (out / "settings.json").write_text(json.dumps({"command": "nearfar", "settings": {"prefix": 1}}))
    proc = subprocess.run([sys.executable, "-m", "fi_toolkit.cli", "correlate", "alice", "--chunk", "64:96",
                           "--prefix", "64", "--candidates", "sample:2", "--out", str(out), "--resume"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot resume"), proc.stderr
