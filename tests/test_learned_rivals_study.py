"""analyses/learned_rivals.py at CI size (``--tiny``: the tiny ``learned_heads.py`` run, then two presses probed in
the kvpress venv on its two unseen texts; skipped without kvpress). Oracles: the win counts and the gap share
recomputed by hand from the joined probe tables (pandas filters), and the presses' removed counts equal to the
in-house policies' at the same budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = next((c for c in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")) if c.is_dir()), None)

pytestmark = [pytest.mark.smollm, pytest.mark.kvpress]
PRESSES = ("kvpress:ExpectedAttentionPress", "kvpress:KnormPress")  # learned_rivals.TINY_PRESSES
PROJECT = ("policy:h2o", "policy:snapkv", "policy:infokv", "policy:expected_attention", "policy:tova")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    pytest.importorskip("lightgbm")
    pytest.importorskip("kvpress")
    if CORPUS is None:
        pytest.skip("no ../shared/corpus beside the project")
    root = tmp_path_factory.mktemp("learned_rivals_study")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    tiny = ["--tiny", "--corpus", str(CORPUS)]
    heads = [sys.executable, str(ROOT / "analyses" / "learned_heads.py"), *tiny, "--work", str(root / "hw")]
    done = subprocess.run([*heads, "--results", str(root / "h")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rivals = [sys.executable, str(ROOT / "analyses" / "learned_rivals.py"), *tiny, "--work", str(root / "rw")]
    rivals += ["--heads-results", str(root / "h"), "--kvpress-python", sys.executable, "--results", str(root / "r")]
    done = subprocess.run(rivals, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "h", root / "r", done.stdout


def test_tiny_study_writes_its_tables(study):
    _, results, stdout = study
    assert {p.name for p in results.iterdir()} >= {"fi.csv", "headroom.csv", "wins.csv", "rivals.csv", "gap.csv"}
    assert set(pd.read_csv(results / "fi.csv")["selector"]) == set(PRESSES)
    assert "largest relative difference" in stdout and "learned-global: lower FI than" in stdout


def test_presses_remove_as_many_as_the_policies(study):
    heads, results, _ = study
    presses, policies = pd.read_csv(results / "fi.csv"), pd.read_csv(heads / "fi.csv")
    policies = policies[policies["selector"].isin(PROJECT)]
    assert set(presses["n_removed"]) == set(policies["n_removed"]) and presses["n_removed"].nunique() == 1


def test_wins_and_gap_match_the_probe_tables(study):
    heads, results, _ = study
    table = pd.concat([pd.read_csv(heads / "fi.csv"), pd.read_csv(results / "fi.csv")], ignore_index=True)
    wins, gap = pd.read_csv(results / "wins.csv"), pd.read_csv(results / "gap.csv")
    means = {}
    for _, row in wins.iterrows():
        cell = table[(table["document"] == row["document"]) & (table["chunk"] == row["chunk"])]
        fi = {s: cell.loc[cell["selection"] == s, "fi"].mean() for s in cell["selection"].unique()}
        glob = next(v for s, v in fi.items() if "learned" in s and "heads=global" in s)
        project = {s.split("@")[0]: v for s, v in fi.items() if s.split("@")[0] in PROJECT and "global" not in s}
        presses = {s.split("@")[0]: v for s, v in fi.items() if s.split("@")[0] in PRESSES and "window" not in s}
        assert len(project) == 5 and len(presses) == 2
        for press, value in presses.items():
            assert row[press] == pytest.approx(value)
            assert row[f"learned-global_beats_{press}"] == (glob < value)
        assert row["learned-global_beats_best_press"] == (glob < min(presses.values()))
        assert row["learned-global_beats_best_all"] == (glob < min([*presses.values(), *project.values()]))
        for name, value in {"learned-global": glob, **project, **presses}.items():
            means.setdefault((row["chunk"], name), []).append(value)
    for _, row in gap.iterrows():
        rival = {n: sum(v) / len(v) for (c, n), v in means.items() if c == row["chunk"] and n != "learned-global"}
        best = min(rival.values())
        learned = sum(means[row["chunk"], "learned-global"]) / len(means[row["chunk"], "learned-global"])
        oracle = table[
            (table["chunk"] == row["chunk"])
            & table["selection"].str.contains(f"chunk={row['chunk']}")
            & ~table["selection"].str.contains("seed=")  # the reference is the oracle at label seed 0
        ]
        expected = (best - learned) / (best - oracle["fi"].mean())
        assert row["learned-global_gap_all"] == pytest.approx(expected)
