"""fi report: tables carry exactly the result files' numbers; the HTML parses and escapes document text."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch
from cli_runner import run_cli

from fi_toolkit import Document, LoadedModel, SignalConfig
from fi_toolkit.errors import FIError
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.report import build_report
from fi_toolkit.report.kinds import kind_of
from fi_toolkit.studies import CorrelateSettings, NearfarSettings, read_table, run_correlate, run_nearfar

CFG = SignalConfig(window=8)
P = 96
EVIL = "<script>alert('x')</script>"


class EvilTokenizer:
    """Decodes every id to a word; some ids decode to a script tag (as text in a document could)."""

    def decode(self, ids):
        i = int(ids[0])
        return EVIL if i % 3 == 0 else (" the" if i % 3 == 1 else f" word{i}")


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    lm = LoadedModel(tiny.model, EvilTokenizer(), "tiny-llama", tiny.device, tiny.dtype)
    gen = torch.Generator().manual_seed(3)
    docs = [
        Document(f"{EVIL} doc{i}", EVIL, torch.randint(0, 256, (200,), generator=gen), "test") for i in range(4)
    ]  # four: a bootstrap interval needs them
    run_correlate(
        lm,
        docs,
        CorrelateSettings(
            [Chunk(P, P + 16), Chunk(P + 32, P + 48)], P, candidates="sample:10", resamples=50, signals=CFG
        ),
        root / "corr",
    )
    run_nearfar(lm, docs, NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=2, signals=CFG), root / "nf")
    out = root / "report"
    written = build_report([root / "corr", root / "nf"], out)
    return root, out, written


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b)) or b is pd.NA
    return a == b


def test_tables_carry_exactly_the_result_numbers(runs):
    root, out, _ = runs
    report = json.loads((out / "report.json").read_text())
    for run in report["runs"]:
        src = root / ("corr" if run["command"] == "correlate" else "nf")
        for name, _ in kind_of(run["command"]).tables:
            assert (out / "tables" / f"{run['label']}__{name}.csv").read_bytes() == (src / f"{name}.csv").read_bytes()
            table = read_table(src / f"{name}.csv")
            records = run["tables"][name]
            assert len(records) == len(table)
            for rec, (_, row) in zip(records, table.iterrows()):
                for col in table.columns:
                    assert _same(rec[col], row[col]), (name, col, rec[col], row[col])


def _md_section(md: str, name: str) -> str:
    """The Markdown of the shown table made from ``name``.csv: from its 'From `name.csv`.' line to the next heading."""
    return md.split(f"From `{name}.csv`.\n\n", 1)[1].split("\n#", 1)[0]


def _md_rows(md: str, name: str) -> list[list[str]]:
    """The cells of the Markdown table made from ``name``.csv (header first), unescaped."""
    lines = [line for line in _md_section(md, name).splitlines() if line.startswith("|")]
    return [[html.unescape(c.strip()) for c in line.strip("|").split(" | ")] for line in [lines[0]] + lines[2:]]


def _md_settings(md: str, name: str) -> dict[str, str]:
    """The 'Same in every row' line above that table: {column: value} (columns sharing a value each get it)."""
    line = next((x for x in _md_section(md, name).splitlines() if x.startswith("*Same in every row:*")), "")
    found = {}
    for part in html.unescape(line.removeprefix("*Same in every row:* ")).split("; "):
        if part:
            names, value = part.rsplit(": ", 1)
            found.update({n: value for n in names.split(", ")})
    return found


def _significant(text: str) -> int:
    """Significant digits of a number as written (``0.02664`` -> 4, ``1.5e-07`` -> 2, ``12`` -> 2)."""
    mantissa = text.lower().split("e")[0].lstrip("-").replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) if "." not in text.split("e")[0] else len(mantissa)


def _reads_as(shown: str, csv_text: str) -> bool:
    """The shown cell is the CSV's number to at most 4 significant digits (an integer as an integer)."""
    if csv_text == "":
        return shown == ""
    value = float(csv_text)
    if value == int(value) and abs(value) < 1e15:
        return shown == str(int(value))
    return _significant(shown) <= 4 and math.isclose(float(shown), value, rel_tol=5e-4, abs_tol=0)


def test_markdown_tables_show_the_csv_numbers_to_4_significant_digits(runs):
    """The shown tables read well (<= 4 significant digits, integers as integers); the CSV files
    they come from keep every digit."""
    root, out, _ = runs
    md = (out / "report.md").read_text()
    text = pd.read_csv(root / "nf" / "nearfar_tests.csv", dtype=str, keep_default_na=False)
    rows = _md_rows(md, "nearfar_tests")
    head = rows[0]
    assert head[:3] == ["sinks", "distance from p", "metric"] and "Wilcoxon p" in head
    assert len(rows) - 1 == len(text)
    assert _md_settings(md, "nearfar_tests") == {"hypothesis": "entropy > attention", "documents": "4"}
    assert set(text["hypothesis"]) == {"entropy > attention"} and set(text["n_documents"]) == {"4"}
    columns = {
        "sinks": "sinks",
        "distance from p": "distance_from_p",
        "metric": "metric",
        "Wilcoxon p": "wilcoxon_p",
        "median difference": "median_difference",
    }
    for shown, (_, row) in zip(rows[1:], text.iterrows()):
        for name, col in columns.items():
            cell = shown[head.index(name)]
            if col == "metric":
                assert cell == row[col]  # text as the CSV has it
            elif col == "wilcoxon_p" and row[col] == "":
                assert cell == "n/a"  # a test that could not be computed (every difference 0)
            else:
                assert _reads_as(cell, row[col]), (name, cell, row[col])
    summary = pd.read_csv(root / "corr" / "correlation_summary.csv", dtype=str, keep_default_na=False)
    first = summary[summary.scope == "mean"].iloc[0]
    shown = _md_rows(md, "correlation_summary")
    cell = shown[1][shown[0].index("ρ mean (range)")]  # "0.1087 (-0.1174 .. 0.3348)"
    mean, low, high = cell.replace("(", "").replace(")", "").replace("..", " ").split()
    assert _reads_as(mean, first["rho_mean"]) and _reads_as(low, first["rho_min"]) and _reads_as(high, first["rho_max"])
    assert _md_settings(md, "correlation_summary")["documents"] == str(int(float(first["n_documents"])))
    nf = _md_rows(md, "nearfar_summary")
    assert "FI mean [95 % CI]" in nf[0] and "fi_mean" not in nf[0]
    csv = pd.read_csv(root / "nf" / "nearfar_summary.csv", dtype=str, keep_default_na=False).iloc[0]
    value, low, high = (
        nf[1][nf[0].index("FI mean [95 % CI]")].replace("[", "").replace("]", "").replace(",", "").split()
    )
    assert _reads_as(value, csv["fi_mean"]) and _reads_as(low, csv["fi_ci_low"]) and _reads_as(high, csv["fi_ci_high"])
    assert len(csv["fi_mean"].replace(".", "").lstrip("0-")) > 5  # ...while the CSV keeps every digit
    tables = "\n".join(line for line in md.splitlines() if line.startswith("|"))
    numbers = re.findall(r"(?<![\w.:=+-])-?\d+\.\d+(?:e[-+]\d+)?(?![\w.:])", tables)
    assert len(numbers) > 50
    for number in numbers:
        assert _significant(number) <= 4, number  # every decimal number in the tables
    for fig in ("fi_vs_distance", "fi_vs_signals", "rho_heatmap", "rho_vs_distance"):
        assert fig in md
    assert all(p.exists() for p in runs[2])


def test_display_table_reads_like_a_person_writes():
    from fi_toolkit.report.display import display_table

    text = pd.DataFrame(
        {
            "sinks": ["4.0", "0.0"],
            "fi_mean": ["0.026641269214513", "1.5e-07"],
            "fi_ci_low": ["0.0213", ""],
            "fi_ci_high": ["0.031149", ""],
            "note": ["a_b", "1e3x"],
            "layer": ["", ""],
            "flag": ["True", "False"],
            "token": [" 1.50", "2"],
        }
    )
    shown = display_table(text)
    assert list(shown.columns) == ["sinks", "FI mean [95 % CI]", "note", "flag", "token"]
    assert shown.iloc[0].tolist() == ["4", "0.02664 [0.0213, 0.03115]", "a_b", "yes", " 1.50"]
    assert shown.iloc[1].tolist() == ["0", "1.5e-07", "1e3x", "no", "2"]
    assert shown.attrs["numeric"] == ["sinks", "FI mean [95 % CI]"]


class Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text, self.images = [], [], 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img" and dict(attrs).get("src", "").startswith("data:image/png;base64,"):
            self.images += 1

    def handle_data(self, data):
        self.text.append(data)


def test_html_parses_and_escapes_document_text(runs):
    _, out, _ = runs
    page = (out / "report.html").read_text()
    parser = Collector()
    parser.feed(page)
    parser.close()
    assert "script" not in parser.tags
    text = "".join(parser.text)
    assert EVIL in text  # the document name and token text show as text
    assert parser.images >= 5  # every figure embedded, nothing linked
    assert "tiny-llama" in text and "p = 96" in text  # caption: model, documents, prefix, chunks
    assert "noise floor <= " in text and "(float32 weights, float32 arithmetic)" in text  # ...and its floor
    cells = re.findall(r"<td class='num'>([^<]*)</td>", page)
    numbers = [n for c in cells for n in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", c)]
    assert len(numbers) > 50 and all(_significant(n) <= 4 for n in numbers)  # the page's tables, as in Markdown
    assert page.count("<div class='table-wrap'><table>") == page.count("<table>")  # every table can scroll


def _fi(args, capsys):
    code, _out, err = run_cli(args, capsys)
    return code, err


def test_report_cli_errors_are_one_line(tmp_path, capsys):
    code, err = _fi(["report", str(tmp_path), "--out", str(tmp_path / "r")], capsys)
    assert code == 2
    assert err.splitlines() == [
        f"error: '{tmp_path}' holds no finished result (no manifest.json, no lm-eval results_*.json); fi report "
        "reads the result directories of fi probe, correlate, nearfar, eval and field, and lm-eval output"
    ]
    code, err = _fi(["report", str(tmp_path), "--format", "pdf"], capsys)
    assert code == 2 and err.startswith("error: invalid --format")


def test_markdown_escapes_document_text(runs):
    _, out, _ = runs
    md = (out / "report.md").read_text()
    assert "<script" not in md and "<img" not in md  # raw HTML in Markdown runs in most renderers
    assert html.escape(EVIL, quote=False) in md  # shown as text, in captions, headings and table cells


def test_markdown_image_links_are_url_encoded(runs, tmp_path):
    root, _, _ = runs
    odd = tmp_path / "my run #1 <b>"
    shutil.copytree(root / "nf", odd)
    out = tmp_path / "report"
    build_report([odd], out, ["md"])
    md = (out / "report.md").read_text()
    assert "](figures/my%20run%20%231%20%3Cb%3E__fi_vs_distance.png)" in md
    assert (out / "figures" / "my run #1 <b>__fi_vs_distance.png").is_file()
    assert "## Forward Influence of equal-size sets, near and far (fi nearfar): my run #1 &lt;b&gt;" in md


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_report_is_never_overwritten_without_overwrite(runs, tmp_path):
    root, _, _ = runs
    out = tmp_path / "report"
    build_report([root / "corr", root / "nf"], out, ["csv", "md"])
    before = _snapshot(out)
    with pytest.raises(FIError, match="already holds results .*pass overwrite"):
        build_report([root / "nf"], out, ["csv"])
    assert _snapshot(out) == before
    written = build_report([root / "nf"], out, ["csv"], overwrite=True)
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert left == sorted(str(p.relative_to(out)) for p in written)  # the old report's files are gone
    assert not any(p.name.startswith(".") for p in out.rglob("*"))  # no temporary files


def test_report_into_a_result_directory_is_refused(runs):
    root, _, _ = runs
    with pytest.raises(FIError, match="is the result directory"):
        build_report([root / "nf"], root / "nf", ["csv"], overwrite=True)


def test_copies_are_atomic(runs, tmp_path, monkeypatch):
    """A copy that fails half-way leaves the old file whole and no temporary file."""
    from fi_toolkit.runs import results

    root, _, _ = runs
    target = tmp_path / "t.csv"
    target.write_text("old\n")

    def half(src, dst):
        with open(dst, "wb") as fh:
            fh.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(results.shutil, "copyfile", half)
    with pytest.raises(OSError):
        results.atomic_copy(root / "nf" / "nearfar.csv", target)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]


def test_analyses_scripts_copy_results_atomically(tmp_path, monkeypatch):
    """analyses/_common.copy_results: a copy that fails half-way leaves the kept result file whole."""
    import argparse
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "analyses"))
    from _common import copy_results

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.csv").write_text("new\n")
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "summary.csv").write_text("old\n")

    def half(src, dst):
        with open(dst, "wb") as fh:
            fh.write(b"ha")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", half)
    with pytest.raises(OSError):
        copy_results(argparse.Namespace(out=tmp_path / "out", results=str(kept)), ["summary.csv"])
    assert [p.name for p in kept.iterdir()] == ["summary.csv"] and (kept / "summary.csv").read_text() == "old\n"
    monkeypatch.undo()
    copy_results(argparse.Namespace(out=tmp_path / "out", results=str(kept)), ["summary.csv"])
    assert (kept / "summary.csv").read_text() == "new\n"


def test_view_pages_of_the_runs_documents_are_linked(runs, tmp_path):
    """fi view pages in a run directory (of the documents it covers) are copied beside the report and linked."""
    from fi_toolkit.report.token_page import ViewData, with_report_link, write_view

    root, _, _ = runs
    run = tmp_path / "nf"
    shutil.copytree(root / "nf", run)

    def page(document, path):
        data = ViewData(
            document,
            "tiny-llama",
            2,
            "2:3",
            ["a", "b"],
            {k: torch.ones(2) for k in ("FI", "FI_se", "H", "A", "D", "S")},
            {"snapkv@keep=0.5": torch.tensor([0, 8])},
            8,
        )
        write_view(path, data)

    page(f"{EVIL} doc1", run / "doc1.html")
    (run / "views").mkdir()
    page("another document", run / "views" / "other.html")  # not a document of this run
    (run / "notes.html").write_text("<html>not a view</html>")
    out = tmp_path / "report"
    written = build_report([run], out, ["html", "md"])
    assert sorted(p.name for p in (out / "views").iterdir()) == ["nf__doc1.html"]
    copy = (out / "views" / "nf__doc1.html").read_text(encoding="utf-8")
    assert copy == with_report_link((run / "doc1.html").read_text(encoding="utf-8"), "../report.html")
    assert back_links(out / "views" / "nf__doc1.html") == [
        (out / "report.html").resolve()
    ]  # leads back, to a file there
    assert "fi-report" not in (run / "doc1.html").read_text(encoding="utf-8")  # the page alone links nowhere
    assert out / "views" / "nf__doc1.html" in written
    assert f"- [{html.escape(EVIL, quote=False)} doc1](views/nf__doc1.html)" in (out / "report.md").read_text()
    assert "<a href='views/nf__doc1.html'>" in (out / "report.html").read_text()
    markdown_only = tmp_path / "report-md"
    build_report([run], markdown_only, ["md"])
    assert back_links(markdown_only / "views" / "nf__doc1.html") == [(markdown_only / "report.md").resolve()]


def back_links(page) -> list:
    """The files a view page's link back to its report resolves to (relative to the page), those that exist."""
    hrefs = re.findall(r"<nav id='fi-report'[^>]*><a href='([^']*)'>", page.read_text(encoding="utf-8"))
    return [(page.parent / h).resolve() for h in hrefs if (page.parent / h).resolve().is_file()]
