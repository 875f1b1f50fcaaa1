"""The book: built from tiny synthetic results, opened in headless Chromium with the network
cut off, every chart must render (an SVG with drawn marks) and the equations typeset.

Chromium runs with every request sent to a recording proxy on 127.0.0.1: pages are opened
from ``file://``, so any request the proxy sees is an attempt to reach the network, and the
proxy answers it with an error.  The test fails if there is any.
"""
from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from book_fixtures import ROOT, built_book
from devtools import CHROMIUM, LAPTOP, Browser

pytestmark = pytest.mark.slow

#: Chromium's own background services (component updater, network time, sign-in); they are
#: not requests made by the pages, and are refused by the proxy like everything else.
#: Chromium 150 also connects to www.google.com at start, with a blank page too.
#: Chromium's own background services (updates, accounts, push messaging's check-in at
#: android.clients.google.com, seen from Chromium 150 on a loaded machine): not the pages'
BROWSER_HOSTS = ("update.googleapis.com", "accounts.google.com", "clients2.google.com", "www.google.com",
                 "android.clients.google.com")


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
    """Every page of the table of contents, its root (the first page, ``book/executed/intro``) first."""
    toc = (ROOT / "_toc.yml").read_text()
    return re.findall(r"^root: (\S+)", toc, re.M) + re.findall(r"file: (\S+)", toc)


#: the first page: the intro notebook, executed (it was book/intro.md with generated parts)
FIRST_PAGE = "book/executed/intro"


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


#: executed pages that show no chart: the dialogs themselves, and the pages of words and tables that were
#: written from Python (the embedded models, how to reproduce, the benchmarks)
NO_CHART = ("book/executed/dialogs", "book/executed/embedded_models", "book/executed/reproduce",
            "book/executed/benchmarks")


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
    intro = dump_dom((book / f"{FIRST_PAGE}.html").as_uri(), tmp_path / "p-intro", proxy.port)
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
    """The text a reader sees in a page's article (scripts and styles left out, and the notebooks' code:
    a page's cells hold the code of its tables, folded under the output), and the output cells' classes."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
            "wbr"}

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.outputs: list[str] = []
        self._skip = 0
        self._code = 0  # open elements inside a cell's code (div.cell_input), 0 outside

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._skip += 1
        cls = dict(attrs).get("class") or ""
        if "output" in cls.split():
            self.outputs.append(cls)
        if tag not in self.VOID and (self._code or "cell_input" in cls.split()):
            self._code += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self._skip:
            self._skip -= 1
        if tag not in self.VOID and self._code:
            self._code -= 1

    def handle_data(self, data):
        if not self._skip and not self._code:
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


# --------------------------------------------------------------------------- what a reader sees wrong
# Each page opened in headless Chromium driven over the DevTools protocol (a pipe, standard
# library only) at a laptop's size; the page's own state read after its charts are drawn and
# MathJax has typeset.  Run on the book built from tiny synthetic results (``book``) and on the
# book in ``_build/html`` (the last ``make book`` of the real run; skipped where there is none),
# because some defects only show with the real run's data (figure 7's 30 values of k).

class DevTools(Browser):
    """A :class:`devtools.Browser` whose pages are the book's: :meth:`open` waits for MathJax and the charts."""

    def open(self, url: str, timeout: float = 90) -> None:
        """Load ``url``; wait for its load event, MathJax's typesetting and every chart."""
        self.load(url, timeout)
        deadline = time.monotonic() + timeout
        while not self.evaluate(READY):
            assert time.monotonic() < deadline, f"{url}: charts or equations never finished"
            self.drain(0.25)
        self.drain(0.5)  # late console messages


#: true once the page has loaded, MathJax has typeset and every chart is drawn (or failed)
READY = """(async () => {
  if (document.readyState !== 'complete') return false;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  return !window.vegaEmbed || Array.from(document.querySelectorAll('.synclib-vega')).every(
    e => e.getAttribute('data-rendered') || e.getAttribute('data-error'));
})()"""

#: display equations wider than their box, axis labels closer than 2 pixels (or overlapping)
#: within one axis, charts with no drawn data mark (only text, e.g. a frame with a message)
PROBE = r"""(() => {
  const out = {math: [], labels: [], empty: [], charts: 0, equations: 0,
               placeholders: document.querySelectorAll('.synclib-placeholder').length};
  document.querySelectorAll('mjx-container[display="true"]').forEach(el => {
    out.equations++;
    const m = el.querySelector('mjx-math'), w = m ? m.getBoundingClientRect().width : 0;
    if (el.scrollWidth > el.clientWidth + 1 || w > el.clientWidth + 1)
      out.math.push({width: Math.round(Math.max(w, el.scrollWidth)), column: el.clientWidth,
                     text: el.textContent.slice(0, 80)});
  });
  const shown = t => t.getAttribute('opacity') !== '0' && getComputedStyle(t).opacity !== '0';
  document.querySelectorAll('.synclib-vega').forEach(c => {
    const svg = c.querySelector('svg');
    if (!svg) return;
    out.charts++;
    const title = Array.from(svg.querySelectorAll('.role-title-text text')).map(t => t.textContent).join(' ');
    let items = 0;
    svg.querySelectorAll('g.role-mark').forEach(g => {
      if (/\bmark-(group|text)\b/.test(g.getAttribute('class'))) return;
      items += Array.from(g.children).filter(k => /^(path|line|rect|circle|image)$/.test(k.tagName)).length;
    });
    if (items === 0) out.empty.push(`${c.id} (${title || 'untitled'})`);
    svg.querySelectorAll('g.role-axis-label').forEach(g => {
      const boxes = Array.from(g.querySelectorAll('text')).filter(shown)
        .map(t => [t.textContent, t.getBoundingClientRect()]).filter(b => b[1].width > 0);
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i][1], b = boxes[j][1];
        const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (w > -2 && h > -2) out.labels.push(`${title || c.id}: "${boxes[i][0]}" and "${boxes[j][0]}"`);
      }
    });
  });
  return out;
})()"""


def probe_pages(html_dir: Path, pages, proxy_port: int, profiles: Path) -> dict[str, dict]:
    """:data:`PROBE`'s findings and the console errors of each page (a fresh browser each)."""
    found = {}
    for i, page in enumerate(pages):
        browser = DevTools(profiles / f"cdp{i}", proxy_port)
        try:
            browser.open((html_dir / f"{page}.html").as_uri())
            found[page] = {**browser.evaluate(PROBE), "errors": browser.console_errors()}
        finally:
            browser.close()
    return found


@pytest.fixture(scope="module", params=["tiny", "built"])
def reader_view(request, tmp_path_factory, proxy):
    """``(which book, {page: findings})`` for the tiny book and for ``_build/html``."""
    if request.param == "tiny":
        html = request.getfixturevalue("book")
    else:
        html = ROOT / "_build" / "html"
        if not (html / f"{FIRST_PAGE}.html").is_file():
            pytest.skip("no book in _build/html: `make book` builds it")
    profiles = tmp_path_factory.mktemp(f"reader-{request.param}")
    return request.param, probe_pages(html, toc_pages(), proxy.port, profiles)


def test_display_math_fits_its_column(reader_view):
    """No display equation is wider than the text column (the method page's two SyncR²
    equations were 974 and 919 pixels in a 676-pixel column and only scrolled)."""
    which, found = reader_view
    assert sum(f["equations"] for f in found.values()) >= 5, f"{which}: MathJax typeset nothing"
    wide = {p: f["math"] for p, f in found.items() if f["math"]}
    assert not wide, f"{which} book: equations wider than the text column: {wide}"


def test_axis_labels_stand_apart(reader_view):
    """No two labels of one axis overlap or touch (closer than 2 pixels): figure 7's k = 1..30
    ran together, figure 9's "600700", figure 2's scatter "-0.3-0.2"."""
    which, found = reader_view
    close = {p: f["labels"] for p, f in found.items() if f["labels"]}
    assert not close, f"{which} book: axis labels overlap: {close}"


def test_no_empty_chart(reader_view):
    """Every chart draws data (figure 7's correlation chart was a frame holding only a message:
    a chart with nothing to draw is a sentence, :func:`synclib.notebook.offline_renderer`)."""
    which, found = reader_view
    # a chart with nothing to draw (a run too small to fit the maps) is a sentence instead
    assert sum(f["charts"] + f["placeholders"] for f in found.values()) >= 10, f"{which}: charts were not drawn"
    empty = {p: f["empty"] for p, f in found.items() if f["empty"]}
    assert not empty, f"{which} book: charts with no data mark: {empty}"


def test_no_console_errors(reader_view):
    """No page logs an error (every page threw "Identifier 'THEBE_JS_URL' has already been
    declared", and the theme logged "Got invalid theme mode" to a new visitor)."""
    which, found = reader_view
    errors = {p: f["errors"] for p, f in found.items() if f["errors"]}
    assert not errors, f"{which} book: console errors: {errors}"


class HeaderRows(HTMLParser):
    """The number of ``<tr>`` in each ``<thead>``, and the header cells' text."""

    def __init__(self):
        super().__init__()
        self.heads: list[list[str]] = []
        self._in = False
        self._cell = None

    def handle_starttag(self, tag, attrs):
        if tag == "thead":
            self._in = True
            self.heads.append([])
        elif tag == "tr" and self._in:
            self.heads[-1].append("")
        elif tag == "th" and self._in:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "thead":
            self._in = False
        elif tag == "th" and self._in and self.heads[-1]:
            self.heads[-1][-1] += f"[{(self._cell or '').strip()}]"
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


@pytest.mark.parametrize("which", ["tiny", "built"])
def test_tables_have_one_header_row(which, request):
    """No table on any page has two header rows (pandas wrote a second one for a named index or
    columns: table 2's "setting / label", the controls page's "run / genuine vs"):
    :func:`synclib.notebook.flat_table` shows DataFrames flat."""
    html = request.getfixturevalue("book") if which == "tiny" else ROOT / "_build" / "html"
    if not (html / f"{FIRST_PAGE}.html").is_file():
        pytest.skip("no book in _build/html: `make book` builds it")
    bad = {}
    for page in toc_pages():
        scan = HeaderRows()
        scan.feed((html / f"{page}.html").read_text())
        two = [rows for rows in scan.heads if len(rows) > 1]
        if two:
            bad[page] = two
    assert not bad, f"{which} book: tables with more than one header row: {bad}"


DEFECTS = r"""<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="width:600px">
<div class="math"><mjx-container display="true" style="display:block;overflow-x:auto">
  <mjx-math style="display:inline-block;width:900px">x</mjx-math></mjx-container></div>
<div class="synclib-vega" id="v1" data-rendered="true"><svg width="300" height="100">
  <g class="mark-text role-title-text"><text x="0" y="10">A frame with a message</text></g>
  <g class="mark-text role-mark"><text x="0" y="40">nothing to draw</text></g>
  <g class="mark-text role-axis-label"><text x="10" y="80" font-size="10">600</text><text x="24" y="80" font-size="10">700</text></g>
</svg></div>
<script>console.error("a logged error"); const once = 1;</script><script>const once = 2;</script>
<table><thead><tr><th>setting</th><th>a</th></tr><tr><th>label</th><th></th></tr></thead><tbody></tbody></table>
</body></html>"""


def test_reader_checks_catch_each_defect(tmp_path, proxy):
    """The checks above are real: a page with a too-wide equation, touching axis labels, a
    chart without data marks, a redeclared constant and console.error, and a two-row header
    fails each of them."""
    page = tmp_path / "defects.html"
    page.write_text(DEFECTS)
    found = probe_pages(tmp_path, ["defects"], proxy.port, tmp_path)["defects"]
    assert found["math"] and found["math"][0]["width"] >= 899
    assert found["labels"] == ['A frame with a message: "600" and "700"']
    assert found["empty"] == ["v1 (A frame with a message)"]
    assert any("already been declared" in e for e in found["errors"])
    assert "a logged error" in found["errors"]
    scan = HeaderRows()
    scan.feed(DEFECTS)
    assert scan.heads == [["[setting][a]", "[label][]"]]


def test_prompt_shows_glyphless_characters_by_code_point(tmp_path, proxy):
    """A model's emoji, zero-width joiner or U+FFFD in a prompt shows as its code point (the
    ToM prompt drew "□□□□" in a monospace font without emoji), while the prompt's text, the
    ``<ins>`` tags unwrapped, stays exact: the dialogs page on a run of one dialog (embedded task 0)
    whose second utterance holds them, its prompts shown at turn 2."""
    import html as html_lib

    import nbformat

    from book_fixtures import crafted_cube, crafted_results, execute_notebook, html_outputs
    from synclib.tasks.prompts import render_prompt
    from synclib.tasks.scenarios import load_tasks

    tasks = load_tasks("embedded")
    odd = "Hi \U0001F469\u200d\U0001F368\U0001F41D\ufffd"
    root = crafted_results(tmp_path / "results", {"C-C": crafted_cube([["Hello there.", odd, "Fine."]],
                                                                      tasks=[tasks[0]])})
    out = tmp_path / "dialogs.ipynb"
    proc = execute_notebook(ROOT / "notebooks" / "dialogs.md", out, {"results_dir": root})
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = next(h for h in html_outputs(nbformat.read(out, 4)) if 'class="spv"' in h)  # what the models read
    for cp in ("U+1F469", "U+200D", "U+1F368", "U+1F41D", "U+FFFD"):
        assert f'data-cp="{cp}"' in page
    box = re.search(r'data-view="active".*?<div class="spv-text">(.*?)</div>', page, re.S).group(1)
    box = re.sub(r'<del class="spv-cut"[^>]*>.*?</del>', "", box, flags=re.S)
    prompt = html_lib.unescape(re.sub(r"</?ins[^>]*>", "", box))
    assert odd in prompt and prompt == render_prompt(tasks[0], 0, ["Hello there.", odd], "active")
    # in a browser: the code points are drawn, the glyphs are not
    (tmp_path / "p.html").write_text(f'<!DOCTYPE html><meta charset="utf-8"><body>{page}</body>')
    browser = DevTools(tmp_path / "profile", proxy.port)
    try:
        browser.open((tmp_path / "p.html").as_uri())
        got = browser.evaluate("""Array.from(document.querySelectorAll('.synclib-cp')).map(e =>
          [getComputedStyle(e, '::before').content, e.getBoundingClientRect().width > 10,
           parseFloat(getComputedStyle(e).fontSize)])""")
    finally:
        browser.close()
    assert got and all(c.startswith('"U+') and wide and size == 0 for c, wide, size in got), got


def test_a_chart_with_no_finite_value_is_a_sentence():
    """A run too small to fit the maps has every SyncR² NaN: such a chart is shown as a sentence, not
    an empty frame; a chart with one drawable record, or a bar layer beside an empty error bar, draws."""
    import altair as alt
    import pandas as pd

    from synclib import notebook

    nan = pd.DataFrame({"pair": ["S-S", "G-G"], "sync": [float("nan")] * 2, "lo": [float("nan")] * 2})
    bars = alt.Chart(nan, title="SyncR²").mark_bar().encode(x="pair:N", y="sync:Q")
    bundle = notebook.offline_renderer(bars.to_dict())
    assert "not drawn" in bundle["text/html"] and not any(k.startswith("application/vnd.vegalite") for k in bundle)
    some = nan.assign(sync=[0.2, float("nan")])
    layered = alt.layer(alt.Chart(some).mark_bar().encode(x="pair:N", y="sync:Q"),
                        alt.Chart(some).mark_rule().encode(x="pair:N", y="lo:Q"))
    assert not notebook.nothing_to_draw(layered.to_dict())
    drawn = notebook.offline_renderer(layered.to_dict(), png=False)
    assert any(k.startswith("application/vnd.vegalite") for k in drawn)


class ProseText(HTMLParser):
    """A page's text outside code, scripts and typeset math (``class="math"``): where raw TeX must not
    show."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
            "wbr"}
    SKIP = {"pre", "code", "script", "style", "kbd", "samp", "textarea", "svg"}

    def __init__(self):
        super().__init__()
        self.stack: list[bool] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        cls = (dict(attrs).get("class") or "").split()
        self.stack.append(tag in self.SKIP or "math" in cls or bool(self.stack and self.stack[-1]))

    def handle_endtag(self, tag):
        if tag not in self.VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if not (self.stack and self.stack[-1]):
            self.text.append(data)


#: TeX that shows when a formula is not typeset: a dollar sign (not a price: the tasks' "$450") or a command
RAW_TEX = re.compile(r"\$(?!\d)|\\(min|max|frac|begin|end|sum|text|mathrm|hat|bar|le|ge|left|right|bigl|bigr)\b")


def raw_tex(html_text: str) -> list[str]:
    """The places (with 30 characters around) where raw TeX reaches a page's prose."""
    scan = ProseText()
    scan.feed(html_text)
    prose = "".join(scan.text)
    return [prose[max(0, m.start() - 30):m.end() + 30] for m in RAW_TEX.finditer(prose)]


def test_raw_tex_is_found():
    """The check itself, on the method page's formula as it once reached the page: MathJax had been given
    ``$...$`` broken across a display equation, so ``2 \\min(1 + #{d_b ...`` showed as text."""
    broken = '<p>two-sided,\n\\)</span>2 \\min(1 + #{d_b \\le 0}) / (1 + B)$, and</p>'
    found = raw_tex(broken)
    assert len(found) == 3 and "\\min" in found[0]  # \min, \le and the closing $ of the prose
    fine = ('<p><span class="math notranslate">\\(x \\le 1\\)</span> <code>$HF_HOME</code> a price of $450</p>'
            '<div class="math notranslate">\\[\\frac{1}{2}\\]</div>')
    assert raw_tex(fine) == []  # typeset math, code and a price are not raw TeX


@pytest.mark.parametrize("which", ["tiny", "built"])
def test_no_raw_tex_on_any_page(which, request):
    """No raw ``$`` or TeX command reaches a page's prose (the method page's bootstrap formula, which
    defines every claim's p, once rendered as ``$ 2 \\min(1 + #{d_b ...``)."""
    html = request.getfixturevalue("book") if which == "tiny" else ROOT / "_build" / "html"
    if not (html / f"{FIRST_PAGE}.html").is_file():
        pytest.skip("no book in _build/html: `make book` builds it")
    bad = {page: found for page in toc_pages() if (found := raw_tex((html / f"{page}.html").read_text()))}
    assert not bad, f"{which} book: raw TeX on pages: {bad}"
