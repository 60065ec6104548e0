"""Executes notebooks/06_learned_policy.ipynb (the committed learned model, a probe of two unseen texts) afresh;
any failing cell fails the test. Oracles that share no code with the notebook: the feature importances summed by
hand from the trees of ``model_dump`` (each split's ``split_gain`` by its ``split_feature``), the headroom
recomputed with pandas from the probe's table, and the study's own table (``analyses/results/learned/fi.csv``, made
by ``fi probe`` on the command line) for the same texts, chunk and budget; the committed outputs must agree with
the fresh run. Without the unseen texts (no ``../shared/corpus``) the notebook says it skipped the probe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from notebook_runner import NOTEBOOKS, committed_text, execute

NAME = "06_learned_policy.ipynb"
ROOT = NOTEBOOKS.parent
MODEL = ROOT / "analyses" / "results" / "learned" / "model.json"
CORPUS = next((c for c in (ROOT.parent / "shared" / "corpus", Path("/work/shared/corpus")) if c.is_dir()), None)
TEXTS = ["asyoulik.txt", "plrabn12.txt"]  # the study's first two unseen texts (analyses/learned.py UNSEEN)
POLICIES = ["learned", "h2o", "snapkv", "infokv"]
_SHARE = re.compile(r"^(\w+)\s.*\s(\d\.\d{4})$")
_HEADROOM = re.compile(r"^(learned|h2o|snapkv|infokv)((?:\s+(?:-?[\d.]+(?:e-?\d+)?|NaN)){6})$")  # no CI: NaN


def gain_from_trees(record: dict) -> pd.Series:
    """Total split gain per feature name, walked by hand over every tree of LightGBM's ``dump_model()``."""
    names = record["model_dump"]["feature_names"]
    total = dict.fromkeys(names, 0.0)
    stack = [t["tree_structure"] for t in record["model_dump"]["tree_info"]]
    while stack:
        node = stack.pop()
        if "split_feature" in node:
            total[names[node["split_feature"]]] += node["split_gain"]
            stack += [node["left_child"], node["right_child"]]
    return pd.Series(total)


def printed_rows(text: str, pattern: re.Pattern) -> dict[str, list[float]]:
    rows = {}
    for line in text.splitlines():
        m = pattern.match(line.strip())
        if m:
            rows[m.group(1)] = [float(v) for v in m.group(2).split()]
    return rows


@pytest.mark.smollm
@pytest.mark.notebook
def test_learned_notebook_runs(tmp_path):
    _, printed = execute(NAME, tmp_path)

    # the importances it prints are the trees' split gains, shared out
    record = json.loads(MODEL.read_text())
    share = gain_from_trees(record)
    share = share / share.sum()
    lines = [m for line in printed.splitlines() if (m := _SHARE.match(line.strip()))]
    shown = {m.group(1): float(m.group(2)) for m in lines if m.group(1) in share.index}
    assert set(shown) == set(record["features"]) and len(shown) == 18
    for name, value in shown.items():
        assert value == pytest.approx(share[name], abs=6e-5), name

    if CORPUS is None or not all((CORPUS / t).is_file() for t in TEXTS):
        assert "SKIPPED: the unseen texts" in printed
        return
    fi = pd.read_csv(tmp_path / "learned_fi.csv")
    fi = fi[fi["selector"] != "control"]
    assert sorted(fi["document"].unique()) == ["asyoulik", "plrabn12"] and set(fi["chunk"]) == {"256:384"}
    assert set(fi["n_removed"]) == {192}  # keep 25 % of p = 256 per layer and KV head
    by = fi.set_index(["document", "selection"])["fi"]

    # the same cells of the study's committed table, made by fi probe on the command line
    study = pd.read_csv(ROOT / "analyses" / "results" / "learned" / "fi.csv")
    study = study[(study["chunk"] == "256:384") & (study["n_removed"] == 192)].set_index(["document", "selection"])
    same = {f"policy:{p}@keep=0.25": f"policy:{p}@keep=0.25" for p in POLICIES[1:]}
    same["policy:learned@keep=0.25"] = "policy:learned@keep=0.25:path=analyses/results/learned/model.json"
    same["policy:fi-oracle@keep=0.25"] = "policy:fi-oracle@keep=0.25:chunk=256:384"
    same |= {f"random:keep=0.25@{s}": f"random:keep=0.25@{s}" for s in range(3)}
    for doc in ["asyoulik", "plrabn12"]:
        for mine, theirs in same.items():
            # the study's table holds the float32 oracle of its time (precision=model): the float64 oracle, what a
            # CPU computes now, differed by 1.3 % here; every other set is the same computation
            rel = 0.03 if "fi-oracle" in mine else 1e-3
            assert by[doc, mine] == pytest.approx(study.loc[(doc, theirs), "fi"], rel=rel), (doc, mine)
        oracle = by[doc, "policy:fi-oracle@keep=0.25"]
        assert all(oracle <= by[doc, f"policy:{p}@keep=0.25"] for p in POLICIES)  # it saw the chunk

    # headroom = (FI_random - FI_policy) / (FI_random - FI_oracle), means over the texts (random: seeds first)
    rand = fi[fi["selector"] == "random"].groupby("document")["fi"].mean().mean()
    mean = fi.groupby("selection")["fi"].mean()
    oracle = mean["policy:fi-oracle@keep=0.25"]
    hr = pd.read_csv(tmp_path / "learned_headroom.csv").set_index("policy")
    fresh = printed_rows(printed, _HEADROOM)
    assert set(hr.index) == set(fresh) == set(POLICIES)
    for p in POLICIES:
        expected = (rand - mean[f"policy:{p}@keep=0.25"]) / (rand - oracle)
        assert hr.loc[p, "headroom"] == pytest.approx(expected, rel=1e-9)
        assert fresh[p][3] == pytest.approx(expected, abs=6e-4)
    best = min(POLICIES[1:], key=lambda p: mean[f"policy:{p}@keep=0.25"])
    closed = (mean[f"policy:{best}@keep=0.25"] - mean["policy:learned@keep=0.25"]) / (
        mean[f"policy:{best}@keep=0.25"] - oracle
    )
    assert f"best heuristic here: {best}; share of its gap to the oracle the learned policy closes: {closed:.2f}" in (
        printed
    )
    assert "16 of 16 rows found in the study's table" in printed

    committed = printed_rows(committed_text(NAME), _HEADROOM)  # the committed run is this run, up to a CPU's rounding
    assert set(committed) == set(fresh)
    for p, (r, s, o, h, _, _) in fresh.items():
        cr, cs, co, ch, _, _ = committed[p]
        assert (cr, cs, co) == pytest.approx((r, s, o), rel=0.02), p
        assert ch == pytest.approx(h, abs=0.03), p
