"""fi view: the page's numbers are the keep maps', the estimate's and the policies' own scores; text stays text;
its colours stay apart under a simulated deuteranopia."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser

import pytest
import torch

from fi_toolkit import Document, LoadedModel, SignalConfig
from fi_toolkit.policies import parse_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.report.token_page import page_json, read_view_meta, render, view_data, write_view
from fi_toolkit.signals.trace import trace_prefix

CFG = SignalConfig(window=8)
P = 96
EVIL = "</script><script>alert('x')</script>"


class Tokenizer:
    """Decodes every id to a word; some to a closing script tag (as a document's text could hold)."""

    def decode(self, ids):
        i = int(ids[0])
        return EVIL if i % 7 == 0 else (f" w{i}\n" if i % 5 == 0 else f" w{i}")


@pytest.fixture(scope="module")
def page(tiny):
    lm = LoadedModel(tiny.model, Tokenizer(), "tiny-llama", tiny.device, tiny.dtype)
    doc = Document(
        f"doc {EVIL}", "text", torch.randint(0, 256, (160,), generator=torch.Generator().manual_seed(4)), "test"
    )
    trace = trace_prefix(lm.model, doc.ids, P, CFG)
    policies = [parse_policy(name, "keep=0.5", CFG.window) for name in ("infokv", "snapkv", "pyramidkv")]
    data = view_data(lm, doc, trace, policies, Chunk(P, P + 32), samples=4, seed=1)
    return lm, doc, trace, policies, data, render(data)


def _payload(html_text: str) -> dict:
    m = re.search(r"<script type='application/json' id='fi-data'>(.*?)</script>", html_text, re.S)
    return json.loads(m.group(1))


def test_evicted_share_is_the_keep_maps(page):
    """Per token: the share of (layer, KV head) pairs whose kept positions leave it out, counted here
    from the keep map's rows with plain tensor ops."""
    _, _, trace, policies, _, html_text = page
    shown = _payload(html_text)
    assert shown["pairs"] == trace.num_layers * trace.num_kv_heads
    for policy in policies:
        keep_map = policy.keep_map(trace)
        evicted = torch.zeros(P)
        for layer in keep_map.keep:  # [Hkv, k_l]
            for row in layer:
                evicted += ~torch.isin(torch.arange(P), row)
        share = evicted / (len(keep_map.keep) * keep_map.keep[0].shape[0])
        page_share = torch.tensor(shown["evicted"][policy.label], dtype=torch.float64) / shown["pairs"]
        assert torch.allclose(page_share, share.double(), atol=0, rtol=0), policy.label
        assert 0 < float(share.mean()) < 1
    assert shown["evicted"]["pyramidkv@keep=0.5"] != shown["evicted"]["snapkv@keep=0.5"]


def test_policy_scores_budget_and_noise_floor(page):
    """Each policy's score on the page is the mean over layers and KV heads of what it ranks by, computed here
    from the trace (SnapKV and PyramidKV: window attention ``A``); the summary names the budget, and the
    noise floor is the controls' (float32 rounding: far below any FI)."""
    _, _, trace, _, data, html_text = page
    shown = _payload(html_text)
    attention = trace.attention.double().mean(dim=(0, 1))  # [L, Hkv, p] -> [p]
    for label in ("snapkv@keep=0.5", "pyramidkv@keep=0.5"):
        score = torch.tensor(shown["scores"][label], dtype=torch.float64)
        assert torch.allclose(score, attention, rtol=5e-4, atol=1e-12), label
    assert set(shown["scores"]) == {"infokv@keep=0.5", "snapkv@keep=0.5", "pyramidkv@keep=0.5"}
    assert data.settings["budgets"] == ["keep=0.5"]
    assert 0 <= data.settings["noise_floor"] < 1e-6
    fi = torch.tensor(shown["values"]["FI"], dtype=torch.float64)
    assert fi.max() > 1e3 * data.settings["noise_floor"]
    summary = html_text.split("<table id='summary'>", 1)[1].split("</table>", 1)[0]
    assert "Budget keep=0.5" in summary and "Noise floor of FI on 96:128" in summary and "lower is better" in summary
    assert [e["label"] for e in shown["policies"]] == ["infokv@keep=0.5", "snapkv@keep=0.5", "pyramidkv@keep=0.5"]


def test_colours_stay_apart_under_deuteranopia():
    """The shade at ranks 0, 1/4, 1/2, 3/4, 1 and the policies' mark colours, passed through the Machado et al.
    (2009) deuteranopia simulation (colour-science): every pair of marks, and each shade step, differ by CIEDE2000
    >= 10 (a clearly visible difference), and the shade's lightness falls monotonically (it reads as an order)."""
    import numpy as np

    from fi_toolkit.report.token_page import MARKS, SHADE

    colour = pytest.importorskip("colour", reason="colour-science (the dev extra) simulates colour vision")

    def deuteranope_lab(hexes):
        srgb = np.array([[int(h[i : i + 2], 16) / 255 for i in (1, 3, 5)] for h in hexes])
        linear = colour.models.eotf_sRGB(srgb)
        seen = np.clip(linear @ colour.blindness.matrix_cvd_Machado2009("Deuteranomaly", 1.0).T, 0, 1)
        xyz = colour.RGB_to_XYZ(seen, colour.RGB_COLOURSPACES["sRGB"], apply_cctf_decoding=False)
        return colour.XYZ_to_Lab(xyz)

    def at(q):  # the page's interpolation between the stops, in sRGB
        stops = np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in SHADE], dtype=float)
        t = q * (len(stops) - 1)
        j = min(len(stops) - 2, int(t))
        rgb = np.round(stops[j] + (stops[j + 1] - stops[j]) * (t - j)).astype(int)
        return "#" + "".join(f"{c:02x}" for c in rgb)

    shade = deuteranope_lab([at(q) for q in (0, 0.25, 0.5, 0.75, 1)])
    steps = [float(colour.delta_E(shade[i], shade[i + 1], method="CIE 2000")) for i in range(4)]
    assert min(steps) >= 10, steps
    assert all(np.diff(shade[:, 0]) < 0)  # lightness L* falls from rank 0 to rank 1
    marks = deuteranope_lab(MARKS[:4])  # the first four policies on a page
    pairs = [float(colour.delta_E(marks[i], marks[j], method="CIE 2000")) for i in range(4) for j in range(i + 1, 4)]
    assert min(pairs) >= 10, pairs
    old = deuteranope_lab(["#D62728", "#E6550D"])  # the former red mark on the former orange shade
    assert float(colour.delta_E(old[0], old[1], method="CIE 2000")) < 10  # ...which this check would have failed


def test_values_are_the_estimate_and_the_signals(page):
    lm, doc, trace, _, _, html_text = page
    shown = _payload(html_text)
    est = fisher_fi(lm.model, trace, doc.ids, [Chunk(P, P + 32)], 4, 1).fi[:, 0]
    fi = torch.tensor(shown["values"]["FI"], dtype=torch.float64)
    assert len(shown["tokens"]) == P and fi.shape == (P,)
    assert torch.allclose(fi, est, rtol=5e-4, atol=0)  # shown with 4 significant digits
    h = torch.tensor(shown["values"]["H"], dtype=torch.float64)
    assert torch.allclose(h, trace.entropy.double(), rtol=5e-4, atol=1e-12)
    s = shown["values"]["S"]
    assert all(v is None for v in s[trace.scored :]) and all(v is not None for v in s[: trace.scored])
    assert shown["tokens"][:3] == [Tokenizer().decode([int(i)]) for i in doc.ids[:3]]


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.external = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key):
                self.external.append(a[key])


def test_page_is_standalone_and_text_stays_text(page, tmp_path):
    _, _, _, _, data, html_text = page
    parser = Tags()
    parser.feed(html_text)
    assert parser.tags.count("script") == 2  # the data block and the page's own script, nothing injected
    assert parser.external == []  # no network at view time, and no link back to a report it is not in
    assert _payload(html_text)["tokens"].count(EVIL) >= 1  # the token text arrives as text
    out = write_view(tmp_path / "v.html", data)
    assert read_view_meta(out) == {"document": data.document}
    assert [p.name for p in tmp_path.iterdir()] == ["v.html"]  # atomic: no temporary file left
    (tmp_path / "other.html").write_text("<html><meta name='generator' content='other'></html>")
    assert read_view_meta(tmp_path / "other.html") is None


SCIENTIFIC = re.compile(r"^-?\d\.(\d+)e[+-]\d{2}$")
DECIMAL = re.compile(r"^-?\d+(?:\.(\d+))?$")


def notations(labels: list[str]) -> set[tuple[str, int]]:
    """The notations of tick labels, each with its digits after the point ('0' goes with any): one for a
    colour bar that reads as one scale."""
    found = set()
    for text in labels:
        if text != "0":
            m = SCIENTIFIC.match(text) or DECIMAL.match(text)
            kind = "scientific" if SCIENTIFIC.match(text) else "decimal" if m else text
            found.add((kind, len(m.group(1) or "") if m else 0))
    return found


def test_the_notation_check_fails_on_a_mixed_colour_bar():
    assert len(notations(["4.28e-7", "3.1e-5", "0.01083"])) > 1  # the former bar: e-notation beside decimals
    assert len(notations(["0.5", "0.25", "0.125"])) > 1  # one notation, but not one precision
    assert len(notations(["4.280e-07", "0", "1.083e-02"])) == 1


def test_colour_bar_ticks_read_in_one_notation(page):
    """Every shading's ticks: the smallest, the quartiles and the largest of its values, in one notation, even
    where the values span decades (estimated FI from 4.28e-7 to 0.01083 nats)."""
    shown = _payload(page[-1])
    series = {**shown["values"], **{f"score:{k}": v for k, v in shown["scores"].items()}}
    assert set(shown["ticks"]) == set(series)
    for key, values in series.items():
        ticks, defined = shown["ticks"][key], sorted(v for v in values if v is not None)
        assert len(ticks) == 5 and len(notations(ticks)) == 1, (key, ticks)
        assert float(ticks[0]) == pytest.approx(defined[0], rel=5e-4, abs=1e-12), key
        assert float(ticks[-1]) == pytest.approx(defined[-1], rel=5e-4, abs=1e-12), key
    fi = torch.tensor([4.28e-7, 1e-5, 2e-4, 3e-3, 0.01083])
    spanning = dataclasses.replace(page[4], tokens=list("abcde"), values={"FI": fi}, evicted={}, scores={})
    assert page_json(spanning)["ticks"]["FI"] == ["4.280e-07", "1.000e-05", "2.000e-04", "3.000e-03", "1.083e-02"]


@pytest.mark.smollm
def test_fi_view_on_the_embedded_model(tmp_path, capsys):
    """The command end to end: the page holds the prefix's tokens as the tokenizer decodes them."""
    from cli_runner import run_cli

    from fi_toolkit.documents import load_document
    from fi_toolkit.model.loading import load_model

    out = tmp_path / "alice.html"
    code, _, err = run_cli(
        [
            "view",
            "alice",
            "--prefix",
            "128",
            "--chunk",
            "128:192",
            "--samples",
            "2",
            "--window",
            "8",
            "--policy",
            "infokv,snapkv",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0, err
    shown = _payload(out.read_text())
    lm = load_model("smollm2-135m", device="cpu", dtype="float32")
    ids = load_document("alice", lm.tokenizer, max_tokens=192).ids
    assert shown["tokens"] == [lm.tokenizer.decode([int(i)]) for i in ids[:128]]
    assert set(shown["evicted"]) == {"infokv@keep=0.25", "snapkv@keep=0.25"}
    assert shown["pairs"] == lm.model.config.num_hidden_layers * lm.model.config.num_key_value_heads
    assert read_view_meta(out) == {"document": "alice"}


@pytest.mark.smollm
def test_run_view_writes_the_page_fi_view_writes(tmp_path, capsys):
    """Python's ViewSettings + run_view and the command line give the same page (all but the estimate's time)."""
    from cli_runner import run_cli

    from fi_toolkit import SignalConfig, ViewSettings, load_document, load_model, run_view

    args = ["--prefix", "128", "--chunk", "128:192", "--samples", "2", "--window", "8", "--budget", "keep=0.5"]
    code, _, err = run_cli(
        ["view", "alice", *args, "--policy", "h2o,snapkv", "--out", str(tmp_path / "cli.html")], capsys
    )
    assert code == 0, err
    lm = load_model()
    settings = ViewSettings(
        policies="h2o,snapkv", budget="keep=0.5", prefix=128, chunk="128:192", samples=2, signals=SignalConfig(window=8)
    )
    data = run_view(lm, load_document("alice", lm.tokenizer, max_tokens=192), settings, tmp_path / "py.html")
    shown = [_payload((tmp_path / f).read_text()) for f in ("py.html", "cli.html")]
    for page in shown:
        assert page["settings"].pop("estimate_seconds") > 0  # the one value that is a clock's
    assert shown[0] == shown[1]
    assert [p.name for p in settings.policies] == ["h2o", "snapkv"] and data.prefix == 128


def test_view_settings_refuse_in_one_line_naming_the_parameter():
    from fi_toolkit.errors import FIError
    from fi_toolkit.report.view_settings import ViewSettings

    for kwargs, parameter, words in [
        (dict(policies="fi-oracle"), "policies", "compression-time methods evict"),
        (dict(budget="keep=nan"), "budget", "budget is invalid"),
        (dict(budget="keep=1.0"), "policies", "nothing is evicted"),
        (dict(prefix=8), "prefix", "leaves nothing to score"),
        (dict(seed=-1), "seed", "seed must be >= 0"),
        (dict(samples=0), "samples", "samples must be >= 1"),
        (dict(chunk="512:768"), "chunks", "512:768"),
    ]:
        with pytest.raises(FIError) as caught:
            ViewSettings(**kwargs)
        assert words in str(caught.value) and "\n" not in str(caught.value), (kwargs, caught.value)
        assert parameter in caught.value.parameters.values() or parameter == "chunks", (kwargs, caught.value.parameters)
