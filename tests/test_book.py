"""The book: built from tiny synthetic results, opened in headless Chromium with the network
cut off, every chart must render (an SVG with drawn marks) and the equations typeset.

Chromium runs with every request sent to a recording proxy on 127.0.0.1: pages are opened
from ``file://``, so any request the proxy sees is an attempt to reach the network, and the
proxy answers it with an error.  The test fails if there is any.
"""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
from html.parser import HTMLParser
from pathlib import Path

import pytest

from book_fixtures import ROOT, built_book

pytestmark = pytest.mark.slow

#: Chromium's own background services (component updater, network time, sign-in); they are
#: not requests made by the pages, and are refused by the proxy like everything else.
#: Chromium 150 also connects to www.google.com at start, with a blank page too.
#: Chromium's own background services (updates, accounts, push messaging's check-in at
#: android.clients.google.com, seen from Chromium 150 on a loaded machine): not the pages'
BROWSER_HOSTS = ("update.googleapis.com", "accounts.google.com", "clients2.google.com", "www.google.com",
                 "android.clients.google.com")
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)


class RecordingProxy:
    """A TCP server that records the first line of every request and closes the connection."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self._stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1.0)
                try:
                    first = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    first = "<no data>"
                self.requests.append(first)
                try:
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    def page_requests(self) -> list[str]:
        """Recorded requests, less Chromium's own background traffic (:data:`BROWSER_HOSTS`) and
        connections closed before sending anything (Chromium's speculative preconnects: no
        request line, so nothing could be fetched; seen once in a fresh-clone run as ``''``)."""
        return [r for r in self.requests if r
                and not any(re.search(rf"(^CONNECT |//){re.escape(h)}[:/ ]", r) for h in BROWSER_HOSTS)]

    def close(self):
        self._stop = True
        self.thread.join(timeout=2)
        self.sock.close()


class ChartScan(HTMLParser):
    """Collects, per ``div.synclib-vega``, its attributes and the SVG marks inside it."""

    def __init__(self):
        super().__init__()
        self.charts: list[dict] = []
        self._stack: list[int | None] = []
        self.math = 0
        self.math_errors = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = a.get("class") or ""
        if tag == "mjx-container":
            self.math += 1
        if tag == "mjx-merror":
            self.math_errors += 1
        owner = None
        if tag == "div" and "synclib-vega" in cls.split():
            self.charts.append({"id": a.get("id"), "rendered": a.get("data-rendered"),
                                "error": a.get("data-error"), "svg": 0, "marks": 0})
            owner = len(self.charts) - 1
        elif self._stack and self._stack[-1] is not None:
            owner = self._stack[-1]
            c = self.charts[owner]
            if tag == "svg":
                c["svg"] += 1
            if tag in ("path", "rect", "line", "text") and (a.get("d") or tag != "path"):
                c["marks"] += 1
        if tag not in ("img", "br", "hr", "meta", "link", "input", "source"):
            self._stack.append(owner)

    def handle_endtag(self, tag):
        if tag not in ("img", "br", "hr", "meta", "link", "input", "source") and self._stack:
            self._stack.pop()


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    html, proc = built_book(tmp_path_factory.getbasetemp())
    assert proc.returncode == 0, f"jupyter-book build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return html


@pytest.fixture(scope="module")
def proxy():
    p = RecordingProxy()
    yield p
    p.close()


def dump_dom(url: str, profile: Path, proxy_port: int, extra=()) -> str:
    """The page's DOM after its scripts ran, from headless Chromium without network."""
    if CHROMIUM is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (make test does it)")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--no-first-run", "--disable-default-apps", "--disable-extensions",
           "--disable-features=NetworkTimeServiceQuerying,MediaRouter,OptimizationHints,Translate",
           "--disable-domain-reliability", "--no-pings", "--disable-client-side-phishing-detection",
           "--disable-breakpad", "--metrics-recording-only",
           f"--user-data-dir={profile}", f"--proxy-server=127.0.0.1:{proxy_port}",
           "--proxy-bypass-list=<-loopback>", "--virtual-time-budget=15000",
           "--run-all-compositor-stages-before-draw", *extra, "--dump-dom", url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def toc_pages() -> list[str]:
    return re.findall(r"file: (\S+)", (ROOT / "_toc.yml").read_text()) + ["book/intro"]


def test_build_has_every_page_and_no_cdn(book):
    for page in toc_pages():
        html = book / f"{page}.html"
        assert html.is_file(), f"{page} was not built"
        text = html.read_text()
        for m in re.finditer(r'<(?:script|link)[^>]+(?:src|href)="(https?:[^"]+)"', text):
            pytest.fail(f"{page} loads {m.group(1)} from the network")
    assert (book / "_static" / "vendor" / "vega-embed.min.js").is_file()


def test_vendored_vega_lite_matches_altair():
    import altair as alt

    head = (ROOT / "book" / "_static" / "vendor" / "vega-lite.min.js").read_text()[:2000]
    version = re.search(r'var \w+="(\d+)\.(\d+)\.(\d+)"', head)
    assert version, "cannot find the vega-lite version string"
    assert version.group(1) == alt.SCHEMA_VERSION.lstrip("v").split(".")[0]


#: executed pages that show no chart (the dialogs themselves)
NO_CHART = ("book/executed/dialogs",)


def test_charts_render_offline(book, proxy, tmp_path):
    pages = [p for p in toc_pages() if p.startswith("book/executed/") and p not in NO_CHART]
    assert pages
    total = 0
    for i, page in enumerate(pages):
        dom = dump_dom((book / f"{page}.html").as_uri(), tmp_path / f"profile{i}", proxy.port)
        scan = ChartScan()
        scan.feed(dom)
        assert scan.charts, f"{page}: no chart container in the page"
        for c in scan.charts:
            assert c["error"] is None, f"{page}: vegaEmbed failed: {c['error']}"
            assert c["rendered"] == "true", f"{page}: chart {c['id']} was not drawn"
            assert c["svg"] >= 1 and c["marks"] >= 5, f"{page}: chart {c['id']} is blank: {c}"
        total += len(scan.charts)
    assert total >= len(pages)
    assert proxy.page_requests() == [], f"pages tried to reach the network: {proxy.page_requests()}"


def test_intro_and_method_pages(book, proxy, tmp_path):
    intro = dump_dom((book / "book" / "intro.html").as_uri(), tmp_path / "p-intro", proxy.port)
    assert "Synthetic test data" in intro and "Headline numbers of this run" in intro
    method = dump_dom((book / "book" / "method.html").as_uri(), tmp_path / "p-method", proxy.port)
    scan = ChartScan()
    scan.feed(method)
    assert scan.math >= 5, "MathJax did not typeset the equations offline"
    assert scan.math_errors == 0
    assert proxy.page_requests() == [], f"pages tried to reach the network: {proxy.page_requests()}"


def test_proxy_sees_a_page_that_reaches_out(tmp_path):
    """The offline check is real: a page that loads a remote script is caught by the proxy."""
    page = tmp_path / "leaky.html"
    page.write_text('<html><body><script src="http://cdn.example.org/x.js"></script>'
                    "<p>hi</p></body></html>")
    p = RecordingProxy()
    try:
        dump_dom(page.as_uri(), tmp_path / "profile", p.port)
    finally:
        p.close()
    assert any("cdn.example.org" in r for r in p.page_requests())


#: a laptop's browser viewport
LAPTOP = (1280, 800)

MEASURE = """<html><body style="margin:0">
<iframe id="f" src="{src}" style="width:{w}px;height:{h}px;border:0"></iframe><pre id="out">pending</pre>
<script>
document.getElementById("f").onload = () => setTimeout(() => {{
  const d = document.getElementById("f").contentDocument, rows = [];
  d.querySelectorAll(".synclib-vega, main table").forEach(c => {{
    if (c.tagName === "TABLE" && c.getClientRects().length === 0) return;  // hidden (dialogs widget)
    const svg = c.tagName === "TABLE" ? c : c.querySelector("svg"), r = c.getBoundingClientRect();
    let scrolls = [];
    for (let el = c; el && el !== d.body; el = el.parentElement)
      if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== "visible")
        scrolls.push(el.tagName + "." + el.className);
    rows.push({{id: c.id || c.tagName + "." + c.className, left: r.left, right: r.right, svg: svg ? svg.getBoundingClientRect().width : -1,
               scrolls: scrolls}});
  }});
  // every SVG text: cut with an ellipsis, or an axis label overlapping its neighbour
  const cut = [], overlaps = [];
  // labels Vega hid to avoid overlaps (labelOverlap) stay in the SVG with opacity 0
  const shown = t => t.getAttribute("opacity") !== "0" && getComputedStyle(t).opacity !== "0";
  d.querySelectorAll(".synclib-vega svg text").forEach(t => {{ if (shown(t) && t.textContent.includes("\u2026")) cut.push(t.textContent); }});
  d.querySelectorAll(".synclib-vega svg g.role-axis-label").forEach(g => {{
    const boxes = Array.from(g.querySelectorAll("text")).filter(shown).map(t => [t.textContent, t.getBoundingClientRect()])
      .filter(b => b[1].width > 0);
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {{
      const a = boxes[i][1], b = boxes[j][1];
      const w = Math.min(a.right, b.right) - Math.max(a.left, b.left), h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) overlaps.push([boxes[i][0], boxes[j][0]]);
    }}
  }});
  const main = d.querySelector("article.bd-article") || d.querySelector("main") || d.body;
  document.getElementById("out").textContent = JSON.stringify({{rows: rows, cut: cut, overlaps: overlaps,
    text_right: main.getBoundingClientRect().right, page_scroll: d.documentElement.scrollWidth,
    page_client: d.documentElement.clientWidth}});
}}, 4000);
</script></body></html>"""


def test_figures_fit_a_laptop_screen(book, proxy, tmp_path):
    """At a laptop's width no chart or table on any page is wider than the text column and
    nothing scrolls sideways (the heatmaps used to sit side by side, the second cut off behind a
    scroll bar; the power table and the method page's table used to scroll); no chart text is
    cut with an ellipsis (the heatmap panels' titles were) and no axis label overlaps its
    neighbour (figure 11's were)."""
    import json

    for i, page in enumerate(toc_pages()):
        wrapper = tmp_path / f"measure{i}.html"
        wrapper.write_text(MEASURE.format(src=(book / f"{page}.html").as_uri(), w=LAPTOP[0], h=LAPTOP[1]))
        dom = dump_dom(wrapper.as_uri(), tmp_path / f"pm{i}", proxy.port,
                       extra=["--allow-file-access-from-files", f"--window-size={LAPTOP[0]},{LAPTOP[1]}"])
        m = re.search(r'<pre id="out">(.*?)</pre>', dom, re.S)
        assert m and m.group(1) != "pending", f"{page}: the measurement did not run"
        got = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        assert got["page_scroll"] <= got["page_client"] + 1, f"{page}: the page scrolls sideways: {got}"
        assert not got["cut"], f"{page}: chart text cut short: {got['cut']}"
        assert not got["overlaps"], f"{page}: axis labels overlap: {got['overlaps']}"
        for row in got["rows"]:
            assert not row["scrolls"], f"{page}: {row['id']} sits in a sideways-scrolling box {row}"
            assert row["svg"] > 0, f"{page}: {row['id']} has no drawing"
            assert row["right"] <= got["text_right"] + 1, f"{page}: {row['id']} is wider than the text {row}"


def test_no_machine_paths_in_pages(book):
    """Runs are named by their config name and a path relative to the repository."""
    for page in toc_pages():
        text = (book / f"{page}.html").read_text()
        for bad in (str(ROOT), "/tmp/", "/home/", "/root/"):
            assert bad not in text, f"{page} shows the machine path {bad!r}"


class VisibleText(HTMLParser):
    """The text a reader sees in a page's article (scripts and styles left out), and the
    output cells' classes."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.outputs: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        cls = dict(attrs).get("class") or ""
        if "output" in cls.split():
            self.outputs.append(cls)

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


#: what a rendered page must never show: raw Markdown table rows, Python warnings, tracebacks
RAW_TABLE = re.compile(r"\|\s*(?:-{3,}|—)\s*\|")
WARNINGS = re.compile(r"\b(?:Runtime|User|Future|Deprecation)Warning\b|Traceback \(most recent call last\)")


def test_rendered_pages_show_no_raw_tables_warnings_or_stderr(book):
    """Every built page reads clean: tables rendered as tables (figure 9's benchmark tables were
    raw `| --- |` text inside a paragraph), no warning or stderr output of a cell (the table 5
    page printed "RuntimeWarning: Mean of empty slice"), no machine path (test above)."""
    for page in toc_pages():
        scan = VisibleText()
        scan.feed((book / f"{page}.html").read_text())
        text = "".join(scan.parts)
        assert not RAW_TABLE.search(text), f"{page}: raw table syntax: {RAW_TABLE.search(text).group(0)!r}"
        assert not WARNINGS.search(text), f"{page}: shows {WARNINGS.search(text).group(0)!r}"
        assert not [c for c in scan.outputs if "stderr" in c], f"{page}: a cell wrote to stderr"
