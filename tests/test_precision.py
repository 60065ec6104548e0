"""Reduced precision: weights stored in bf16/fp16, arithmetic upcast to float32 (fi_toolkit.model.precision),
and the noise controls that report each path's rounding floor (docs/method.md, "Noise floor")."""

import json

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch
from cases import single_tokens
from cli_runner import run_cli

from fi_toolkit.documents import Document
from fi_toolkit.eviction import TokenSet
from fi_toolkit.model.loading import tiny_model
from fi_toolkit.model.precision import compute_dtype, upcast_compute
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import fi_table
from fi_toolkit.probe.forward_influence import ProbeResult, forward_influence
from fi_toolkit.probe.noise_floor import noise_controls, noise_floor
from fi_toolkit.report.noise import noise_warning
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

P = 192
CHUNKS = [Chunk(P, P + 48), Chunk(P + 96, P + 160)]
CFG = SignalConfig(window=16)


def _bf16(upcast: bool):
    lm = tiny_model(seed=0)
    lm.model.to(torch.bfloat16)
    return upcast_compute(lm.model) if upcast else lm.model


def test_upcast_computes_the_float32_model_of_the_rounded_weights(tiny_ids):
    model = _bf16(upcast=True)
    oracle = tiny_model(seed=0).model.to(torch.bfloat16).to(torch.float32)  # the rounded weights, as float32
    assert compute_dtype(model) == torch.float32 and compute_dtype(oracle) == torch.float32
    with torch.no_grad():
        got = model(input_ids=tiny_ids[None, :64]).logits
        want = oracle(input_ids=tiny_ids[None, :64]).logits
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # storage stays bfloat16
    with pytest.raises(IndexError):
        model(input_ids=torch.tensor([[10_000]]))  # out of the vocabulary: the embedding raises
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # ...and the weights are put back


def test_upcast_is_a_no_op_for_float32_and_idempotent():
    lm = tiny_model(seed=0)
    assert upcast_compute(lm.model) is lm.model and compute_dtype(lm.model) == torch.float32
    assert not any(m._forward_pre_hooks for m in lm.model.modules())
    model = _bf16(upcast=True)
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    upcast_compute(model)
    assert sum(len(m._forward_pre_hooks) for m in model.modules()) == hooks


def test_controls_are_exactly_zero_and_rounding_small_in_float32(tiny, tiny_ids):
    trace = trace_prefix(tiny.model, tiny_ids, P, CFG)
    for batch in (1, 3):
        result = forward_influence(
            tiny.model, trace, tiny_ids, single_tokens(4), CHUNKS, batch_size=batch, controls=True
        )
        fi = result.fi()
        assert [e.label for e in result.evictions[:2]] == ["control:null", "control:reorder"]
        assert (fi[0] == 0).all()  # nothing removed, same path as the reference: no rounding difference at all
        assert (fi[1].abs() < 1e-8).all() and (fi[1] != 0).any()  # another summation order: rounding only
        torch.testing.assert_close(result.noise_floor(), fi[:2].abs().max(dim=0).values)
        assert not result.below_noise_floor()[2:].any()


def test_bfloat16_arithmetic_floor_is_reported_and_upcast_lowers_it(tiny_ids):
    """In bfloat16 arithmetic the reorder control is far from 0; upcast to float32, the floor drops by
    orders of magnitude. Both are measured and reported, never skipped."""
    floors = {}
    for upcast in (False, True):
        model = _bf16(upcast)
        trace = trace_prefix(model, tiny_ids, P, CFG)
        result = forward_influence(model, trace, tiny_ids, single_tokens(8), CHUNKS, controls=True)
        floors[upcast] = result.noise_floor()
        assert torch.isfinite(result.fi()).all() and result.fi()[0].eq(0).all()
    assert floors[False].max() > 1e-6  # bfloat16 arithmetic: the reordered sum rounds differently
    assert floors[True].max() < 1e-8 and floors[True].max() < floors[False].max() / 1000


def test_flags_table_and_warning_follow_the_floor(tiny, tiny_ids):
    null, reorder = noise_controls(8, 1, 1)
    sets = [
        TokenSet("positions:1", [1], {"selector": "positions"}),
        TokenSet("positions:2", [2], {"selector": "positions"}),
    ]
    kl = torch.tensor([[0.0, 0.0], [1e-4, 3e-4], [5e-4, 2e-3], [5e-3, 1e-2]])  # controls, then a low and a high set
    result = ProbeResult([null, reorder, *sets], [Chunk(8, 9), Chunk(9, 10)], torch.tensor([8, 9]), kl)
    torch.testing.assert_close(result.noise_floor(), torch.tensor([1e-4, 3e-4]))
    assert result.below_noise_floor()[2:].tolist() == [[True, True], [False, False]]
    trace = trace_prefix(tiny.model, tiny_ids, 8, SignalConfig(window=4))
    table = fi_table(Document("d", "", tiny_ids[:10], "memory"), trace, result)
    assert table["below_noise_floor"].tolist()[4:] == [True, True, False, False]
    assert noise_floor(table) == {"d": {"8:9": pytest.approx(1e-4), "9:10": pytest.approx(3e-4)}}
    warning = noise_warning(table)
    assert warning.startswith("warning: 2 of 4 FI values are below 10x the noise floor (up to 0.0003 nats)")


def test_no_warning_without_flags():
    table = pd.DataFrame(
        {
            "document": ["d"] * 2,
            "selector": ["control", "positions"],
            "chunk": ["1:2"] * 2,
            "fi": [0.0, 1e-3],
            "below_noise_floor": [False, False],
        }
    )
    assert noise_warning(table) is None


@pytest.mark.smollm
def test_bfloat16_probe_ranks_like_float32_on_an_unseen_document():
    """The precision check: SmolLM2 on a document no other test uses (botchan), p = 512, chunk 512:640.
    Weights in bfloat16, arithmetic upcast (the default): single-token FI ranks like float32
    (Spearman >= 0.9) and a 60-token set's FI is within 5 % of float32."""
    from fi_toolkit.documents import load_document
    from fi_toolkit.model.loading import load_model

    fis, floors = {}, {}
    for dtype in ("float32", "bfloat16"):
        lm = load_model("smollm2-135m", "cpu", dtype)
        assert lm.compute_dtype == torch.float32
        doc = load_document("botchan", lm.tokenizer, max_tokens=640)
        trace = trace_prefix(lm.model, doc.ids, 512)
        gen = torch.Generator().manual_seed(0)
        picks = (torch.randperm(512 - 4 - 32, generator=gen)[:12] + 4).tolist()
        sets = [TokenSet(f"t{j}", [j]) for j in picks] + [TokenSet("set60", torch.arange(100, 160))]
        result = forward_influence(lm.model, trace, doc.ids, sets, [Chunk(512, 640)], controls=True)
        fis[dtype], floors[dtype] = result.fi()[2:, 0].double().numpy(), float(result.noise_floor()[0])
    single32, single16 = fis["float32"][:12], fis["bfloat16"][:12]
    assert scipy.stats.spearmanr(single32, single16).statistic >= 0.9
    assert fis["bfloat16"][12] == pytest.approx(fis["float32"][12], rel=0.05)
    assert np.all(single16 > 10 * floors["bfloat16"])  # the default bf16 path resolves every single token


@pytest.mark.smollm
def test_cli_warns_in_bfloat16_arithmetic_and_not_when_upcast(tmp_path, capsys):
    """End to end on SmolLM2: with --no-upcast, single-token FI sits at the bf16 floor, the rows are
    flagged and one warning line is printed; the default (upcast) resolves them, no warning."""
    base = [
        "probe",
        "hamlet",
        "--chunk",
        "256:320",
        "--select",
        "positions:100",
        "--select",
        "positions:101",
        "--dtype",
        "bfloat16",
    ]
    code, _, err = run_cli([*base, "--no-upcast", "--out", str(tmp_path / "bf16")], capsys)
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: 2 of 2 FI values are below 10x the noise floor")
    table = pd.read_csv(tmp_path / "bf16" / "fi.csv")
    assert table[table.selector == "positions"]["below_noise_floor"].all()
    manifest = json.loads((tmp_path / "bf16" / "manifest.json").read_text())
    assert manifest["model"]["dtype"] == manifest["model"]["compute_dtype"] == "bfloat16"
    assert manifest["noise_floor"]["hamlet"]["256:320"] > 1e-4

    code, _, err = run_cli([*base, "--out", str(tmp_path / "upcast")], capsys)
    assert code == 0 and "warning:" not in err
    manifest = json.loads((tmp_path / "upcast" / "manifest.json").read_text())
    assert (manifest["model"]["dtype"], manifest["model"]["compute_dtype"]) == ("bfloat16", "float32")
    assert manifest["noise_floor"]["hamlet"]["256:320"] < 1e-8
