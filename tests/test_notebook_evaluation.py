"""Executes notebooks/03_evaluation.ipynb (fi eval walk-through) on a small setting; any failing cell fails the test."""

from __future__ import annotations

import pytest
from notebook_runner import execute

SMALL = {
    "FI_NB_PROMPT": "256",
    "FI_NB_LENGTH": "384",
    "FI_NB_INTERVAL": "64",
    "FI_NB_GENERATED": "64",
    "FI_NB_CONTEXT": "512",
    "FI_NB_SAMPLES": "2",
    "FI_NB_THREADS": "1",
}


@pytest.mark.smollm
@pytest.mark.notebook
def test_evaluation_notebook_runs(tmp_path, monkeypatch):
    outputs, _ = execute("03_evaluation.ipynb", tmp_path, monkeypatch, SMALL)
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    tables = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert len(images) >= 1 and "infokv" in tables and "question-agnostic" in tables and "generated:64" in tables
