"""The noise floor's one module (fi_toolkit.probe.noise_floor): the floor of a table's controls, the
float32 margin, the tensor rule of ProbeResult, fi eval's full-cache rule and the CLI's warning line.

Oracles are written here with plain pandas / numpy on hand-made tables, never with the module's code."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from fi_toolkit.cli.console import print_warning
from fi_toolkit.documents import Document
from fi_toolkit.evaluation.replay_runs import FULL
from fi_toolkit.evaluation.summaries import summarise_replays
from fi_toolkit.eviction import TokenSet
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.experiment import fi_table
from fi_toolkit.probe.forward_influence import ProbeResult
from fi_toolkit.probe.noise_floor import (
    CONTROL,
    CONTROL_LABELS,
    NOISE_MARGIN,
    flag_below_noise_floor,
    is_control,
    noise_controls,
    noise_floor,
    text_below_noise_floor,
    text_future_floor,
    text_noise_floor,
)
from fi_toolkit.report.noise import noise_warning, replay_noise_warning
from fi_toolkit.signals.trace import SignalConfig, trace_prefix

FLOOR = np.float32(0.25)  # exact in float32, so margin x floor = 2.5 exactly
AT_MARGIN = np.float32(2.5)
JUST_BELOW = np.nextafter(AT_MARGIN, np.float32(0))  # the largest float32 below 2.5


def _table() -> pd.DataFrame:
    """Two documents x two chunks; the controls' FI has both signs; a measured row larger than any control."""
    rows = [
        ("a", "control:null", CONTROL, "8:9", 0.0),
        ("a", "control:reorder", CONTROL, "8:9", -3e-7),
        ("a", "control:null", CONTROL, "9:10", 2e-7),
        ("a", "control:reorder", CONTROL, "9:10", 1e-7),
        ("b", "control:null", CONTROL, "8:9", -5e-6),
        ("b", "control:reorder", CONTROL, "8:9", 4e-6),
        ("b", "control:null", CONTROL, "9:10", 0.0),
        ("b", "control:reorder", CONTROL, "9:10", 0.0),
        ("a", "positions:1", "positions", "8:9", 1.0),
        ("b", "positions:1", "positions", "9:10", -9.0),
    ]
    return pd.DataFrame(rows, columns=["document", "selection", "selector", "chunk", "fi"])


def test_floor_of_a_table_is_the_largest_abs_fi_of_its_controls_per_document_and_chunk():
    table = _table()
    controls = table[table["selector"] == "control"]
    expected = {}
    for (doc, chunk), part in controls.groupby(["document", "chunk"]):
        expected.setdefault(doc, {})[chunk] = max(abs(v) for v in part["fi"])
    assert expected == {"a": {"8:9": 3e-7, "9:10": 2e-7}, "b": {"8:9": 5e-6, "9:10": 0.0}}  # the hand-made table
    assert noise_floor(table) == expected
    assert noise_floor(table[table["selector"] != "control"]) == {}  # no controls, no floor


def test_a_row_at_exactly_margin_times_floor_is_not_flagged_one_just_below_is():
    assert NOISE_MARGIN == 10.0
    table = pd.DataFrame(
        {
            "document": ["d"] * 6,
            "selector": [CONTROL, CONTROL, "x", "x", "x", "x"],
            "chunk": ["1:2"] * 6,
            "fi": [0.0, -float(FLOOR), float(AT_MARGIN), float(JUST_BELOW), 2.5 - 1e-9, 2.6],
        }
    )
    flagged = flag_below_noise_floor(table)
    # 2.5 - 1e-9 is 2.5 in float32, as the probe's FI is: not below
    assert flagged["below_noise_floor"].tolist() == [True, True, False, True, False, False]
    assert list(flagged.columns) == ["document", "selector", "chunk", "fi", "below_noise_floor"]
    # another table's floors (a document measured in parts); a chunk without a floor flags nothing
    part = table.iloc[2:].assign(chunk=["1:2", "1:2", "1:2", "7:8"])
    assert flag_below_noise_floor(part, noise_floor(table))["below_noise_floor"].tolist() == [False, True, False, False]
    warning = noise_warning(flagged)
    assert warning.startswith("warning: 1 of 4 FI values are below 10x the noise floor (up to 0.25 nats)")


def test_probe_result_flags_with_the_same_rule_as_the_table(tiny, tiny_ids):
    null, reorder = noise_controls(8, 1, 1)
    assert [null.label, reorder.label] == list(CONTROL_LABELS) and is_control(null) and is_control(reorder)
    sets = [TokenSet(f"positions:{i}", [i], {"selector": "positions"}) for i in (1, 2, 3)]
    assert not any(is_control(s) for s in sets)
    # one position per chunk, so FI = KL exactly; chunk 9:10 has floor 0.25, chunk 8:9 floor 0.5
    kl = torch.tensor([[0.0, 0.0], [-0.5, -FLOOR], [5.0, AT_MARGIN], [4.5, JUST_BELOW], [6.0, 3.0]])
    result = ProbeResult([null, reorder, *sets], [Chunk(8, 9), Chunk(9, 10)], torch.tensor([8, 9]), kl)
    assert result.noise_floor().tolist() == [0.5, 0.25]
    expected = [[True, True], [True, True], [False, False], [True, True], [False, False]]
    assert result.below_noise_floor().tolist() == expected
    trace = trace_prefix(tiny.model, tiny_ids, 8, SignalConfig(window=4))
    table = fi_table(Document("d", "", tiny_ids[:10], "memory"), trace, result)
    assert table["below_noise_floor"].tolist() == [v for row in expected for v in row]
    assert flag_below_noise_floor(table)["below_noise_floor"].tolist() == table["below_noise_floor"].tolist()
    assert noise_floor(table) == {"d": {"8:9": 0.5, "9:10": 0.25}}
    without = ProbeResult(sets, result.chunks, result.positions, kl[2:])
    assert without.noise_floor() is None and without.below_noise_floor() is None


def _replays() -> pd.DataFrame:
    rows = [  # document, future, policy, budget, mean_kl
        ("d0", "document", FULL, None, -1e-8),
        ("d0", "document", "snapkv", 0.5, 9.9e-8),
        ("d0", "document", "h2o", 0.5, 1e-7),
        ("d0", "document", "infokv", 0.5, 3e-3),
        ("d1", "document", FULL, None, 2e-8),
        ("d1", "document", "snapkv", 0.5, 1.9e-7),
        ("d1", "document", "h2o", 0.5, -2e-7),
        ("d1", "document", "infokv", 0.5, 5e-3),
        ("d0", "generated:8", FULL, None, 0.0),
        ("d0", "generated:8", "snapkv", 0.5, 1e-6),
    ]
    return pd.DataFrame(rows, columns=["document", "future", "policy", "budget", "mean_kl"])


def test_text_rule_flags_a_compressed_replay_below_margin_times_the_full_cache_replay():
    replays = _replays()
    assert text_noise_floor(replays, FULL) == {"d0": {"document": 1e-8, "generated:8": 0.0}, "d1": {"document": 2e-8}}
    below = text_below_noise_floor(replays, FULL)
    assert below.index.tolist() == [1, 2, 3, 5, 6, 7, 9]  # the compressed replays, as indexed in the table
    # |mean KL| < 10 x |full| in float64: 9.9e-8 < 1e-7 is below; 1e-7 is not (at the margin); 1.9e-7 < 2e-7;
    # |-2e-7| is not; a zero floor flags nothing
    limit = {("d0", "document"): 10 * 1e-8, ("d1", "document"): 10 * 2e-8, ("d0", "generated:8"): 0.0}
    expected = [abs(r.mean_kl) < limit[r.document, r.future] for r in replays[replays.policy != FULL].itertuples()]
    assert expected == [True, False, False, True, False, False, False]
    assert below.tolist() == expected
    assert replay_noise_warning(replays, FULL) == (
        "warning: 2 of 7 compressed replays have a mean KL below 10x the full-cache replay's (the noise floor), "
        "e.g. snapkv@0.5 on d0"
    )
    assert replay_noise_warning(replays[replays.policy != "snapkv"], FULL) is None
    assert text_future_floor(replays, FULL) == {"document": 2e-8, "generated:8": 0.0}


def test_replay_summary_noise_floor_is_the_largest_full_cache_kl_per_future():
    replays = _replays().assign(
        retention=0.5, top1_agreement=1.0, delta_nll=0.0, free_first_divergence=0.0, kept_share=0.5
    )
    summary = summarise_replays(replays, n_resamples=0)
    floors = summary.set_index(["future", "policy"])["noise_floor"]
    assert floors[("document", "infokv")] == 2e-8 and floors[("document", FULL)] == 2e-8
    assert floors[("generated:8", "snapkv")] == 0.0


def test_cli_prints_a_warning_as_one_stderr_line(capsys):
    print_warning(None)
    print_warning("warning: 2 of 7 compressed replays [bold]x[/bold] " + "y" * 300)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "warning: 2 of 7 compressed replays [bold]x[/bold] " + "y" * 300 + "\n"


def test_fi_probe_table_marks_every_value_below_the_floor_and_says_why(capsys):
    """fi probe's table of mean FI: the controls (a negative one included) and a set below the floor carry the
    report's mark, explained in one line under the table; a set above the floor carries none."""
    from fi_toolkit.cli.app import _print_fi_table
    from fi_toolkit.report.noise import BELOW_FLOOR_MARK

    rows = [
        ("a", "control:null", CONTROL, "8:16", 0.0),
        ("a", "control:reorder", CONTROL, "8:16", -4.93e-10),
        ("a", "positions:1", "positions", "8:16", 2e-9),
        ("a", "positions:2", "positions", "8:16", 3e-3),
    ]
    table = pd.DataFrame(rows, columns=["document", "selection", "selector", "chunk", "fi"])
    _print_fi_table(flag_below_noise_floor(table.assign(n_removed=1, n_kept=7)), "FI")
    out = capsys.readouterr().out
    shown = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert "-4.93e-10 " + BELOW_FLOOR_MARK in shown["control:reorder"] and BELOW_FLOOR_MARK in shown["control:null"]
    assert BELOW_FLOOR_MARK in shown["positions:1"] and BELOW_FLOOR_MARK not in shown["positions:2"]
    note = [line for line in out.splitlines() if line.startswith(BELOW_FLOOR_MARK)]
    assert len(note) == 1 and "noise floor" in note[0] and "round-off" in note[0] and "4.9e-10" in note[0]
    _print_fi_table(flag_below_noise_floor(table[table["fi"] > 1e-3].assign(n_removed=1, n_kept=7)), "FI")
    assert BELOW_FLOOR_MARK not in capsys.readouterr().out  # nothing below the floor: no mark, no note


@pytest.mark.parametrize("prefix, layers, heads", [(8, 1, 1), (5, 3, 2)])
def test_controls_change_nothing(prefix, layers, heads):
    null, reorder = noise_controls(prefix, layers, heads)
    assert null.n_removed(prefix) == 0 and reorder.n_kept(prefix) == prefix
