"""Tables as a person reads them: the cells ``fi report`` shows in HTML and Markdown.

The CSV and JSON files keep every digit; the page shows each number with at most
:data:`SIGNIFICANT` significant digits, whole-number columns as integers (``4``, not ``4.0``),
a value and its bootstrap bounds in one column (``FI mean [95 % CI]``: ``0.02664 [0.0213, 0.0311]``),
a minimum and maximum as one range, and column names in words. Text cells stay as the CSV has them.
"""

from __future__ import annotations

import math

import pandas as pd

SIGNIFICANT = 4
WORDS = {  # column-name words as a reader spells them; other words keep their spelling, '_' becomes ' '
    "fi": "FI",
    "kl": "KL",
    "nll": "NLL",
    "rho": "ρ",
    "std": "sd",
    "p": "p",
    "ci": "CI",
    "top1": "top-1",
    "delta": "Δ",
    "rel": "relative to",
    "wilcoxon": "Wilcoxon",
    "sd": "sd",
}
NAMES = {  # whole names where the words alone read badly
    "n_documents": "documents",
    "n_removed": "removed",
    "n_kept": "kept",
    "n_tokens": "tokens",
    "n": "n",
    "distance_from_p": "distance from p",
    "fi_share_near": "FI / FI on nearest chunk",
    "fi_rel_random": "FI / random FI",
    "delta_nll": "ΔNLL",
    "top1_agreement": "top-1 agreement",
    "mean_kl": "mean KL",
    "a_wins": "entropy wins",
    "wilcoxon_p": "Wilcoxon p",
}
# (suffix of the low bound, suffix of the high bound, what the pair is): checked in this order
BOUNDS = [("_ci_low", "_ci_high", "95 % CI"), ("_low", "_high", "95 % CI"), ("_min", "_max", "range")]


def number_text(value: float, integer: bool = False) -> str:
    """One number for the page: ``integer`` columns as whole numbers, others with at most 4 significant
    digits (``0.026641269`` -> ``0.02664``, ``1.5e-07`` -> ``1.5e-07``); NaN is an empty cell."""
    if not math.isfinite(value):
        return "" if math.isnan(value) else ("∞" if value > 0 else "−∞")
    if integer:
        return str(int(round(value)))
    text = f"{value:.{SIGNIFICANT}g}"
    return "0" if text in ("0", "-0") else text


def _numeric(cells: pd.Series) -> pd.Series | None:
    """The column as floats when every non-empty cell is a number (booleans are not); else None."""
    filled = cells[cells.str.strip() != ""]
    if filled.empty or filled.str.lower().isin(["true", "false"]).any():
        return None
    values = pd.to_numeric(cells.where(cells.str.strip() != ""), errors="coerce")
    return None if values[filled.index].isna().any() else values


def reader_name(column: str) -> str:
    """``rho_mean`` -> ``ρ mean``, ``n_documents`` -> ``documents``, ``fi_rel_random_sd`` -> ``FI / random FI sd``."""
    if column in NAMES:
        return NAMES[column]
    for name in sorted(NAMES, key=len, reverse=True):  # a named stem with a suffix (_mean, _sd)
        if column.startswith(name + "_"):
            return f"{NAMES[name]} {reader_name(column[len(name) + 1 :])}"
    return " ".join(WORDS.get(w, w) for w in column.split("_") if w)


def _pairs(columns: list[str]) -> dict[str, tuple[str, str, str]]:
    """{value column: (low column, high column, kind)} for the bounds each value has beside it."""
    found, used = {}, set()
    for col in columns:
        stems = [col] + ([col.removesuffix("_mean")] if col.endswith("_mean") else [])  # fi_mean beside fi_ci_low
        for stem, (lo_suffix, hi_suffix, kind) in ((s, b) for b in BOUNDS for s in stems):
            lo, hi = stem + lo_suffix, stem + hi_suffix
            if lo in columns and hi in columns and not {lo, hi} & used:
                found[col], used = (lo, hi, kind), used | {lo, hi}
                break
        stem = col.rsplit("_", 1)[0]  # rho_mean beside rho_min/rho_max: the range of the means
        if col not in found and col.endswith("_mean") and f"{stem}_min" in columns and f"{stem}_max" in columns:
            found[col] = (f"{stem}_min", f"{stem}_max", "range")
    if "ci_low" in columns and "ci_high" in columns and not found:  # kl_accuracy: rho, ci_low, ci_high
        value = next((c for c in columns if c not in ("ci_low", "ci_high") and c in ("rho", "value", "mean")), None)
        if value:
            found[value] = ("ci_low", "ci_high", "95 % CI")
    return found


TEXT_COLUMNS = ("document", "token", "text", "name")  # text even where every cell looks like a number ("2024")


def display_table(text: pd.DataFrame) -> pd.DataFrame:
    """A table's cells as the CSV has them (``str``) -> the cells and column names a reader sees.

    Returns a frame of ``str`` with the same rows; bounds columns are folded into their value's column
    and numbers shortened (module docstring); columns with no value at all are left out. ``attrs['numeric']`` lists the
    columns that hold numbers."""
    columns = [c for c in text.columns if (text[c].astype(str).str.strip() != "").any()]  # all-empty: dropped
    numbers = {c: None if c in TEXT_COLUMNS else _numeric(text[c].astype(str)) for c in columns}
    integer = {c: v is not None and bool(((v.dropna() % 1) == 0).all()) for c, v in numbers.items()}

    def cells(c: str) -> pd.Series:
        v = numbers[c]
        return text[c].astype(str) if v is None else v.map(lambda x: number_text(x, integer[c]))

    pairs = {
        v: b
        for v, b in _pairs(columns).items()
        if numbers[v] is not None and numbers[b[0]] is not None and numbers[b[1]] is not None
    }
    folded = {c for lo, hi, _ in pairs.values() for c in (lo, hi)}
    out, numeric = {}, []
    for c in columns:
        if c in folded:
            continue
        if c in pairs:
            lo, hi, kind = pairs[c]
            value, low, high = cells(c), cells(lo), cells(hi)
            if kind == "range" and c.endswith("_mean"):
                name = f"{reader_name(c)} ({kind})"
                out[name] = [f"{v} ({a} .. {b})" if a or b else v for v, a, b in zip(value, low, high)]
            else:
                name = f"{reader_name(c)} [{kind}]"
                out[name] = [f"{v} [{a}, {b}]" if a or b else v for v, a, b in zip(value, low, high)]
        else:
            name = reader_name(c)
            out[name] = list(cells(c))
        if numbers[c] is not None:
            numeric.append(name)
    shown = pd.DataFrame(out, index=text.index, dtype=object)
    shown.attrs["numeric"] = numeric
    return shown
