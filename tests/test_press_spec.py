"""kvpress press specs, parsed without kvpress: budgets (keep=/remove=, one meaning with the project's), press-own
budgets, options with lists."""

from __future__ import annotations

import pytest

from fi_toolkit.budget import Budget
from fi_toolkit.errors import FIError
from fi_toolkit.integrations.kvpress.spec import PressSpec, parse_press_spec, split_options


def test_options_split_at_commas_outside_brackets():
    assert split_options("a=1,b=[1, 2,3],c=(4,5),d=x") == ["a=1", "b=[1, 2,3]", "c=(4,5)", "d=x"]
    assert split_options("") == []


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("SnapKVPress@keep=0.25", PressSpec(("SnapKVPress",), 0.75)),
        ("SnapKVPress@remove=0.75", PressSpec(("SnapKVPress",), 0.75)),
        (
            "AdaKVPress/SnapKVPress@keep=0.5:window_size=16",
            PressSpec(("AdaKVPress", "SnapKVPress"), 0.5, (("window_size", 16),)),
        ),
        (
            "PerLayerCompressionPress/SnapKVPress@remove=0.75:compression_ratios=[0.5,0.9]",
            PressSpec(("PerLayerCompressionPress", "SnapKVPress"), 0.75, (("compression_ratios", [0.5, 0.9]),)),
        ),
        ("SimLayerKVPress:lazy_threshold=0.5", PressSpec(("SimLayerKVPress",), None, (("lazy_threshold", 0.5),))),
        ("DMSPress/SnapKVPress", PressSpec(("DMSPress", "SnapKVPress"), None)),
    ],
)
def test_specs_parse_and_their_labels_parse_back(text, want):
    spec = parse_press_spec(text, "t")
    assert spec == want
    assert spec.label == f"kvpress:{text}"  # labelled as spelled, like policy:snapkv@keep=0.25
    assert parse_press_spec(spec.label[len("kvpress:") :], "t") == spec


def test_keep_and_remove_give_kvpress_the_ratio_the_old_bare_number_gave():
    """keep=s is compression_ratio 1 - s as remove= (and the old bare number) writes it: the same float, bit for
    bit, where 1 - s in floats is not (1 - 0.7 = 0.30000000000000004)."""
    for keep, ratio in [("0.25", 0.75), ("0.1", 0.9), ("0.7", 0.3), ("0.35", 0.65), ("0.123", 0.877), ("0.999", 0.001)]:
        kept, removed = (
            parse_press_spec(f"SnapKVPress@keep={keep}", "t"),
            parse_press_spec(f"SnapKVPress@remove={ratio}", "t"),
        )
        assert kept.ratio == removed.ratio == ratio and kept == removed
        assert (kept.label, removed.label) == (
            f"kvpress:SnapKVPress@keep={keep}",
            f"kvpress:SnapKVPress@remove={ratio}",
        )
    assert 1 - 0.7 != 0.3  # why the conversion rounds
    assert Budget.parse("keep=0.7").removed_share == 0.3 and Budget.parse("remove=0.7").removed_share == 0.7


def test_a_press_without_a_ratio_has_no_count_before_it_runs():
    assert parse_press_spec("SimLayerKVPress", "t").n_kept(100) is None
    assert parse_press_spec("SnapKVPress@keep=0.25", "t").n_kept(100) == 25  # kvpress's int() truncation
    assert parse_press_spec("SnapKVPress@remove=0.75", "t").n_kept(100) == 25


@pytest.mark.parametrize(
    ("number", "keep", "remove"), [("0.75", "0.25", "0.75"), ("0.7", "0.3", "0.7"), (".1", "0.9", "0.1")]
)
def test_a_bare_number_is_refused_naming_both_spellings_of_it(number, keep, remove):
    """kvpress's compression_ratio is the share removed, a bare budget elsewhere the share kept: a bare number
    would mean one thing for a press and the opposite for a policy, so it is refused with both spellings."""
    with pytest.raises(FIError) as err:
        parse_press_spec(f"SnapKVPress@{number}:window_size=32", "--select kvpress:X")
    message = str(err.value)
    assert f"write keep={keep} or remove={remove}: kvpress's compression_ratio is the share removed" in message
    assert message.startswith("--select kvpress:X: ") and "\n" not in message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SnapKVPress@most", "'most' is not a number"),
        ("SnapKVPress@keep=most", "'most' is not a number"),
        ("SnapKVPress@1", "write keep=X or remove=X, X a share of the prefix strictly between 0 and 1"),
        ("SnapKVPress@1.0", "write keep=X or remove=X, X a share of the prefix strictly between 0 and 1"),
        ("SnapKVPress@keep=1.0", "keep=1.0 must keep some and remove some"),
        ("SnapKVPress@remove=0.0", "remove=0.0 must keep some and remove some"),
        ("SnapKVPress@keep=1e-13", "must keep some and remove some"),  # 1 - 1e-13 rounds to 1.0
        ("SnapKVPress@keep=100", "keep=100 is a token count; a press takes a share of the prefix"),
        ("SnapKVPress@sideways=0.5", "write keep=X or remove=X"),
        ("SnapKVPress@keep=0.5:7", "expected options like window_size=32"),
        ("/SnapKVPress@keep=0.5", "expected kvpress:NAME@BUDGET"),
    ],
)
def test_bad_specs_are_one_line(text, message):
    with pytest.raises(FIError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_press_spec(text, "t")
