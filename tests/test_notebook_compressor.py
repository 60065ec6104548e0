"""Executes notebooks/02_compressor.ipynb (the compressor walk-through); any failing cell fails the test."""

from __future__ import annotations

import pytest
from notebook_runner import execute


@pytest.mark.smollm
@pytest.mark.notebook
def test_compressor_notebook_runs(tmp_path):
    _, printed = execute("02_compressor.ipynb", tmp_path)
    assert "--- infokv@keep=0.2" in printed and "--- full cache" in printed
