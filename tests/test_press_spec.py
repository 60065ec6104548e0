"""kvpress press specs, parsed without kvpress: ratios, press-own budgets, options with lists."""

from __future__ import annotations

import pytest

from fi_toolkit.errors import FIError
from fi_toolkit.integrations.kvpress.spec import PressSpec, parse_press_spec, split_options


def test_options_split_at_commas_outside_brackets():
    assert split_options("a=1,b=[1, 2,3],c=(4,5),d=x") == ["a=1", "b=[1, 2,3]", "c=(4,5)", "d=x"]
    assert split_options("") == []


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("SnapKVPress@0.75", PressSpec(("SnapKVPress",), 0.75)),
        (
            "AdaKVPress/SnapKVPress@0.5:window_size=16",
            PressSpec(("AdaKVPress", "SnapKVPress"), 0.5, (("window_size", 16),)),
        ),
        (
            "PerLayerCompressionPress/SnapKVPress@0.75:compression_ratios=[0.5,0.9]",
            PressSpec(("PerLayerCompressionPress", "SnapKVPress"), 0.75, (("compression_ratios", [0.5, 0.9]),)),
        ),
        ("SimLayerKVPress:lazy_threshold=0.5", PressSpec(("SimLayerKVPress",), None, (("lazy_threshold", 0.5),))),
        ("DMSPress/SnapKVPress", PressSpec(("DMSPress", "SnapKVPress"), None)),
    ],
)
def test_specs_parse_and_their_labels_parse_back(text, want):
    spec = parse_press_spec(text, "t")
    assert spec == want
    assert parse_press_spec(spec.label[len("kvpress:") :], "t") == spec


def test_a_press_without_a_ratio_has_no_count_before_it_runs():
    assert parse_press_spec("SimLayerKVPress", "t").n_kept(100) is None
    assert parse_press_spec("SnapKVPress@0.75", "t").n_kept(100) == 25  # kvpress's int() truncation


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SnapKVPress@most", "the ratio 'most' is not a number"),
        ("SnapKVPress@1", "must lie in (0, 1)"),
        ("SnapKVPress@0.5:7", "expected options like window_size=32"),
        ("/SnapKVPress@0.5", "expected kvpress:NAME@RATIO"),
    ],
)
def test_bad_specs_are_one_line(text, message):
    with pytest.raises(FIError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_press_spec(text, "t")
