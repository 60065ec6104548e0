"""fi report: tables carry exactly the result files' numbers; the HTML parses and escapes document text."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch

from fi_toolkit import Document, LoadedModel, SignalConfig
from fi_toolkit.analysis import read_table, run_correlate, run_nearfar
from fi_toolkit.probe import Chunk
from fi_toolkit.report import build_report
from fi_toolkit.report.export import TABLES

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
    docs = [Document(f"{EVIL} doc{i}", EVIL, torch.randint(0, 256, (200,), generator=gen), "test") for i in range(2)]
    run_correlate(lm, docs, root / "corr", P, [Chunk(P, P + 16), Chunk(P + 32, P + 48)], "sample:10",
                  n_resamples=50, config=CFG)
    run_nearfar(lm, docs, root / "nf", P, [0, 32], 16, ratio=0.1, seeds=2, config=CFG)
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
        for name, _ in TABLES[run["command"]]:
            assert (out / "tables" / f"{run['label']}__{name}.csv").read_bytes() == (src / f"{name}.csv").read_bytes()
            table = read_table(src / f"{name}.csv")
            records = run["tables"][name]
            assert len(records) == len(table)
            for rec, (_, row) in zip(records, table.iterrows()):
                for col in table.columns:
                    assert _same(rec[col], row[col]), (name, col, rec[col], row[col])


def test_markdown_tables_show_the_csv_text(runs):
    root, out, _ = runs
    md = (out / "report.md").read_text()
    text = pd.read_csv(root / "nf" / "nearfar_tests.csv", dtype=str, keep_default_na=False)
    for row in text.itertuples(index=False):
        assert "| " + " | ".join(row) + " |" in md
    summary = pd.read_csv(root / "corr" / "correlation_summary.csv", dtype=str, keep_default_na=False)
    first = summary[summary.scope == "mean"].iloc[0]
    assert f"| {first['rho_mean']} | {first['rho_std']} |" in md
    for fig in ("fi_vs_distance", "fi_vs_signals", "rho_heatmap", "rho_vs_distance"):
        assert fig in md
    assert all(p.exists() for p in runs[2])


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


def test_report_cli_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fi_toolkit.cli", "report", str(tmp_path), "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: '{tmp_path}' is not a finished fi correlate/nearfar result directory (no manifest.json)"]
    proc = subprocess.run([sys.executable, "-m", "fi_toolkit.cli", "report", str(tmp_path), "--format", "pdf"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: invalid --format")
