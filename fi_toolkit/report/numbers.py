"""Every number as text, in one place: the report's tables, lead tables, headlines, captions and warnings, and
what the command line prints.

Each format is one function with its rule. The report's cells show at most :data:`SIGNIFICANT` significant
digits (the CSV and JSON keep every digit); the command line prints FI with five decimals (:func:`console_fi`),
and each other number of its tables and summaries with one function here (:func:`headroom_text`,
:func:`mean_kl_text`, :func:`seconds_text`, ...). A missing value reads ``n/a``, never ``nan``, wherever the text
is a reader's (a command line cell reads empty, ``n/a`` or ``nan`` as its function says). Figure labels (tick
values, annotations, panel titles) are plot text and stay with their figures.
"""

from __future__ import annotations

import math
import sys

SIGNIFICANT = 4


def missing(v) -> bool:
    """None, a float NaN or ``pandas.NA``: a value a run could not give. (Imports nothing: the command line
    formats with this module before pandas is loaded, and without pandas there is no ``pandas.NA``.)"""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return True
    pd = sys.modules.get("pandas")
    return pd is not None and v is pd.NA


def number_text(value: float, integer: bool = False) -> str:
    """One number for a report's table cell: ``integer`` columns as whole numbers, others with at most
    :data:`SIGNIFICANT` significant digits (``0.026641269`` -> ``0.02664``, ``1.5e-07`` -> ``1.5e-07``, ``-0`` ->
    ``0``); ±infinity as ``∞``/``−∞``; NaN is an empty cell."""
    if not math.isfinite(value):
        return "" if math.isnan(value) else ("∞" if value > 0 else "−∞")
    if integer:
        return str(int(round(value)))
    text = f"{value:.{SIGNIFICANT}g}"
    return "0" if text in ("0", "-0") else text


def same_notation(values: list[float], digits: int = SIGNIFICANT) -> list[str]:
    """Numbers read side by side (a colour bar's ticks) in one notation: all in scientific notation with
    ``digits`` significant digits (``4.283e-07``, ``1.083e-02``) when any non-zero one is below 1e-3 or from 1e4
    on, or they span three decades or more; else all as decimals with the places the smallest needs for
    ``digits`` significant digits (``0.1083``, ``0.5000``). Zero reads ``0``, NaN an empty string."""
    finite = [abs(v) for v in values if math.isfinite(v) and v != 0]
    if not finite:
        return [number_text(v) for v in values]
    small, large = min(finite), max(finite)
    if small < 1e-3 or large >= 1e4 or large >= 1e3 * small:
        spec = f".{digits - 1}e"
    else:
        spec = f".{max(0, digits - 1 - math.floor(math.log10(small)))}f"
    return [format(v, spec) if math.isfinite(v) and v != 0 else number_text(v) for v in values]


def value_text(v) -> str:
    """A lead table's cell value: :func:`number_text` of ``v``, ``n/a`` where it is missing."""
    return "n/a" if missing(v) else number_text(float(v))


def value_with_interval(value, low, high) -> str:
    """A value and its interval in a lead table's cell, ``0.1234 [0.1, 0.15]`` (:func:`value_text` each); the
    value alone where the run has no interval for it."""
    if missing(low) or missing(high):
        return value_text(value)
    return f"{value_text(value)} [{value_text(low)}, {value_text(high)}]"


def formatted(v, spec: str = ".3g", why: str = "") -> str:
    """A number in a headline's sentence: ``v`` in the format ``spec`` (``.3g``: 3 significant digits, ``+.3f``:
    three signed decimals), ``n/a`` where it is missing, with ``why`` in brackets when given."""
    if missing(v):
        return f"n/a ({why})" if why else "n/a"
    return format(float(v), spec)


def interval_text(low, high, spec: str = "+.2f", why: str = "") -> str:
    """A 95 % interval in a headline's sentence, ``95% CI a .. b`` (bounds in the format ``spec``), or
    ``95% CI n/a (why)`` where a bound is missing."""
    if missing(low) or missing(high):
        return f"95% CI n/a ({why})" if why else "95% CI n/a"
    return f"95% CI {format(float(low), spec)} .. {format(float(high), spec)}"


def significant(value, digits: int = 6) -> str:
    """``value`` to at most ``digits`` significant digits, as Python's ``g`` format writes it (``6``: its default;
    trailing zeros dropped; NaN as ``nan``): noise floors in captions and warnings, counts and lm-eval's scores in
    sentences."""
    return format(value, f".{digits}g")


def percent(share: float) -> str:
    """A share as a percentage with one decimal (``0.1234`` -> ``12.3%``)."""
    return f"{share:.1%}"


def console_fi(value: float) -> str:
    """FI (nats) as the command line prints it: five decimals where FI lives (``0.02664``); values below 1e-4 in
    size (the controls, round-off) in scientific notation with three significant digits (``-3.00e-04``), not as
    ``0.00000``; zero as ``0.00000``."""
    return f"{value:.5f}" if value == 0 or abs(value) >= 1e-4 else f"{value:.2e}"


def byte_size(n: float) -> str:
    """A size in bytes as the command line prints it: whole bytes below 1 KiB (``1,023 B``), else KiB, MiB or
    GiB with one decimal and thousands separators (``1.5 KiB``, ``2,048.0 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{int(n):,} B"
        n /= 1024
    return str(n)  # pragma: no cover


# The command line's tables and summaries (fi probe, scores, eval, field, fit, generate, labels, correlate, view).


def count_text(n: float) -> str:
    """A count of positions (maybe a mean) as a whole number, no separators: ``2048``, ``2.5`` -> ``2``."""
    return f"{n:.0f}"


def thousands(n: int) -> str:
    """A whole count (tokens) in a table cell, with thousands separators: ``12,345``."""
    return f"{n:,}"


def bracket_interval(low, high, spec: str = ".2f") -> str:
    """An interval after its value, ``" [a, b]"`` in ``spec``; empty where the low bound is missing."""
    return "" if missing(low) else f" [{format(low, spec)}, {format(high, spec)}]"


def headroom_text(value: float, low: float = math.nan, high: float = math.nan) -> str:
    """A headroom with two decimals and its interval, ``0.42 [0.31, 0.55]``; a NaN headroom reads ``nan``."""
    return f"{value:.2f}{bracket_interval(low, high)}"


def headroom_with_ci(value, ci: str) -> str:
    """A field map's headroom cell, :func:`headroom_text` and the ready-made ``ci``; empty where missing."""
    return "" if missing(value) else f"{headroom_text(value)} {ci}"


def sd_text(sd) -> str:
    """A standard deviation (a headroom's over seeds) with three decimals, ``n/a`` where missing."""
    return formatted(sd, ".3f")


def fraction_text(x: float) -> str:
    """A fraction in [0, 1] (top-1 agreement, kept share) with three decimals: ``0.875``."""
    return f"{x:.3f}"


def signed_text(value, places: int = 3) -> str:
    """A signed number with ``places`` decimals and its sign always, ``+0.123``; None reads ``n/a``, NaN ``+nan``."""
    return "n/a" if value is None else f"{value:+.{places}f}"


def mean_tokens_text(x: float) -> str:
    """A mean number of tokens (the first divergence) with one decimal; empty where missing."""
    return "" if missing(x) else f"{x:.1f}"


def kl_text(kl: float) -> str:
    """A KL divergence (nats) with three significant digits: ``0.0123``, ``1.5e-05``."""
    return f"{kl:.3g}"


def mean_kl_text(kl: float, low: float = math.nan, high: float = math.nan, floor: float = math.nan) -> str:
    """A mean KL: ``≤floor (noise floor)`` if at most a positive floor, else :func:`kl_text` [CI] clamped at 0."""
    if floor == floor and abs(kl) <= floor and floor > 0:
        return f"≤{floor:.2g} (noise floor)"
    text = kl_text(max(kl, 0.0))
    return text if missing(low) else f"{text} [{kl_text(max(low, 0.0))}, {kl_text(max(high, 0.0))}]"


def accuracy_text(acc: float, low: float = math.nan, high: float = math.nan) -> str:
    """An accuracy with two decimals and its interval where it has one: ``0.75 [0.50, 0.90]``."""
    return f"{acc:.2f}{bracket_interval(low, high)}"


def accuracy_with_full(acc, full: float) -> str:
    """A field map's accuracy beside the full cache's, ``0.75 (full 0.90)``; empty where missing."""
    return "" if missing(acc) else f"{accuracy_text(acc)} (full {accuracy_text(full)})"


def spearman_text(rho: float, low: float, high: float) -> str:
    """``Spearman +0.41 [+0.12, +0.63]`` (two signed decimals); ``undefined (...)`` where ``rho`` is NaN."""
    if rho != rho:
        return "undefined (constant accuracy or KL)"
    return f"Spearman {signed_text(rho, 2)} [{signed_text(low, 2)}, {signed_text(high, 2)}]"


def field_fi_text(value: float) -> str:
    """FI (nats) in the field map's table with four decimals, ``0.0266`` (the probe's is :func:`console_fi`)."""
    return f"{value:.4f}"


def replay_kl_text(kl) -> str:
    """A field map's replay KL with four significant digits; empty where missing."""
    return "" if missing(kl) else f"{kl:.4g}"


def seconds_text(s: float, places: int = 2, unit: bool = True) -> str:
    """Seconds with ``places`` decimals and the unit, ``1.23 s``; bare where the column's name has the unit."""
    return f"{s:.{places}f}" + (" s" if unit else "")


def tokens_per_second(rate: float) -> str:
    """A decoding speed with one decimal: ``12.3 tokens/s``."""
    return f"{rate:.1f} tokens/s"


def rate_text(rate) -> str:
    """A throughput (labels per second) as a whole number with thousands separators, ``12,346``; None as ``0``."""
    return f"{rate or 0:,.0f}"


def kib_text(n_bytes: float) -> str:
    """A file's size in whole KiB with thousands separators: ``1,234 KiB``."""
    return f"{n_bytes / 1024:,.0f} KiB"
