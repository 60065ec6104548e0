"""The pages in a real headless browser: Debian's Chromium driven through its own
DevTools protocol over a pipe (``--remote-debugging-pipe``: JSON messages ended by NUL on fds 3 and 4),
so no websocket, no Playwright and no network. ``make browser`` installs Chromium; without a binary
these tests are skipped with the reason.

Set ``FI_SCREENSHOTS=DIR`` to keep the screenshots (docs/images/ holds the ones in the guides).
"""

from __future__ import annotations

import base64
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fi_toolkit import Document, LoadedModel, SignalConfig
from fi_toolkit.policies import parse_policy
from fi_toolkit.probe.chunks import Chunk
from fi_toolkit.report.token_page import view_data, write_view
from fi_toolkit.signals.trace import trace_prefix

BINARY = next(
    (
        b
        for b in (
            os.environ.get("FI_CHROMIUM"),
            shutil.which("chromium"),
            shutil.which("chromium-browser"),
            shutil.which("google-chrome"),
        )
        if b
    ),
    None,
)
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        BINARY is None,
        reason="no chromium binary on PATH: run `make browser` (apt-get install chromium) or set FI_CHROMIUM",
    ),
]
WORDS = "the of and a to in is you that it he was for on are as with his they I at be this have from".split()


class Chromium:
    """Headless Chromium and one page, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900):
        cmd_r, self._cmd_w = os.pipe()  # we write commands, Chromium reads fd 3
        self._out_r, out_w = os.pipe()  # Chromium writes fd 4, we read

        def fds():  # in the child: the two pipe ends on 3 and 4 (dup first: either may already be 3 or 4)
            a, b = os.dup(cmd_r), os.dup(out_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [
                BINARY,
                "--headless",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-dev-shm-usage",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            preexec_fn=fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fds: 3, 4 stay
        os.close(cmd_r)
        os.close(out_w)
        self._buf, self._id, self.events = b"", 0, []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            self.session,
        )
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", {}, self.session)

    def _message(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._out_r], [], [], left)[0]:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            answer = self._message(timeout)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def page(self, method: str, params: dict | None = None) -> dict:
        return self.call(method, params, self.session)

    def js(self, expression: str):
        result = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path: Path, timeout: float = 60) -> float:
        """Load a file and wait until the page says it is ready; returns the seconds it took."""
        t0 = time.perf_counter()
        self.page("Page.navigate", {"url": path.resolve().as_uri()})
        while self.js("document.readyState") != "complete" or self.js("document.body.dataset.ready") is None:
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{path} was not ready within {timeout} s")
            time.sleep(0.02)
        return time.perf_counter() - t0

    def open_plain(self, path: Path, timeout: float = 30) -> None:
        """Load a file that has no ready flag of its own (a report, the docs) and wait for its load event."""
        self.page("Page.navigate", {"url": path.resolve().as_uri()})
        t0 = time.perf_counter()
        while self.js("document.readyState") != "complete":
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"{path} did not load within {timeout} s")
            time.sleep(0.02)
        time.sleep(0.3)  # scripts run on load (KaTeX, search) finish

    def errors(self) -> list[str]:
        """Console errors and uncaught exceptions seen so far."""
        bad = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                bad.append(str(p["exceptionDetails"]))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                bad.append(str(p.get("args")))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                bad.append(p["entry"].get("text", ""))
        return bad

    def center(self, selector: str) -> tuple[float, float]:
        self.js(f"document.querySelector({json.dumps(selector)}).scrollIntoView({{block: 'center'}})")
        r = self.js(
            f"(() => {{const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            "return [r.x + r.width / 2, r.y + r.height / 2];})()"
        )
        return r[0], r[1]

    def mouse(self, kind: str, x: float, y: float) -> None:
        params = {"type": kind, "x": x, "y": y, "button": "left" if kind != "mouseMoved" else "none"}
        if kind != "mouseMoved":
            params["clickCount"] = 1
        self.page("Input.dispatchMouseEvent", params)

    def click(self, selector: str) -> None:
        x, y = self.center(selector)
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def screenshot(self, path: Path, full: bool = False) -> None:
        params = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
        path.write_bytes(base64.b64decode(self.page("Page.captureScreenshot", params)["data"]))

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def _shots() -> Path | None:
    d = os.environ.get("FI_SCREENSHOTS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
    return Path(d) if d else None


class Words:
    def decode(self, ids):
        i = int(ids[0])
        return ("\n" if i % 29 == 0 else " ") + WORDS[i % len(WORDS)]


class Whitespace:
    """Words, and tokens that are only a newline, two newlines, or a space (what a pointer most often misses)."""

    def decode(self, ids):
        i = int(ids[0])
        return {0: "\n", 1: "\n\n", 2: " "}.get(i % 9, " " + WORDS[i % len(WORDS)])


def _page(tiny, tmp: Path, prefix: int, chunk: int = 64, name: str = "view.html", tokenizer=None) -> Path:
    """A page of the tiny model on ``prefix`` tokens (words as token text), infokv and snapkv at keep=0.25."""
    cfg = SignalConfig(window=8, prefill_chunk=1024)
    lm = LoadedModel(tiny.model, tokenizer or Words(), "tiny-llama", tiny.device, tiny.dtype)
    ids = torch.randint(0, 256, (prefix + chunk,), generator=torch.Generator().manual_seed(2))
    doc = Document("words", "text", ids, "test")
    trace = trace_prefix(lm.model, ids, prefix, cfg)
    policies = [parse_policy(n, "keep=0.25", cfg.window) for n in ("infokv", "snapkv")]
    return write_view(tmp / name, view_data(lm, doc, trace, policies, Chunk(prefix, prefix + chunk), samples=2))


DATA = "JSON.parse(document.getElementById('fi-data').textContent)"
MARKS = "Array.from(document.querySelectorAll('#tokens span'), s => s.style.boxShadow)"


def test_view_page_in_chromium(browser, tiny, tmp_path):
    page = _page(tiny, tmp_path, 256)
    browser.events.clear()
    browser.open(page)
    assert browser.errors() == []  # (a) no console error, no exception
    assert browser.js("document.querySelectorAll('#tokens span').length") == 256  # (b) every prefix token
    data = browser.js(DATA)
    label = browser.js("document.getElementById('cbar-label').textContent")  # (c) the colour bar says what it shows
    assert label.startswith("estimated FI on 256:320 (nats): lower = ") and "safer to evict" in label
    ticks = browser.js("Array.from(document.querySelectorAll('#ticks span'), t => t.textContent)")
    fi = sorted(v for v in data["values"]["FI"] if v is not None)
    assert len(ticks) == 5 and float(ticks[0]) == pytest.approx(fi[0], rel=1e-3)
    assert float(ticks[-1]) == pytest.approx(fi[-1], rel=1e-3)  # its ends are the smallest and largest FI
    colors = "Array.from(document.querySelectorAll('#tokens span'), s => s.style.backgroundColor).join('|')"
    before = browser.js(colors)
    assert browser.js("document.getElementById('tokens').dataset.shade") == "FI"
    browser.click("input[name=shade][value=H]")  # a real click on the toggle changes the shading and the bar
    assert browser.js("document.getElementById('tokens').dataset.shade") == "H"
    after = browser.js(colors)
    assert after != before and after.count("rgb(") == 256
    assert browser.js("document.getElementById('cbar-label').textContent").startswith("H: top-k entropy")
    # (d) a policy's strips appear only where it evicts the token from at least half of the pairs
    pairs, infokv, snapkv = data["pairs"], data["evicted"]["infokv@keep=0.25"], data["evicted"]["snapkv@keep=0.25"]
    marks = browser.js(MARKS)
    assert [bool(m) for m in marks] == [c / pairs >= 0.5 for c in infokv]  # infokv's toggle is on at load
    assert 0 < sum(map(bool, marks)) < 256
    browser.click("input[name=evict][value='snapkv@keep=0.25']")  # one toggle per policy: both on now
    strips = [m.count("px 0px") for m in browser.js(MARKS)]
    assert strips == [(a / pairs >= 0.5) + (b / pairs >= 0.5) for a, b in zip(infokv, snapkv)]
    browser.click("input[name=evict][value='infokv@keep=0.25']")  # infokv off: snapkv's alone
    assert [bool(m) for m in browser.js(MARKS)] == [c / pairs >= 0.5 for c in snapkv]
    x, y = browser.center("#tokens span[data-i='40']")  # (e) hover a token and read its numbers
    browser.mouse("mouseMoved", x, y)
    info = browser.js("document.getElementById('info').textContent")
    assert info.startswith(f"#40 {json.dumps(data['tokens'][40])} · FI ")
    assert f"snapkv@keep=0.25: evicted from {round(100 * snapkv[40] / pairs)} %, score " in info  # its own score
    h = data["values"]["H"][40]
    assert f"H {float(f'{h:.4g}'):g}" in info or f"H {h:.2e}" in info
    title = browser.js("document.querySelector('button.policy').title")  # (f) a policy's name leads to its score
    assert title.startswith("infokv@keep=0.25: evicts 75.0% of the") and "lower is better" in title
    browser.click("button.policy[data-shade='score:snapkv@keep=0.25']")
    assert browser.js("document.getElementById('tokens').dataset.shade") == "score:snapkv@keep=0.25"
    assert browser.errors() == []
    if _shots():
        browser.click("input[name=shade][value=FI]")
        browser.screenshot(_shots() / "view.png")


def test_every_token_is_the_one_under_the_pointer(browser, tiny, tmp_path):
    """Newlines, double newlines and spaces included: at the centre of each token's first box the page finds
    that token, and a real pointer there shows its number; beyond a line's end it shows none."""
    page = _page(tiny, tmp_path, 192, tokenizer=Whitespace(), name="spaces.html")
    browser.open(page)
    tokens = browser.js(DATA)["tokens"]
    assert {"\n", "\n\n", " "} <= set(tokens)
    hit = """(i => {const s = document.querySelector(`#tokens span[data-i="${i}"]`);
      s.scrollIntoView({block: 'center'}); const r = Array.from(s.getClientRects()).find(r => r.width > 0);
      const x = r.x + r.width / 2, y = r.y + r.height / 2;
      return [x, y, document.elementFromPoint(x, y).dataset.i];})"""
    for i, text in enumerate(tokens):
        x, y, found = browser.js(f"({hit})({i})")
        assert found == str(i), (i, text)
        if not text.strip() or i % 16 == 0:  # a real pointer on every whitespace token and on some words
            browser.mouse("mouseMoved", x, y)
            assert browser.js("document.getElementById('info').textContent").startswith(f"#{i} "), (i, text)
    newline = tokens.index("\n")
    x, y, _ = browser.js(f"({hit})({newline})")
    right = browser.js("document.getElementById('tokens').getBoundingClientRect().right")
    browser.mouse("mouseMoved", right - 2, y)  # past the newline's mark, still inside the text box
    assert browser.js("document.getElementById('info').textContent") == "hover a token to read its numbers"
    assert browser.errors() == []


def test_view_page_of_8192_tokens_stays_responsive(browser, tmp_path):
    """The size and load time docs/guides/view.md states (written to FI_SCREENSHOTS/view_8192.json)."""
    from fi_toolkit.model.loading import tiny_model

    long = tiny_model(seed=0)
    long.model.config.max_position_embeddings = 8192 + 64  # RoPE has no table to outgrow: a longer context
    page = _page(long, tmp_path, 8192)
    browser.events.clear()
    seconds = browser.open(page)
    assert browser.errors() == []
    assert browser.js("document.querySelectorAll('#tokens span').length") == 8192
    t0 = time.perf_counter()
    browser.click("input[name=shade][value=A]")
    assert browser.js("document.getElementById('tokens').dataset.shade") == "A"
    toggle = time.perf_counter() - t0
    size = page.stat().st_size
    ready = browser.js("window.fiReadyMs") / 1000
    assert seconds < 10 and toggle < 2
    if _shots():
        (_shots() / "view_8192.json").write_text(
            json.dumps(
                {
                    "tokens": 8192,
                    "bytes": size,
                    "load_seconds": round(seconds, 3),
                    "script_ready_seconds": round(ready, 3),
                    "toggle_seconds": round(toggle, 3),
                    "chromium": browser.call("Browser.getVersion")["product"],
                },
                indent=1,
            )
        )


@pytest.fixture(scope="module")
def report(tiny, tmp_path_factory):
    from fi_toolkit.report import build_report
    from fi_toolkit.studies import CorrelateSettings, NearfarSettings, run_correlate, run_nearfar

    root = tmp_path_factory.mktemp("browser-report")
    cfg = SignalConfig(window=8)
    docs = [
        Document(
            f"document number {i} with a long name",
            "text",
            torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(i)),
            "test",
        )
        for i in range(2)
    ]
    run_correlate(
        tiny,
        docs,
        CorrelateSettings([Chunk(96, 112), Chunk(128, 144)], 96, candidates="sample:10", resamples=50, signals=cfg),
        root / "corr",
    )
    run_nearfar(tiny, docs, NearfarSettings(96, [0, 32], 16, budget="remove=0.1", seeds=2, signals=cfg), root / "nf")
    build_report([root / "corr", root / "nf"], root / "report", ["html"])
    return root / "report" / "report.html"


@pytest.mark.parametrize("width", [1280, 700])
def test_report_tables_fit_their_container(browser, report, width):
    """(e) No table makes the page wider than the window: each sits in a container that scrolls."""
    browser.page(
        "Emulation.setDeviceMetricsOverride", {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    )
    browser.events.clear()
    browser.page("Page.navigate", {"url": report.resolve().as_uri()})
    t0 = time.perf_counter()
    while browser.js("document.readyState") != "complete":
        assert time.perf_counter() - t0 < 30
        time.sleep(0.02)
    assert browser.errors() == []
    check = """(() => {
      const out = [];
      for (const t of document.querySelectorAll('table')) {
        const box = t.parentElement, style = getComputedStyle(box);
        const body = document.body.getBoundingClientRect();
        out.push({wrapped: box.classList.contains('table-wrap') && style.overflowX === 'auto',
                  boxFits: box.getBoundingClientRect().right <= body.right + 1,
                  scrolls: t.scrollWidth <= box.clientWidth || box.scrollWidth > box.clientWidth});
      }
      return {tables: out, pageWidth: document.documentElement.scrollWidth, window: window.innerWidth};
    })()"""
    found = browser.js(check)
    assert len(found["tables"]) >= 5
    assert all(t["wrapped"] and t["boxFits"] and t["scrolls"] for t in found["tables"]), found
    assert found["pageWidth"] <= found["window"]  # no sideways scrolling of the page itself
    if _shots() and width == 1280:
        browser.screenshot(_shots() / "report.png")
    browser.page(
        "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    )


def test_report_leads_with_results_a_reader_can_read(browser, report):
    """What a reader sees first in each run's part is its result table; every figure is titled; no cell says nan."""
    browser.open_plain(report)
    seen = browser.js(
        """(() => Array.from(document.querySelectorAll('h2')).map(h => {
          let e = h.nextElementSibling;
          while (e && !e.querySelector('table') && e.tagName !== 'H2') e = e.nextElementSibling;
          return {run: h.textContent, first: e ? e.className : null,
                  title: e && e.querySelector('h3') ? e.querySelector('h3').textContent : null};
        }))()"""
    )
    assert len(seen) == 2 and all(s["first"] == "lead" and s["title"].startswith("Result: ") for s in seen), seen
    captions = browser.js(
        "Array.from(document.querySelectorAll('figure'), f => f.querySelector('figcaption').textContent)"
    )
    assert len(captions) >= 5 and all(c and not c.replace(" ", "").isidentifier() for c in captions)
    cells = browser.js("Array.from(document.querySelectorAll('td'), td => td.textContent)")
    assert len(cells) > 100 and not [c for c in cells if c.strip().lower() == "nan" or "nan " in c.lower()]
    assert browser.errors() == []


@pytest.fixture(scope="module")
def honest_report(tiny, tmp_path_factory):
    """A probe run (random seeds beside two selectors, two budgets) and a near/far run, four documents each (a
    bootstrap interval needs four), reported together."""
    from fi_toolkit.report import build_report
    from fi_toolkit.runs.settings import RunSettings
    from fi_toolkit.studies import NearfarSettings, run_nearfar
    from fi_toolkit.studies.probe_run import run_probe
    from fi_toolkit.studies.probe_settings import ProbeSettings

    root = tmp_path_factory.mktemp("honest-report")
    cfg = SignalConfig(window=8)
    docs = [
        Document(f"doc{i}", "text", torch.randint(0, 256, (200,), generator=torch.Generator().manual_seed(i)), "test")
        for i in range(4)
    ]
    selections = ["entropy:remove=0.1", "attention:remove=0.1", "random:remove=0.1@0-2", "random:keep=0.5@0-1"]
    selections.append("policy:snapkv@keep=0.5")
    probe = ProbeSettings(["96:112", "128:144"], selections, prefix=96, signals=cfg)
    run_probe(tiny, docs, probe, RunSettings(out=root / "probe"))
    run_nearfar(tiny, docs, NearfarSettings(96, [0, 32], 16, budget="remove=0.1", seeds=2, signals=cfg), root / "nf")
    build_report([root / "probe", root / "nf"], root / "report", ["html"])
    return root / "report" / "report.html"


def test_probe_and_nearfar_reports_show_their_figures_and_intervals(browser, honest_report):
    """Each part shows its figure (loaded, titled: the probe's against random's band, the near/far bands as the
    table's intervals), its lead table's cells carry intervals whose bounds are never negative, and random
    positions are one row per budget."""
    browser.open_plain(honest_report)
    parts = browser.js(
        """(() => Array.from(document.querySelectorAll('h2')).map(h => {
          const out = {run: h.textContent, figures: [], lead: [], rows: []};
          for (let e = h.nextElementSibling; e && e.tagName !== 'H2'; e = e.nextElementSibling) {
            for (const f of [e, ...e.querySelectorAll('figure')].filter(x => x.matches('figure'))) {
              const img = f.querySelector('img');
              out.figures.push({caption: f.querySelector('figcaption').textContent,
                                loaded: img.complete && img.naturalWidth > 100});
            }
            if (e.classList.contains('lead')) {
              out.lead = Array.from(e.querySelectorAll('td'), td => td.textContent);
              out.rows = Array.from(e.querySelectorAll('tbody tr'), tr => tr.children[1].textContent);
            }
          }
          return out;
        }))()"""
    )
    probe = next(p for p in parts if "(fi probe)" in p["run"])
    nearfar = next(p for p in parts if "(fi nearfar)" in p["run"])
    assert any("against random positions" in f["caption"] and f["loaded"] for f in probe["figures"]), probe["figures"]
    assert any("bootstrap 95% CI over documents" in f["caption"] and f["loaded"] for f in nearfar["figures"])
    assert [r for r in probe["rows"] if r.startswith("random")] == [
        "random:remove=0.1 (3 seeds)",
        "random:keep=0.5 (2 seeds)",
    ]
    for part in (probe, nearfar):
        bounds = [b for cell in part["lead"] for b in re.findall(r"\[([^\]]+)\]", cell)]
        assert bounds, part["lead"]
        for b in bounds:
            low, high = (float(x) for x in b.split(","))
            assert 0 <= low <= high, b
    assert browser.errors() == []


def _site(tmp_path_factory) -> Path:
    """The built documentation: FI_SITE (make docs passes its site/), else built here with mkdocs (docs extra)."""
    if os.environ.get("FI_SITE"):
        return Path(os.environ["FI_SITE"]).resolve()
    pytest.importorskip("mkdocs", reason="the docs extra (mkdocs) builds the site: make docs")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=root,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root), "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"},
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return _site(tmp_path_factory)


def test_docs_site_reads_from_its_files(browser, site):
    """Opened from site/index.html with no server: a formula is typeset by KaTeX, a navigation click lands on a
    page (not a directory listing), search is there and finds pages, and nothing is fetched from the network."""
    browser.events.clear()
    browser.open_plain(site / "index.html")
    assert browser.js("document.querySelectorAll('.katex-display').length") >= 1  # the FI definition
    text = browser.js("document.querySelector('.md-content').innerText")
    assert "\\frac" not in text and "$$" not in text and "FI(e;C)" in text.replace(" ", "").replace("\n", "")
    browser.click(".md-nav__link[href='install.html']")
    t0 = time.perf_counter()
    while not browser.js("location.href").endswith("/install.html") or browser.js("document.readyState") != "complete":
        assert time.perf_counter() - t0 < 20
        time.sleep(0.05)
    assert browser.js("document.querySelector('.md-content h1').textContent").startswith("Install")
    assert browser.js("getComputedStyle(document.querySelector('.md-search')).display") != "none"
    browser.click(".md-search__input")
    browser.page("Input.insertText", {"text": "noise floor"})
    t0 = time.perf_counter()
    while not browser.js("document.querySelectorAll('.md-search-result__link').length"):
        assert time.perf_counter() - t0 < 20, "search found nothing"
        time.sleep(0.1)
    first = browser.js("document.querySelector('.md-search-result__link').href")
    assert first.startswith("file://") and Path(first[len("file://") :].split("#")[0]).is_file()
    if _shots():
        browser.screenshot(_shots() / "docs_search.png")
    assert browser.errors() == []  # no failed fetch (a CDN would fail here: no network)


def test_cli_reference_reads_on_a_laptop_screen(browser, site):
    """At 1280 pixels every option's spelling stays on one line and its help gets most of the text column."""
    browser.open_plain(site / "reference" / "cli.html")
    found = browser.js(
        """(() => Array.from(document.querySelectorAll('.options dt')).map(dt => ({
          lines: dt.querySelector('code').getClientRects().length,
          help: dt.nextElementSibling.getBoundingClientRect().width,
          column: dt.closest('.md-content').getBoundingClientRect().width})))()"""
    )
    assert len(found) > 150
    assert all(f["lines"] == 1 for f in found), [f for f in found if f["lines"] != 1][:3]
    assert all(f["help"] > 0.8 * f["column"] - 40 for f in found)
    if _shots():
        browser.screenshot(_shots() / "docs_cli.png")
