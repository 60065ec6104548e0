"""fi view (issue 21, part 4): the page's numbers are the keep maps' and the estimate's; text stays text."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
import torch

from fi_toolkit import Document, LoadedModel, SignalConfig
from fi_toolkit.policies import parse_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.probe.estimator import fisher_fi
from fi_toolkit.report.token_page import read_view_meta, render, view_data, write_view
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
    assert parser.external == []  # no network at view time
    assert _payload(html_text)["tokens"].count(EVIL) >= 1  # the token text arrives as text
    out = write_view(tmp_path / "v.html", data)
    assert read_view_meta(out) == {"document": data.document}
    assert [p.name for p in tmp_path.iterdir()] == ["v.html"]  # atomic: no temporary file left
    (tmp_path / "other.html").write_text("<html><meta name='generator' content='other'></html>")
    assert read_view_meta(tmp_path / "other.html") is None


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
