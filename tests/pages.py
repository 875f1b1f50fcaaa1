"""A page's words, read from its notebook: what the tests of the pages assert on.

:func:`run_page` executes a text notebook of ``notebooks/`` in this process, as its kernel would
(the parameters cell, then the caller's parameters, then every code cell in order, a cell's last
expression displayed), and keeps what it shows: the Markdown cells with their ``{glue:text}``
values filled in, the Markdown, charts and tables its cells display.  It is quick (no kernel, no
papermill) and lets a test change what the page reads first (a ``claims.json`` with a planted table,
``synclib.paths.BENCH_RESULTS`` pointed elsewhere with ``monkeypatch``), so that a branch of the page's
wording the tiny results do not reach can still be read.  :func:`executed_text` reads the same from an
executed ``.ipynb`` (``book_fixtures.executed_notebooks``: the notebooks as the main job runs them).
"""
from __future__ import annotations

import ast
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from synclib import notebook
from synclib.paths import NOTEBOOK_DIR

GLUE = re.compile(r"\{glue(?::text)?\}`([^`]+)`")
VEGALITE = "application/vnd.vegalite.v5+json"


@dataclass
class Page:
    """What a page showed, in order: ``items`` of ``(kind, value)``, kind ``markdown`` (text), ``chart``
    (a Vega-Lite dict), ``table`` (a DataFrame or Styler) or ``other``."""

    items: list = field(default_factory=list)
    glued: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        """Every Markdown the page shows (its own cells and its cells' output), one block a paragraph."""
        return "\n\n".join(v for k, v in self.items if k == "markdown")

    @property
    def charts(self) -> list[dict]:
        return [v for k, v in self.items if k == "chart"]

    @property
    def tables(self) -> list:
        return [v for k, v in self.items if k == "table"]


def _show(page: Page, obj) -> None:
    import altair as alt
    import pandas as pd
    from IPython.display import Markdown
    from pandas.io.formats.style import Styler

    if isinstance(obj, Markdown):
        page.items.append(("markdown", obj.data))
    elif isinstance(obj, alt.TopLevelMixin):
        page.items.append(("chart", obj.to_dict()))
    elif isinstance(obj, (pd.DataFrame, Styler)):
        page.items.append(("table", obj))
    elif obj is not None:
        page.items.append(("other", obj))


def _run_cell(source: str, ns: dict, page: Page) -> None:
    """One code cell, its last expression displayed as a kernel does."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
        _show(page, value)


def run_page(stem: str, **params) -> Page:
    """Execute ``notebooks/STEM.md`` here with ``params`` replacing its parameters (module doc)."""
    page = Page()

    def glue(name, value, display=True):
        page.glued[name] = value if isinstance(value, str) else str(value)

    def display(*objs, **kwargs):
        for obj in objs:
            _show(page, obj)

    ns: dict = {"__name__": "__main__"}
    with mock.patch("IPython.display.display", display), mock.patch("myst_nb.glue", glue):
        for cell in notebook.read(NOTEBOOK_DIR / f"{stem}.md").cells:
            if cell.cell_type == "markdown":
                page.items.append(("markdown", cell.source))
                continue
            _run_cell(cell.source, ns, page)
            if "parameters" in cell.metadata.get("tags", []):
                ns.update(params)
    page.items = [(k, GLUE.sub(lambda m: page.glued.get(m[1], m[0]), v) if k == "markdown" else v)
                  for k, v in page.items]
    return page


def executed_text(path: Path) -> str:
    """The Markdown an executed notebook shows: its Markdown cells (the glued values filled in from its
    outputs) and its cells' ``text/markdown`` outputs, in order."""
    cells = json.loads(Path(path).read_text())["cells"]
    glued, blocks = {}, []
    for c in cells:
        for o in c.get("outputs", []):
            name = (o.get("metadata") or {}).get("scrapbook", {}).get("name")
            plain = (o.get("data") or {}).get("text/plain")
            if name and plain is not None:
                plain = "".join(plain) if isinstance(plain, list) else plain
                glued[name] = plain[1:-1] if plain[:1] in "'\"" and plain[-1:] == plain[:1] else plain
    for c in cells:
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "markdown":
            blocks.append(GLUE.sub(lambda m: glued.get(m[1], m[0]), src))
        for o in c.get("outputs", []):
            md = (o.get("data") or {}).get("text/markdown")
            if md is not None and not (o.get("metadata") or {}).get("scrapbook"):
                blocks.append("".join(md) if isinstance(md, list) else md)
    return "\n\n".join(blocks)


def executed_charts(path: Path) -> list[dict]:
    """The Vega-Lite specs an executed notebook shows."""
    cells = json.loads(Path(path).read_text())["cells"]
    return [o["data"][k] for c in cells for o in c.get("outputs", []) for k in (o.get("data") or {})
            if k.startswith("application/vnd.vegalite")]


def copy_results(src: Path, dst: Path) -> Path:
    """A copy of a results directory (its claims and analyses), to change before a page reads it."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cubes"))
    manifest = json.loads((dst / "manifest.json").read_text())
    for entry in manifest["pairs"]:  # the cubes stay where they are
        if entry.get("cube"):
            entry["cube"] = str((Path(src) / entry["cube"]).resolve())
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def plant_test(results_dir: Path, name: str, frame) -> None:
    """Replace the table of tests ``name`` of a results directory's ``claims.json`` by ``frame``."""
    from synclib.analysis.claims import _plain

    path = Path(results_dir) / "claims.json"
    data = json.loads(path.read_text())
    data["tests"][name] = _plain(frame)
    path.write_text(json.dumps(data))


def rewrite_claims(results_dir: Path, t) -> None:
    """The claims of ``results_dir``'s ``claims.json`` judged again on ``t`` (a
    :class:`~synclib.analysis.claims.RunTests` whose tests or tables a test has replaced), its tables of
    tests kept: :func:`synclib.analysis.claims.summary` as the claims step writes it."""
    from synclib.analysis import claims

    path = Path(results_dir) / "claims.json"
    data = json.loads(path.read_text())
    with mock.patch.object(claims, "test_tables", lambda t: {}):
        new = claims.summary(t)
    new["tests"], new["inputs"] = data["tests"], data["inputs"]
    path.write_text(json.dumps(new))
