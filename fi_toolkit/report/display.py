"""Tables as a person reads them: the cells ``fi report`` shows in HTML and Markdown.

The CSV and JSON files keep every digit; the page shows each number as
:func:`~fi_toolkit.report.numbers.number_text` writes it (at most 4 significant digits), whole-number columns as
integers (``4``, not ``4.0``), a value and its bootstrap bounds in one column (``FI mean [95 % CI]``:
``0.02664 [0.0213, 0.0311]``), a minimum and maximum as one range, booleans as ``yes``/``no``, and column names in
words. Text cells stay as the CSV has them. A statistic over documents that one document cannot give (a spread, a
confidence interval, a paired test) reads ``n/a (needs ≥ 2 documents)``, never ``nan``; an interval over fewer
documents than a bootstrap can use (:mod:`fi_toolkit.intervals`) reads ``n/a (needs ≥ 4 documents for a bootstrap
interval)``. :func:`split_settings` moves the columns that hold one value in every row out of the table, into a
"settings" line above it, so the columns that vary (the results) come first on the screen.
"""

from __future__ import annotations

import math

import pandas as pd

from fi_toolkit.intervals import MIN_BOOTSTRAP_UNITS, NEEDS_BOOTSTRAP
from fi_toolkit.report.numbers import number_text

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
    "a_wins": "documents where entropy > attention",
    "wilcoxon_p": "Wilcoxon p",
}
NEEDS_TWO = "needs ≥ 2 documents"
NEEDS_DOCUMENTS = f"n/a ({NEEDS_TWO})"
NO_INTERVAL = f"n/a ({NEEDS_BOOTSTRAP})"  # a bound over fewer documents than a bootstrap can use
BOUND_SUFFIXES = ("_low", "_high")
# Columns that are statistics over documents: empty where a row covers fewer than two documents.
OVER_DOCUMENTS = ("_std", "_sd", "_low", "_high", "wilcoxon_statistic", "wilcoxon_p", "ttest_log_ratio_p")
DOCUMENT_COUNTS = ("n_documents", "documents")
BOOLEANS = {"true": "yes", "false": "no"}
# (suffix of the low bound, suffix of the high bound, what the pair is): checked in this order
BOUNDS = [("_ci_low", "_ci_high", "95 % CI"), ("_low", "_high", "95 % CI"), ("_min", "_max", "range")]


def text_cells(table: pd.DataFrame) -> pd.DataFrame:
    """A computed table as its CSV file holds it: every cell ``str``, a missing value empty (what
    :func:`display_table` reads), so a terminal shows what the report shows."""
    return table.map(lambda v: "" if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v))


def _over_documents(column: str) -> bool:
    return column.endswith(OVER_DOCUMENTS) or column in OVER_DOCUMENTS


def _single_document_rows(text: pd.DataFrame, fewer_than: int = 2) -> pd.Series | None:
    """True for the rows that cover fewer than ``fewer_than`` documents (a ``n_documents``/``documents`` column);
    None for a table without such a column (its statistics are not over documents)."""
    count = next((c for c in DOCUMENT_COUNTS if c in text.columns), None)
    if count is None:
        return None
    return pd.to_numeric(text[count].astype(str), errors="coerce").lt(fewer_than)


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
    if "ci_low" in columns and "ci_high" in columns and not found:  # kl_accuracy, headroom: VALUE, ci_low, ci_high
        value = next((c for c in ("rho", "value", "mean", "headroom") if c in columns), None)
        if value:
            found[value] = ("ci_low", "ci_high", "95 % CI")
    return found


TEXT_COLUMNS = ("document", "token", "text", "name")  # text even where every cell looks like a number ("2024")


def display_table(text: pd.DataFrame) -> pd.DataFrame:
    """A table's cells as the CSV has them (``str``) -> the cells and column names a reader sees.

    Returns a frame of ``str`` with the same rows; bounds columns are folded into their value's column
    and numbers shortened (module docstring); columns with no value at all are left out. ``attrs['numeric']`` lists the
    columns that hold numbers."""
    single = _single_document_rows(text)
    short = _single_document_rows(text, MIN_BOOTSTRAP_UNITS)  # too few documents for a bootstrap interval
    filled = {c: (text[c].astype(str).str.strip() != "").any() for c in text.columns}
    # all-empty columns are dropped, except a statistic over documents that one document left empty (it says why)
    columns = [
        c
        for c in text.columns
        if filled[c]
        or (
            _over_documents(c) and single is not None and (single.any() or (c.endswith(BOUND_SUFFIXES) and short.any()))
        )
    ]
    numbers = {
        c: None
        if c in TEXT_COLUMNS
        else _numeric(text[c].astype(str))
        if filled[c]
        else pd.Series(math.nan, text.index)
        for c in columns
    }
    integer = {c: v is not None and bool(((v.dropna() % 1) == 0).all()) for c, v in numbers.items()}

    def cells(c: str) -> pd.Series:
        v = numbers[c]
        raw = text[c].astype(str)
        shown = (
            raw.map(lambda x: BOOLEANS.get(x.strip().lower(), x))
            if v is None
            else v.map(lambda x: number_text(x, integer[c]))
        )
        if _over_documents(c) and single is not None:  # a spread, CI or test one document cannot give; else n/a
            empty = raw.str.strip() == ""
            if c.endswith(BOUND_SUFFIXES):  # an interval: fewer documents than a bootstrap can use, say so
                shown = shown.where(~(short & empty), NO_INTERVAL).where(~(~short & empty), "n/a")
            else:
                shown = shown.where(~(single & empty), NEEDS_DOCUMENTS).where(~(~single & empty), "n/a")
        return shown

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
            low, high = (
                low.replace([NEEDS_DOCUMENTS, NO_INTERVAL], ""),
                high.replace([NEEDS_DOCUMENTS, NO_INTERVAL], ""),
            )
            if kind != "range" and not (low + high).str.strip().any() and _over_documents(lo):
                out[reader_name(c)] = list(value)  # no interval in any row: the value alone, the reason beside it
                out[f"{reader_name(c)} {kind}"] = list(cells(lo))
                numeric.append(reader_name(c))
                continue
            if kind == "range" and single is not None and single.all():  # one document's range: its value
                name = reader_name(c)
                out[name] = list(value)
            elif kind == "range" and c.endswith("_mean"):
                name = f"{reader_name(c)} ({kind})"
                out[name] = [f"{v} ({a} .. {b})" if a or b else v for v, a, b in zip(value, low, high)]
            else:
                name = f"{reader_name(c)} [{kind}]"
                out[name] = [
                    f"{v} [n/a]" if a == b == "n/a" else f"{v} [{a}, {b}]" if a or b else v
                    for v, a, b in zip(value, low, high)
                ]
        else:
            name = reader_name(c)
            out[name] = list(cells(c))
        if numbers[c] is not None:
            numeric.append(name)
    shown = pd.DataFrame(out, index=text.index, dtype=object)
    shown.attrs["numeric"] = numeric
    return shown


def split_settings(shown: pd.DataFrame) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """A shown table -> (the table without the columns that hold one value in every row, [(names, value)]).

    Such columns are the run's settings, not its results (``documents: 1``, ``method: spearman``); columns that
    share a value are listed together. A table of fewer than two rows, or one whose every column is constant,
    is returned whole."""
    if len(shown) < 2:
        return shown, []
    constant = [c for c in shown.columns if shown[c].astype(str).nunique() == 1]
    varying = [c for c in shown.columns if c not in constant]
    if not varying:
        return shown, []
    table = shown[varying].copy()
    table.attrs["numeric"] = [c for c in shown.attrs.get("numeric", []) if c in varying]
    by_value: dict[str, list[str]] = {}
    for c in constant:
        by_value.setdefault(str(shown[c].iloc[0]), []).append(c)
    return table, [(", ".join(names), value) for value, names in by_value.items()]


def pooled_fi(fi: pd.DataFrame) -> pd.DataFrame:
    """The measured sets as every report table shows them, the random seeds of a size pooled into one baseline
    row: :func:`~fi_toolkit.studies.random_baseline.pooled_sets` without the bootstrap (what ``fi probe`` prints)."""
    from fi_toolkit.studies.random_baseline import pooled_sets

    return pooled_sets(fi, n_resamples=0)
