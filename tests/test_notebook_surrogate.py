"""Executes notebooks/07_surrogate.ipynb (the committed FI-trained surrogate, a probe of a bundled document it never
saw) afresh; any failing cell fails the test. Oracles that share no code with the notebook: the model's description
read from its files here (``config.json``, ``training.json``, the weight norms from ``model.safetensors`` with
safetensors' numpy reader), the probe's FI against the study's committed table for the same document, chunk and
budget (``analyses/results/surrogate/probe-keep0.25/fi.csv``, made by ``fi probe`` on the command line), the headroom
recomputed with pandas from the notebook's table; the committed outputs must agree with the fresh run."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from notebook_runner import NOTEBOOKS, committed_text, execute
from safetensors.numpy import load_file

NAME = "07_surrogate.ipynb"
ROOT = NOTEBOOKS.parent
MODEL = ROOT / "analyses" / "results" / "surrogate" / "model"
STUDY = ROOT / "analyses" / "results" / "surrogate" / "probe-keep0.25" / "fi.csv"
POLICIES = ["surrogate:heads=global", "surrogate", "expected_attention", "h2o", "snapkv"]
_ROW = re.compile(r"^(surrogate:heads=global|surrogate|expected_attention|h2o|snapkv)\s+(-?[\d.]+)\s+(-?[\d.]+)$")


def printed_rows(text: str) -> dict[str, tuple[float, float]]:
    return {
        m.group(1): (float(m.group(2)), float(m.group(3)))
        for line in text.splitlines()
        if (m := _ROW.match(line.strip()))
    }


@pytest.mark.smollm
@pytest.mark.notebook
def test_surrogate_notebook_runs(tmp_path):
    outputs, printed = execute(NAME, tmp_path)

    # the model as its files say
    config = json.loads((MODEL / "config.json").read_text())
    about = config["fi_toolkit"]
    assert f"{config['n_modules']} layers x ({config['input_dim']} -> {config['output_dim']} scores)" in printed
    assert f"{about['units']} units, {about['labels']:,} labels" in printed
    weights = load_file(str(MODEL / "model.safetensors"))
    norms = {
        (layer, h): float(np.linalg.norm(weights[f"layers.{layer}.weight"][h])) for layer in range(30) for h in range(3)
    }
    (layer, head), norm = max(norms.items(), key=lambda kv: kv[1])
    assert f"largest weight row: layer {layer}, KV head {head} (norm {norm:.4f})" in printed

    # the trace's scores are the model's own scoring of each position's attention input
    gap = float(re.search(r"trace's scores and the model's own scoring: ([\d.e+-]+)", printed).group(1))
    assert gap < 1e-4

    # the probe's FI: the study's table, made on the command line, for the same cells
    fi = pd.read_csv(tmp_path / "surrogate_fi.csv")
    real = fi[fi["selector"] != "control"]
    assert set(real["document"]) == {"alice"} and set(real["chunk"]) == {"512:640"}
    assert set(real["n_removed"]) == {384}  # keep 25 % of p = 512 per layer and KV head
    study = pd.read_csv(STUDY)
    study = study[(study["document"] == "alice") & (study["chunk"] == "512:640")].set_index("selection")["fi"]
    for _, row in real.iterrows():
        rel = 0.03 if "fi-oracle" in row["selection"] else 1e-4  # the oracle's Fisher draws: float noise
        assert row["fi"] == pytest.approx(study[row["selection"]], rel=rel), row["selection"]
    assert f"{len(real)} of {len(real)} rows found in the study's table" in printed

    # headroom = (FI_random - FI_policy) / (FI_random - FI_oracle), by hand
    rand = real[real["selector"] == "random"]["fi"].mean()
    oracle = real.loc[real["selection"] == "policy:fi-oracle@keep=0.25", "fi"].iloc[0]
    hr = pd.read_csv(tmp_path / "surrogate_headroom.csv").set_index("policy")
    fresh = printed_rows(printed)
    assert set(hr.index) == set(fresh) == set(POLICIES)
    for policy in POLICIES:
        spec = f"policy:{policy.split(':')[0]}@keep=0.25" + (":heads=global" if ":" in policy else "")
        value = real.loc[real["selection"] == spec, "fi"].iloc[0]
        assert hr.loc[policy, "headroom"] == pytest.approx((rand - value) / (rand - oracle), rel=1e-9)
        assert fresh[policy][1] == pytest.approx(hr.loc[policy, "headroom"], abs=6e-5)

    committed = printed_rows(committed_text(NAME))  # the committed run is this run, up to a CPU's rounding
    assert set(committed) == set(fresh)
    for policy, (value, headroom) in fresh.items():
        assert committed[policy][0] == pytest.approx(value, rel=0.02), policy
        assert committed[policy][1] == pytest.approx(headroom, abs=0.03), policy
