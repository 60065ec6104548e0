"""Every number as text, in one place: the report's tables, lead tables, headlines, captions and warnings, and
what the command line prints.

Each format is one function with its rule. The report's cells show at most :data:`SIGNIFICANT` significant
digits (the CSV and JSON keep every digit); the command line prints FI with five decimals (:func:`console_fi`);
a missing value reads ``n/a``, never ``nan``, wherever the text is a reader's. Figure labels (tick values,
annotations, panel titles) are plot text and stay with their figures.
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
