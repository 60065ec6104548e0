"""fi_toolkit/report/numbers.py: each format's rule, pinned digit for digit (the README and the docs quote what the
command line and the report print)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fi_toolkit.report.numbers import (
    byte_size,
    console_fi,
    formatted,
    interval_text,
    number_text,
    percent,
    same_notation,
    significant,
    value_text,
    value_with_interval,
)


@pytest.mark.parametrize(
    "value, text",
    [
        (0.0, "0.00000"),
        (1.234567, "1.23457"),
        (12345.6, "12345.60000"),
        (-3e-4, "-0.00030"),
        (1e-4, "0.00010"),
        (9.99999e-5, "1.00e-04"),
        (1e-5, "1.00e-05"),
        (math.nan, "nan"),
    ],
)
def test_the_console_prints_fi_with_five_decimals_and_controls_in_scientific_notation(value, text):
    assert console_fi(value) == text


@pytest.mark.parametrize(
    "value, text",
    [
        (0, "0 B"),
        (1023, "1,023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (10**6, "976.6 KiB"),
        (2**30, "1.0 GiB"),
        (2**40, "1,024.0 GiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_byte_sizes(value, text):
    assert byte_size(value) == text


@pytest.mark.parametrize(
    "value, integer, text",
    [
        (0.026641269, False, "0.02664"),
        (1.5e-07, False, "1.5e-07"),
        (-0.0, False, "0"),
        (4.0, True, "4"),
        (math.nan, False, ""),
        (math.inf, False, "∞"),
        (-math.inf, False, "−∞"),
    ],
)
def test_table_cells_show_at_most_four_significant_digits(value, integer, text):
    assert number_text(value, integer) == text


def test_a_missing_value_reads_n_a_never_nan():
    for missing in (None, math.nan, pd.NA):
        assert value_text(missing) == "n/a"
        assert formatted(missing) == "n/a"
        assert formatted(missing, why="too few cells") == "n/a (too few cells)"
        assert interval_text(missing, 1.0) == "95% CI n/a"
    assert value_with_interval(0.123456, 0.1, math.nan) == "0.1235"
    assert value_with_interval(0.123456, 0.1, 0.15) == "0.1235 [0.1, 0.15]"
    assert interval_text(-0.126, 0.5) == "95% CI -0.13 .. +0.50"
    assert formatted(0.31234, "+.3f") == "+0.312"


def test_sentences_captions_and_pages():
    assert significant(4.97e-10, 1) == "5e-10"
    assert significant(5.0) == "5" and significant(96.0) == "96"
    assert significant(0.91666, 4) == "0.9167"
    assert percent(0.5204) == "52.0%"
    assert same_notation([0.1083, 0.5]) == ["0.1083", "0.5000"]
    assert same_notation([4.283e-07, 0.01083]) == ["4.283e-07", "1.083e-02"]
