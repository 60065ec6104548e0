"""analyses/learned.py at CI size (``--tiny``: SmolLM2, p = 128, two bundled documents to train on, two unseen
corpus texts to test on). Oracles: the headroom and the win counts recomputed by hand from the probe's table
(pandas filters and the formula ``(FI_random - FI_policy) / (FI_random - FI_oracle)``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = next((c for c in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")) if c.is_dir()), None)

pytestmark = [pytest.mark.smollm]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    pytest.importorskip("lightgbm")
    if CORPUS is None:
        pytest.skip("no ../shared/corpus beside the project")
    root = tmp_path_factory.mktemp("learned_study")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "analyses" / "learned.py"), "--tiny", "--work", str(root / "w")]
    done = subprocess.run(
        [*cmd, "--results", str(root / "r"), "--corpus", str(CORPUS)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "r", done.stdout


def test_tiny_study_writes_its_tables_and_model(study):
    results, stdout = study
    assert {p.name for p in results.iterdir()} >= {"model.json", "fi.csv", "headroom.csv", "wins.csv", "importance.png"}
    record = json.loads((results / "model.json").read_text())
    assert [d["name"] for d in record["fitted_on"]["documents"]] == ["alice", "hamlet"]
    table = pd.read_csv(results / "fi.csv")
    assert set(table["document"]) == {"asyoulik", "plrabn12"}  # unseen: none of the training documents
    assert "learned beats H2O in" in stdout


def _mean_of_documents(table: pd.DataFrame, mask) -> float:
    return float(table[mask].groupby("document")["fi"].mean().mean())


def test_wins_and_headroom_match_the_probe_table(study):
    results, _ = study
    table = pd.read_csv(results / "fi.csv")
    wins = pd.read_csv(results / "wins.csv")
    assert len(wins) == 2 * 2  # documents x chunks at one budget
    for _, w in wins.iterrows():
        cell = table[(table["document"] == w["document"]) & (table["chunk"] == w["chunk"])]
        learned = cell[cell["selection"].str.contains("learned")]["fi"].mean()
        h2o = cell[cell["selection"].str.startswith("policy:h2o")]["fi"].mean()
        assert learned == pytest.approx(w["learned"], rel=1e-12) and h2o == pytest.approx(w["h2o"], rel=1e-12)
        assert bool(w["beats_h2o"]) == (learned < h2o)
    hr = pd.read_csv(results / "headroom.csv")
    for chunk in table["chunk"].unique():
        c = table[table["chunk"] == chunk]
        r = _mean_of_documents(c, c["selection"].str.startswith("random"))
        sel = c["selection"]
        o = _mean_of_documents(
            c, sel.str.contains("fi-oracle") & sel.str.contains(f"chunk={chunk}(?:,|$)") & ~sel.str.contains("seed=")
        )
        s = _mean_of_documents(c, c["selection"].str.contains("learned"))
        row = hr[(hr["chunk"] == chunk) & (hr["name"] == "learned")]
        assert len(row) == 1 and row["headroom"].iloc[0] == pytest.approx((r - s) / (r - o), rel=1e-9)
