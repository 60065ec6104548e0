"""Executes notebooks/01_forward_influence.ipynb on a small setting; any failing cell fails the test."""

from __future__ import annotations

import pytest
from notebook_runner import execute

SMALL = {
    "FI_NB_PREFIX": "256",
    "FI_NB_CHUNK_LEN": "32",
    "FI_NB_DISTANCES": "0,32,64",
    "FI_NB_CANDIDATES": "sample:12",
    "FI_NB_THREADS": "1",
}  # one thread: oversubscribed threads are ~10x slower when the CPU is shared


@pytest.mark.smollm
@pytest.mark.notebook
def test_forward_influence_notebook_runs(tmp_path, monkeypatch):
    outputs, printed = execute("01_forward_influence.ipynb", tmp_path, monkeypatch, SMALL)
    assert "p = 256" in printed and "token classes" in printed
    shown = "".join(
        str(o.get("data", {}).get("text/html", ""))
        for o in outputs
        if o.output_type in ("display_data", "execute_result")
    )
    assert "background: rgba(" in shown  # the coloured-text view rendered
