"""Executes notebooks/01_forward_influence.ipynb on a small setting; any failing cell fails the test."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_forward_influence.ipynb"
SMALL = {"FI_NB_PREFIX": "256", "FI_NB_CHUNK_LEN": "32", "FI_NB_DISTANCES": "0,32,64", "FI_NB_CANDIDATES": "sample:12",
         "FI_NB_THREADS": "1"}  # one thread: oversubscribed threads are ~10x slower when the CPU is shared


@pytest.mark.smollm
def test_forward_influence_notebook_runs(tmp_path, monkeypatch):
    for key, value in SMALL.items():  # the kernel inherits the environment
        monkeypatch.setenv(key, value)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    seconds = time.perf_counter() - t0
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "p = 256" in printed and "token classes" in printed
    shown = "".join(str(o.get("data", {}).get("text/html", "")) for o in outputs if o.output_type in ("display_data", "execute_result"))
    assert "background: rgba(" in shown  # the coloured-text view rendered
    print(f"notebook executed in {seconds:.0f} s")
