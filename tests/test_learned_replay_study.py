"""analyses/learned_replay.py's win table against a hand computation on a made-up ``fi eval`` replays table: the
best rival leaves out both learned variants and the oracle, and the gap share is (best - learned) / (best - oracle)."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analyses"))

import learned_replay  # noqa: E402


def test_wins_against_a_hand_computation():
    kl = {
        ("a", "keep=0.25"): {"learned:path=m.json": 0.30, "learned:path=l.json,heads=global": 0.10, "h2o": 0.20,
                             "kvpress:TOVAPress": 0.15, "fi-oracle:samples=16": 0.05, "full": 0.0},
        ("b", "keep=0.25"): {"learned:path=m.json": 0.12, "learned:path=l.json,heads=global": 0.40, "h2o": 0.25,
                             "kvpress:TOVAPress": 0.35, "fi-oracle:samples=16": 0.10, "full": 0.0},
    }  # fmt: skip
    rows = [
        {"document": d, "budget": b, "policy": p, "mean_kl": v} for (d, b), per in kl.items() for p, v in per.items()
    ]
    w = learned_replay.wins(pd.DataFrame(rows)).set_index(["document", "variant"])
    glob, head = w.loc[("a", "learned-global")], w.loc[("a", "learned-head")]
    assert glob["best_rival"] == "kvpress:TOVAPress" and glob["best_rival_kl"] == 0.15 and glob["beats_best"]
    assert glob["gap_share"] == pytest.approx((0.15 - 0.10) / (0.15 - 0.05))
    assert not head["beats_best"] and head["gap_share"] == pytest.approx((0.15 - 0.30) / (0.15 - 0.05))
    b = w.loc[("b", "learned-head")]
    assert b["best_rival"] == "h2o" and b["beats_best"] and b["beats_h2o"]
    assert b["gap_share"] == pytest.approx((0.25 - 0.12) / (0.25 - 0.10))
    assert not w.loc[("b", "learned-global")]["beats_h2o"]
