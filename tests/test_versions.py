"""The supported versions: requirements-min.txt pins pyproject.toml's lower bounds, and ``fi probe``
gives the same FI under the lowest supported versions and the latest.

The FI check runs only when ``FI_OTHER_PYTHON`` names the other environment's interpreter
(``make test-min`` sets it to ``.venv/bin/python`` while pytest runs in ``.venv-min``); skipped
otherwise. Both runs use the real embedded model on the bundled document, this checkout's code
(``PYTHONPATH``), a 256-token prefix and one 32-token chunk, with a score-based (InfoKV: entropy and
attention signals), a random and a policy selection (PyramidKV: its uneven per-layer budgets take
the ragged-attention path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
OTHER = os.environ.get("FI_OTHER_PYTHON")
TOLERANCE = 1e-6
ARGS = [
    "probe",
    "alice",
    "--chunk",
    "256:288",
    "-s",
    "infokv:remove=0.1",
    "-s",
    "random:remove=0.1@0",
    "-s",
    "policy:pyramidkv@keep=0.5",
]


def test_min_pins_are_the_lower_bounds():
    """Each pin in requirements-min.txt equals a lower bound in pyproject.toml; every dependency has one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lower = {}
    for spec in project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]:
        req = Requirement(spec)
        lower[req.name] = next(Version(s.version) for s in req.specifier if s.operator == ">=")
    lines = (ROOT / "requirements-min.txt").read_text().splitlines()
    pins = {
        req.name: Version(next(iter(req.specifier)).version)
        for req in (Requirement(line) for line in lines if line.strip() and not line.startswith("#"))
    }
    assert {name: lower.get(name) for name in pins} == pins
    assert {Requirement(spec).name for spec in project["dependencies"]} <= set(pins)


def _probe(python: str, out: Path) -> tuple[pd.DataFrame, dict]:
    """``fi probe ARGS --out OUT`` under ``python`` -> (its fi.csv, the versions its manifest records)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's fi_toolkit in both environments
    run = subprocess.run(
        [python, "-m", "fi_toolkit.cli.app", *ARGS, "--out", str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{python}: exit {run.returncode}\n{run.stderr[-2000:]}"
    return pd.read_csv(out / "fi.csv"), json.loads((out / "manifest.json").read_text())["versions"]


@pytest.mark.skipif(not OTHER, reason="FI_OTHER_PYTHON (another environment's python) is not set")
def test_fi_probe_agrees_across_environments(tmp_path):
    this, this_versions = _probe(sys.executable, tmp_path / "this")
    other, other_versions = _probe(OTHER, tmp_path / "other")
    print(f"transformers {this_versions['transformers']} vs {other_versions['transformers']}")
    assert this_versions["transformers"] != other_versions["transformers"], (
        "both environments run the same transformers"
    )
    assert len(this) == 2 + 3 and list(this.columns) == list(other.columns)  # the noise controls, then the sets
    keys = ["document", "selection", "chunk", "n_removed", "n_kept"]
    assert this[keys].equals(other[keys])
    measured = this["selector"] != "control"
    assert (this[measured]["fi"] > 1e-3).all()  # real influence, not a vacuous match of zeros
    assert (this[~measured]["fi"].abs() < 1e-8).all() and (other[~measured]["fi"].abs() < 1e-8).all()
    numeric = this.select_dtypes("number").columns
    assert this[numeric].isna().equals(other[numeric].isna())
    gap = (this[numeric] - other[numeric]).abs().max()
    too_far = gap[gap > TOLERANCE]
    assert too_far.empty, f"largest differences:\n{too_far}"
