"""Executes notebooks/05_fitted_policy.ipynb (fit, apply, compare); any failing cell fails the test."""

from __future__ import annotations

import json

import pytest
from notebook_runner import execute


@pytest.mark.smollm
@pytest.mark.notebook
def test_fitted_policy_notebook_runs(tmp_path):
    _, printed = execute("05_fitted_policy.ipynb", tmp_path)
    assert (
        "--- policy:fitted@keep=0.25:path=policy.json: FI" in printed and "--- policy:infokv@keep=0.25: FI" in printed
    )
    record = json.loads((tmp_path / "policy.json").read_text())
    assert [f["held_out"] for f in record["cross_validation"]["folds"]] == ["alice", "hamlet", "botchan"]
