"""fi_toolkit/report/numbers.py: each format's rule, pinned digit for digit (the README and the docs quote what the
command line and the report print)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fi_toolkit.report.numbers import (
    accuracy_text,
    accuracy_with_full,
    bracket_interval,
    byte_size,
    console_fi,
    count_text,
    field_fi_text,
    formatted,
    fraction_text,
    headroom_text,
    headroom_with_ci,
    interval_text,
    kib_text,
    kl_text,
    mean_kl_text,
    mean_tokens_text,
    number_text,
    percent,
    rate_text,
    replay_kl_text,
    same_notation,
    sd_text,
    seconds_text,
    signed_text,
    significant,
    spearman_text,
    thousands,
    tokens_per_second,
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


NAN = math.nan


@pytest.mark.parametrize(
    "fn, args, text",
    [
        (count_text, (0.0,), "0"),
        (count_text, (2.5,), "2"),  # half to even, as format's .0f
        (count_text, (3.5,), "4"),
        (count_text, (2048.0,), "2048"),
        (count_text, (123456.789,), "123457"),
        (count_text, (-0.4,), "-0"),
        (count_text, (NAN,), "nan"),
        (thousands, (0,), "0"),
        (thousands, (1023,), "1,023"),
        (thousands, (12345,), "12,345"),
        (thousands, (-4096,), "-4,096"),
        (bracket_interval, (0.1, 0.2), " [0.10, 0.20]"),
        (bracket_interval, (NAN, 0.2), ""),
        (bracket_interval, (None, 0.2), ""),
        (bracket_interval, (0.1, NAN), " [0.10, nan]"),  # only the low bound decides, as the tables did
        (bracket_interval, (-1e-12, 0.5, ".3g"), " [-1e-12, 0.5]"),
        (headroom_text, (0.4236,), "0.42"),
        (headroom_text, (0.4236, 0.31, 0.555), "0.42 [0.31, 0.56]"),
        (headroom_text, (NAN,), "nan"),
        (headroom_text, (-0.005, NAN, 0.2), "-0.01"),
        (headroom_text, (1.0, -0.125, 1.375), "1.00 [-0.12, 1.38]"),
        (headroom_with_ci, (0.4236, "[0.31, 0.55]"), "0.42 [0.31, 0.55]"),
        (headroom_with_ci, (NAN, "[0.31, 0.55]"), ""),
        (headroom_with_ci, (None, "x"), ""),
        (headroom_with_ci, (-0.0, ""), "-0.00 "),
        (sd_text, (0.01234,), "0.012"),
        (sd_text, (NAN,), "n/a"),
        (sd_text, (None,), "n/a"),
        (sd_text, (0.0,), "0.000"),
        (sd_text, (123456.789,), "123456.789"),
        (fraction_text, (0.875,), "0.875"),
        (fraction_text, (1.0,), "1.000"),
        (fraction_text, (1e-12,), "0.000"),
        (fraction_text, (NAN,), "nan"),
        (signed_text, (0.1234,), "+0.123"),
        (signed_text, (-0.04, 4), "-0.0400"),
        (signed_text, (0.0,), "+0.000"),
        (signed_text, (-0.0,), "-0.000"),
        (signed_text, (None,), "n/a"),
        (signed_text, (NAN,), "+nan"),
        (signed_text, (123456.789, 2), "+123456.79"),
        (signed_text, (1e-12, 4), "+0.0000"),
        (mean_tokens_text, (12.34,), "12.3"),
        (mean_tokens_text, (0.0,), "0.0"),
        (mean_tokens_text, (NAN,), ""),
        (mean_tokens_text, (None,), ""),
        (kl_text, (0.012345,), "0.0123"),
        (kl_text, (1.5e-05,), "1.5e-05"),
        (kl_text, (0.0,), "0"),
        (kl_text, (123456.789,), "1.23e+05"),
        (kl_text, (NAN,), "nan"),
        (kl_text, (-1e-12,), "-1e-12"),
        (mean_kl_text, (0.25,), "0.25"),
        (mean_kl_text, (0.25, 0.2, 0.3), "0.25 [0.2, 0.3]"),
        (mean_kl_text, (-4.2e-10, NAN, NAN, 4.2e-10), "≤4.2e-10 (noise floor)"),
        (mean_kl_text, (1e-10, NAN, NAN, 4.2e-10), "≤4.2e-10 (noise floor)"),
        (mean_kl_text, (-1e-3,), "0"),  # no floor: a rounding below 0 reads 0
        (mean_kl_text, (0.25, -0.01, 0.3), "0.25 [0, 0.3]"),
        (mean_kl_text, (0.25, NAN, 0.3), "0.25"),
        (mean_kl_text, (0.0, NAN, NAN, 0.0), "0"),  # a zero floor is no floor
        (mean_kl_text, (5e-4, NAN, NAN, NAN), "0.0005"),
        (accuracy_text, (0.75,), "0.75"),
        (accuracy_text, (0.75, 0.5, 0.9), "0.75 [0.50, 0.90]"),
        (accuracy_text, (0.125, NAN, 0.3), "0.12"),
        (accuracy_text, (1.0, 0.0, 1.0), "1.00 [0.00, 1.00]"),
        (accuracy_text, (NAN,), "nan"),
        (accuracy_with_full, (0.75, 0.9), "0.75 (full 0.90)"),
        (accuracy_with_full, (NAN, 0.9), ""),
        (accuracy_with_full, (None, 0.9), ""),
        (accuracy_with_full, (0.0, NAN), "0.00 (full nan)"),
        (spearman_text, (0.41, 0.12, 0.634), "Spearman +0.41 [+0.12, +0.63]"),
        (spearman_text, (-0.005, -0.5, 0.5), "Spearman -0.01 [-0.50, +0.50]"),
        (spearman_text, (NAN, 0.1, 0.2), "undefined (constant accuracy or KL)"),
        (spearman_text, (1.0, NAN, NAN), "Spearman +1.00 [+nan, +nan]"),
        (field_fi_text, (0.026641,), "0.0266"),
        (field_fi_text, (0.0,), "0.0000"),
        (field_fi_text, (-3e-4,), "-0.0003"),
        (field_fi_text, (NAN,), "nan"),
        (field_fi_text, (123456.789,), "123456.7890"),
        (replay_kl_text, (0.012345,), "0.01235"),
        (replay_kl_text, (1.5e-7,), "1.5e-07"),
        (replay_kl_text, (NAN,), ""),
        (replay_kl_text, (None,), ""),
        (replay_kl_text, (123456.789,), "1.235e+05"),
        (seconds_text, (1.234,), "1.23 s"),
        (seconds_text, (0.0125, 3), "0.013 s"),
        (seconds_text, (0.0125, 3, False), "0.013"),
        (seconds_text, (123456.789,), "123456.79 s"),
        (seconds_text, (NAN,), "nan s"),
        (tokens_per_second, (12.34,), "12.3 tokens/s"),
        (tokens_per_second, (0.0,), "0.0 tokens/s"),
        (tokens_per_second, (12345.67,), "12345.7 tokens/s"),
        (rate_text, (12345.6,), "12,346"),
        (rate_text, (None,), "0"),
        (rate_text, (0.5,), "0"),
        (rate_text, (1.5,), "2"),
        (rate_text, (NAN,), "nan"),
        (kib_text, (0,), "0 KiB"),
        (kib_text, (1536,), "2 KiB"),
        (kib_text, (10**6,), "977 KiB"),
        (kib_text, (2**31,), "2,097,152 KiB"),
    ],
)
def test_the_command_line_tables_and_summaries(fn, args, text):
    """What fi probe, eval, field, fit, generate, labels, correlate and view print, digit for digit (NaN included:
    some cells read empty, some ``n/a``, some ``nan``, each as the command printed it before these rules moved)."""
    assert fn(*args) == text
