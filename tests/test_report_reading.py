"""fi report for a reader: every figure's axes fit their data, no table cell reads "nan", statistics that one
document cannot give say so, the first table of each run is its result, and settings leave the tables.

The axis check reads what matplotlib itself recorded of each axes (``dataLim``: the extent of everything drawn,
``viewLim``: the extent shown) and shares no code with the report's own scaling; a planted figure shows that
it fails on a flattened axis.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from fi_toolkit import Document, SignalConfig  # noqa: E402
from fi_toolkit.compress.decoder import signal_config_for  # noqa: E402
from fi_toolkit.evaluation import TextSetting, run_eval_text  # noqa: E402
from fi_toolkit.policies import make_policy  # noqa: E402
from fi_toolkit.probe.chunks import Chunk  # noqa: E402
from fi_toolkit.report import build_report, load_run  # noqa: E402
from fi_toolkit.report.export import _figures  # noqa: E402
from fi_toolkit.report.kinds.nearfar import nearfar_distance  # noqa: E402
from fi_toolkit.studies import CorrelateSettings, NearfarSettings, run_correlate, run_nearfar  # noqa: E402

CFG = SignalConfig(window=8)
P = 96
SPAN = 100  # an axis may show at most this many times its data's extent, and data spanning more needs a log axis
NEEDS = "n/a (needs ≥ 2 documents)"


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def _probe_dir(path, documents: int):
    """A probe result directory as ``fi probe`` writes it (manifest + fi.csv), numbers made up: the noise
    controls, two sets of 13 entries and two of 96, on two chunks."""
    path.mkdir()
    rows = []
    for d in range(documents):
        for chunk, start in (("96:112", 96), ("128:144", 128)):
            for selection, selector, removed, fi in (
                ("control:null", "control", 0, 0.0),
                ("control:reorder", "control", 0, 3e-10),
                ("entropy:remove=13", "entropy", 13, 0.002 + d * 1e-4),
                ("attention:remove=13", "attention", 13, 0.004 + d * 1e-4),
                ("random:remove=96@0", "random", 96, 0.2 + d * 1e-2),
                ("policy:snapkv@keep=0", "policy:snapkv", 96, 0.05 + d * 1e-2),
            ):
                rows.append(
                    {
                        "document": f"doc{d}",
                        "selection": selection,
                        "selector": selector,
                        "budget": "",
                        "seed": "",
                        "n_removed": float(removed),
                        "n_kept": float(P - removed),
                        "prefix": P,
                        "entropy_of": "produced",
                        "chunk": chunk,
                        "chunk_start": start,
                        "chunk_end": start + 16,
                        "distance_from_p": start - P,
                        "fi": fi * (1 if start == 96 else 0.5),
                        "below_noise_floor": selector == "control",
                    }
                )
    pd.DataFrame(rows).to_csv(path / "fi.csv", index=False)
    docs = [{"name": f"doc{d}", "sha256": "0", "tokens": 160} for d in range(documents)]
    manifest = {"command": "probe", "documents": docs, "prefix": P, "chunks": ["96:112", "128:144"], "selections": []}
    (path / "manifest.json").write_text(json.dumps({**manifest, "model": {"name": "tiny-llama"}}))
    return path


@pytest.fixture(scope="module")
def one_document(tiny, tmp_path_factory):
    """Runs of one document each (correlate, nearfar, eval text) and a made-up probe run of one document."""
    root = tmp_path_factory.mktemp("one-document")
    doc = [Document("only", "text", _ids(224, 5), "test")]
    correlate = CorrelateSettings([Chunk(P, P + 16), Chunk(P + 32, P + 48)], P, "sample:10", resamples=50, signals=CFG)
    run_correlate(tiny, doc, correlate, root / "corr")
    run_nearfar(tiny, doc, NearfarSettings(P, [0, 32], 16, budget="remove=0.1", seeds=2, signals=CFG), root / "nf")
    policies = [make_policy(n, budget=0.4, window=16) for n in ("snapkv", "streaming")]
    text = TextSetting(prompt=P, length=224, interval=32, free_tokens=4)
    run_eval_text(tiny, doc, root / "text", policies, text, signal_config_for(policies[0]), n_resamples=50)
    _probe_dir(root / "probe", 1)
    out = root / "report"
    build_report([root / n for n in ("corr", "nf", "text", "probe")], out, ["html", "md"])
    return root, out


def axis_faults(fig) -> list[str]:
    """Every linear axis of ``fig`` that shows more than SPAN times the extent of its data, or whose data are
    positive and span more than SPAN (two decades: a log axis is needed to see the small values)."""
    faults = []
    for i, ax in enumerate(fig.axes):
        if ax.get_label() == "<colorbar>" or not ax.has_data():
            continue
        for axis, (dlo, dhi), (vlo, vhi) in (
            ("x", ax.dataLim.intervalx, ax.viewLim.intervalx),
            ("y", ax.dataLim.intervaly, ax.viewLim.intervaly),
        ):
            if getattr(ax, f"get_{axis}scale")() != "linear" or not np.isfinite([dlo, dhi]).all():
                continue
            if dhi > dlo and abs(vhi - vlo) > SPAN * (dhi - dlo):
                faults.append(f"axes {i} {axis}: shows {vlo:g}..{vhi:g} for data {dlo:g}..{dhi:g}")
            if dlo > 0 and dhi / dlo > SPAN:
                faults.append(f"axes {i} {axis}: data {dlo:g}..{dhi:g} span over two decades on a linear axis")
    return faults


GAP = 4  # pixels (at the figure's dpi) around each text: two texts closer than 2 x GAP read as one


def overlapping_labels(fig) -> list[str]:
    """Pairs of texts of different axes (axis labels, titles, tick labels) whose drawn boxes overlap or run
    together (closer than 2 x GAP pixels)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = []
    for i, ax in enumerate(fig.axes):
        if ax.get_label() == "<colorbar>":
            continue
        ticks = [  # the tick labels drawn: those of ticks inside the axis's view
            t.label1
            for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim()))
            for t in axis.get_major_ticks()
            if min(lo, hi) <= t.get_loc() <= max(lo, hi)
        ]
        own = [ax.xaxis.label, ax.yaxis.label, ax.title, *ticks]
        texts += [
            (i, t.get_text(), t.get_window_extent(renderer).padded(GAP))
            for t in own
            if t.get_visible() and t.get_text()
        ]
    return [
        f"axes {a} {ta!r} overlaps axes {b} {tb!r}"
        for n, (a, ta, ba) in enumerate(texts)
        for b, tb, bb in texts[n + 1 :]
        if a != b and ba.overlaps(bb)
    ]


def test_the_overlap_check_fails_on_labels_that_run_together():
    fig, (a, b) = plt.subplots(1, 2, figsize=(6, 2))
    for ax in (a, b):
        ax.plot([0, 1], [0, 1])
        ax.set_xlabel("a long label that is wider than its own panel of the figure")
    assert overlapping_labels(fig) != []
    plt.close(fig)


def test_headroom_figure_labels_do_not_overlap():
    """Two chunks side by side (as notebooks/04_headroom.ipynb draws them): no label runs into the other panel."""
    from fi_toolkit.report.kinds.probe import headroom_figure

    rows = []
    for chunk in ("128:160", "224:256"):
        for sel, value in (
            ("policy:fi-oracle@keep=0.25", 1.0),
            ("policy:fi-oracle@keep=0.25:chunk=224:256", 0.88),
            ("policy:fi-oracle@keep=0.25:rounds=2", 1.0),
            ("policy:h2o@keep=0.25", 0.88),
            ("policy:infokv@keep=0.25", 0.06),
            ("policy:snapkv@keep=0.25", 0.03),
            ("policy:streaming@keep=0.25", -0.22),
        ):
            rows.append(
                {
                    "oracle": "policy:fi-oracle@keep=0.25",
                    "fit_chunk": chunk,
                    "chunk": chunk,
                    "selection": sel,
                    "selector": "oracle:fi-oracle" if "fi-oracle" in sel else "policy:h2o",
                    "n_removed": 96.0,
                    "n_documents": 2,
                    "headroom": value,
                    "ci_low": value - 0.12,
                    "ci_high": value + 0.1,
                }
            )
    fig = headroom_figure(pd.DataFrame(rows), "caption")
    assert overlapping_labels(fig) == []
    plt.close(fig)


def test_the_axis_check_fails_on_a_flattened_axis():
    fig, (a, b, c) = plt.subplots(1, 3)
    a.plot([0, 1, 2], [1.0, 1.2, 1300.0])  # one line 1,300x the others: flattened
    b.plot([0, 1], [1.0, 2.0])
    b.set_ylim(0, 1e4)  # an axis far wider than its data
    c.plot([0, 1, 2], [1.0, 1.2, 1300.0])
    c.set_yscale("log")  # the same data on a log axis: fine
    assert axis_faults(fig) == [
        "axes 0 y: data 1..1300 span over two decades on a linear axis",
        "axes 1 y: shows 0..10000 for data 1..2",
    ]
    plt.close(fig)


def test_a_ratio_spanning_decades_is_drawn_on_a_log_axis():
    """Sets that remove the attention sinks reach 1,300x random; the others stay near 1: the ratio axis is log."""
    rows = []
    for sinks, big in ((4, 1.0), (0, 1300.0)):
        for selector, ratio in (("attention", big), ("entropy", 1.2), ("random", 1.0)):
            for d in (0, 64):
                rows.append(
                    {
                        "document": "a",
                        "sinks": sinks,
                        "selector": selector,
                        "distance_from_p": d,
                        "chunk": f"{96 + d}:{112 + d}",
                        "fi": 0.01 * ratio,
                        "fi_rel_random": ratio,
                        "fi_share_near": 1.0 if d == 0 else 0.5,
                    }
                )
    fig = nearfar_distance(pd.DataFrame(rows), "caption")
    assert axis_faults(fig) == []
    assert fig.axes[3].get_yscale() == "log"  # FI / random FI without sink protection (row 2, column 2)
    assert fig.axes[2].get_yscale() == "linear"  # with protection: 1.0 .. 1.2
    plt.close(fig)


def test_every_report_figure_fits_its_data(one_document):
    root, _ = one_document
    drawn = 0
    for name in ("corr", "nf", "text"):
        for fig_name, fig in _figures(load_run(root / name)):
            assert axis_faults(fig) == [], (name, fig_name)
            assert overlapping_labels(fig) == [], (name, fig_name)
            assert fig.get_suptitle(), (name, fig_name)  # titled by what it shows
            plt.close(fig)
            drawn += 1
    assert drawn >= 6


class Cells(HTMLParser):
    """The text of every table cell, per table."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _without_images(text: str) -> str:
    return re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", text)


def test_no_cell_reads_nan_and_one_document_says_why(one_document):
    _, out = one_document
    page = (out / "report.html").read_text()
    cells = Cells()
    cells.feed(page)
    every = [c for t in cells.tables for c in t]
    assert len(cells.tables) >= 8 and len(every) > 200
    assert not [c for c in every if re.search(r"\bnan\b", c, re.I)]
    for text in (_without_images(page), (out / "report.md").read_text()):
        assert not re.search(r"\bnan\b", text, re.I)
        assert NEEDS in text  # the paired tests and intervals of the one-document runs
    md = (out / "report.md").read_text()
    assert "one-sided Wilcoxon p = n/a (needs ≥ 2 documents)" in md
    assert "Wilcoxon statistic, Wilcoxon p, ttest log ratio p: n/a (needs ≥ 2 documents)" in md


def test_each_run_leads_with_its_result(one_document):
    """The first table after a run's heading is its answer, titled with its unit; the result column is among
    the first columns, and what is the same in every row is said once above the detail tables."""
    _, out = one_document
    page = (out / "report.html").read_text()
    parts = page.split("<h2>")[1:]
    assert len(parts) == 4
    for part in parts:
        first = part.split("<table>", 1)[0]
        assert "<section class='lead'><h3>Result: " in first, part[:200]
    probe = next(p for p in parts if "(fi probe)" in p)
    lead = probe.split("<table>", 1)[1].split("</thead>", 1)[0]
    assert re.findall(r"<th[^>]*>([^<]*)</th>", lead) == ["removed", "selection", "FI on 96:112", "FI on 128:144"]
    assert "FI (nats) of removing each token set" in probe and "noise floor" in probe
    detail = probe.split("fi.csv</span></h3>", 1)[1]
    assert "<b>Same in every row:</b> document: <b>doc0</b>; prefix: <b>96</b>; entropy of: <b>produced</b>" in detail
    head = re.findall(r"<th[^>]*>([^<]*)</th>", detail.split("</thead>", 1)[0])
    assert head.index("FI") <= 3 and "prefix" not in head and "chunk start" not in head
    assert ">yes<" in detail and ">True<" not in detail and ">Tru<" not in detail


def test_probe_headline_compares_sets_of_equal_size(tmp_path):
    from fi_toolkit.report.kinds import kind_of

    run = _probe_dir(tmp_path / "probe", 2)
    lines = kind_of("probe").headline(load_run(run)["tables"])
    assert (
        "chunk 96:112, 13 removed: lowest mean FI entropy:remove=13 (0.00205 nats), highest attention:remove=13 "
        "(0.00405 nats)" in lines
    )
    assert "chunk 96:112, 96 removed: lowest mean FI policy:snapkv@keep=0 (0.055 nats), highest random:remove=96 " \
        "(1 seed) (0.205 nats)" in lines  # fmt: skip
    assert "chunk 96:112, 96 removed: baseline random:remove=96 (1 seed) 0.205 nats (seeds 0.205 .. 0.205); no set " \
        "lies inside its spread" in lines  # fmt: skip
    for line in lines:  # a line names sets of one size only
        assert len(set(re.findall(r"(\d+) removed", line))) == 1, line


def test_field_figures_fit_their_data_with_one_document_and_a_method_far_below_random():
    """The field map's bars stop at -1 (random positions that evict the sinks reach -10): the axis still fits
    what is drawn, no label runs into the next panel, and one document (no CI) draws without an error bar."""
    from fi_toolkit.report.kinds.field import fi_vs_replay, field_headroom

    rows = []
    for budget in ("keep=0.25", "keep=0.5"):
        for method, kind, near, far in (
            ("fi-oracle", "anchor", 1.0, 1.0),
            ("random-positions", "anchor", 0.0, 0.0),
            ("kvpress:ExpectedAttentionPress", "press", 0.71, 0.57),
            ("h2o", "policy", 0.48, 0.32),
            ("random", "policy", -3.3, -11.7),
        ):
            rows.append(
                {
                    "method": method,
                    "kind": kind,
                    "budget": budget,
                    "fi_near": 0.2 * (1.5 - near / 4),
                    "headroom_near": near,
                    "headroom_low_near": np.nan,
                    "headroom_high_near": np.nan,
                    "fi_far": 0.05 * (1.5 - far / 12),
                    "headroom_far": far,
                    "headroom_low_far": np.nan,
                    "headroom_high_far": np.nan,
                    "replay_kl": np.nan if kind == "anchor" else 0.1 * (2 - near),
                }
            )
    board = pd.DataFrame(rows)
    for fig in (field_headroom(board, "caption"), fi_vs_replay(board, "caption")):
        assert fig is not None
        assert axis_faults(fig) == []
        assert overlapping_labels(fig) == []
        assert fig.get_suptitle() or fig.axes[0].get_title()
        plt.close(fig)
    fig = field_headroom(board, "caption")
    written = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"-3.3 ◀", "-11.7 ◀"} <= written  # the values past the axis's end are written on their bars
    plt.close(fig)
