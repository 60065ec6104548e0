"""analyses/learned_heads.py at CI size (``--tiny``: SmolLM2, p = 128, two bundled documents to train on, two
unseen corpus texts to test on). Oracles: the win counts recomputed by hand from the probe's table (pandas filters),
the removed counts of every selection at a budget equal (the budget means the same with ``heads=global``), and the
allocation's per-layer sums equal to three times the uniform count."""

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
HEURISTICS = ("policy:h2o", "policy:snapkv", "policy:infokv", "policy:expected_attention", "policy:tova")
PREVIOUS = HEURISTICS[:3]  # the rivals before ExpectedAttention and TOVA joined
P = 128  # the tiny study's compression point


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    pytest.importorskip("lightgbm")
    if CORPUS is None:
        pytest.skip("no ../shared/corpus beside the project")
    root = tmp_path_factory.mktemp("learned_heads_study")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "analyses" / "learned_heads.py"), "--tiny", "--work", str(root / "w")]
    done = subprocess.run(
        [*cmd, "--results", str(root / "r"), "--corpus", str(CORPUS)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "r", done.stdout


def test_tiny_study_writes_a_per_layer_model_and_its_tables(study):
    results, stdout = study
    assert {p.name for p in results.iterdir()} >= {"model.json", "fi.csv", "headroom.csv", "wins.csv", "allocation.csv"}
    record = json.loads((results / "model.json").read_text())
    assert record["group"] == "layer" and "layer_spearman_learned" in record["cross_validation"]["mean"]
    assert "learned-global: beats H2O in" in stdout


def test_every_selection_of_a_budget_removes_as_many(study):
    results, _ = study
    table = pd.read_csv(results / "fi.csv")
    measured = table[~table["selector"].str.startswith("control")]
    removed = measured.groupby("budget")["n_removed"].agg(["min", "max"])
    assert (removed["min"] == removed["max"]).all(), removed
    assert measured["selection"].str.contains("heads=global").any()


def test_wins_match_the_probe_table(study):
    results, _ = study
    table, wins = pd.read_csv(results / "fi.csv"), pd.read_csv(results / "wins.csv")
    for _, row in wins.iterrows():
        cell = table[(table["document"] == row["document"]) & (table["chunk"] == row["chunk"])]
        cell = cell[cell["n_removed"].round(3) == row["n_removed"]]
        fi = {s: cell.loc[cell["selection"] == s, "fi"].mean() for s in cell["selection"].unique()}
        glob = next(v for s, v in fi.items() if "learned" in s and "heads=global" in s)
        heuristics = {s.split("@")[0]: v for s, v in fi.items() if s.split("@")[0] in HEURISTICS and "global" not in s}
        assert len(heuristics) == 5
        best = min(heuristics.values())
        assert row["learned-global"] == pytest.approx(glob) and row["best_heuristic_fi"] == pytest.approx(best)
        assert row["learned-global_beats_best"] == (glob < best)
        assert row["learned-global_beats_best3"] == (glob < min(heuristics[h] for h in PREVIOUS))


def test_allocation_keeps_the_uniform_total_per_layer(study):
    results, _ = study
    alloc = pd.read_csv(results / "allocation.csv")
    sums = alloc.groupby(["document", "budget", "layer"])["kept"].sum().reset_index()
    assert (sums["kept"] == 3 * (P * sums["budget"]).round()).all()  # the uniform policy's 3k per layer
    assert (alloc["kept"] >= 32).all() and alloc["kept"].nunique() > 1  # every head its window at least; uneven
