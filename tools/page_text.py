"""Record a built book's pages (their text and a hash of each chart) and compare two records.

A refactoring that should leave the book as it was is checked by building the book before and
after on the same results and comparing what a reader sees:

    python tools/page_text.py snapshot _build/html before.json
    ... change the code, rebuild (synclib run --steps notebooks,book) ...
    python tools/page_text.py snapshot _build/html after.json
    python tools/page_text.py compare before.json after.json

One executed notebook against another (its outputs only: text, Markdown, HTML and a hash of each
image; the cells' code may differ):

    python tools/page_text.py outputs before.ipynb after.ipynb

A rewording that must keep every number, verdict and chart of each page (the pages may move:
``--moved OLD=NEW`` pairs a page with its new path):

    python tools/page_text.py numbers before.json after.json --moved book/intro.html=book/executed/intro.html

``snapshot`` keeps, for every page under ``book/``, the text of its article without the notebooks'
code cells (one line per block, whitespace collapsed) and the SHA-256 of every embedded image (the charts are PNGs
drawn by the offline renderer).  ``compare`` prints a unified diff of each page whose text
differs and the pages whose charts differ, and exits 1 if anything does.
"""
from __future__ import annotations

import argparse
import base64
import difflib
import hashlib
import json
import re
import sys
from collections import Counter
from pathlib import Path

from bs4 import BeautifulSoup


def page_record(html: str) -> dict:
    """``{"text": [lines], "images": [sha256, ...]}`` of one page's article."""
    soup = BeautifulSoup(html, "html.parser")
    article = soup.find("article") or soup.find("main") or soup.body
    for tag in article.find_all(["script", "style"]):
        tag.decompose()
    for tag in article.select("div.cell_input"):  # the notebooks' (hidden) code: what it shows is compared
        tag.decompose()
    images = []
    for img in article.find_all("img"):
        src = img.get("src", "")
        data = base64.b64decode(src.split(",", 1)[1]) if src.startswith("data:") else src.encode()
        images.append(hashlib.sha256(data).hexdigest())
    lines = [re.sub(r"\s+", " ", s).strip() for s in article.get_text("\n").split("\n")]
    return {"text": [s for s in lines if s], "images": images}


def snapshot(build: Path) -> dict:
    """Every page under ``build/book`` (the book's pages and the executed notebooks)."""
    pages = sorted((build / "book").rglob("*.html"))
    if not pages:
        raise SystemExit(f"{build}: no book/*.html (build the book first)")
    return {str(p.relative_to(build)): page_record(p.read_text(encoding="utf-8")) for p in pages}


def compare(before: dict, after: dict) -> list[str]:
    """Human-readable differences (empty when the two records agree)."""
    out = []
    for page in sorted(set(before) | set(after)):
        if page not in before or page not in after:
            out.append(f"{page}: only {'after' if page in after else 'before'}")
            continue
        a, b = before[page], after[page]
        if a["text"] != b["text"]:
            out.extend(difflib.unified_diff(a["text"], b["text"], f"before/{page}", f"after/{page}",
                                            lineterm="", n=1))
        if a["images"] != b["images"]:
            changed = [i for i, (x, y) in enumerate(zip(a["images"], b["images"])) if x != y]
            out.append(f"{page}: charts differ (before {len(a['images'])}, after {len(b['images'])}; "
                       f"changed positions {changed})")
    return out


#: a number as a page writes it: 0.31, -0.058, 1,024, 95 %, 2.5e-06
NUMBER = re.compile(r"(?<![\w.])[-−+]?\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]?\d+)?(?: ?%)?")
VERDICTS = re.compile(r"\b(agrees|partly|differs|cannot test|inconclusive)\b")


def page_numbers(record: dict) -> tuple[Counter, Counter]:
    """The numbers of a page's text (each as written, ``−`` read as ``-``, ``95 %`` as ``95%``) and
    its verdict words, as multisets."""
    text = " ".join(record["text"])  # an inline element (a glued number) is a line of its own
    numbers = Counter(n.replace("−", "-").replace(" %", "%") for n in NUMBER.findall(text))
    return numbers, Counter(VERDICTS.findall(text))


def compare_numbers(before: dict, after: dict, moved: dict) -> list[str]:
    """Per page (``moved``: old path -> new path), the numbers, verdict words and charts of ``before`` that
    ``after`` lacks, and those it adds; empty lists where every page keeps all of them."""
    out = []
    for page in sorted(before):
        new = moved.get(page, page)
        if new not in after:
            out.append(f"{page}: no page {new} after")
            continue
        (nb, vb), (na, va) = page_numbers(before[page]), page_numbers(after[new])
        lost, gained = nb - na, na - nb
        charts = Counter(before[page]["images"]) - Counter(after[new]["images"])
        lines = []
        if lost:
            lines.append(f"  numbers only before ({sum(lost.values())}): {' '.join(sorted(lost.elements()))}")
        if gained:
            lines.append(f"  numbers only after ({sum(gained.values())}): {' '.join(sorted(gained.elements()))}")
        if vb != va:
            lines.append(f"  verdict words: before {dict(vb)}, after {dict(va)}")
        if charts:
            lines.append(f"  charts only before: {sum(charts.values())} of {len(before[page]['images'])}")
        label = page if new == page else f"{page} -> {new}"
        out += [f"{label}: {sum(nb.values())} numbers before, {sum(na.values())} after"] + lines if lines else []
    return out


def notebook_outputs(path: Path) -> list[str]:
    """Every output of an executed notebook, in order, as lines (images by their SHA-256)."""
    out = []
    for cell in json.loads(path.read_text())["cells"]:
        for o in cell.get("outputs", []):
            data = o.get("data", {}) if "data" in o else {"stream": o.get("text", "")}
            for kind in sorted(data):
                value = data[kind]
                value = "".join(value) if isinstance(value, list) else value
                if kind.startswith("image/"):
                    value = hashlib.sha256(value.encode()).hexdigest()
                elif not isinstance(value, str):
                    value = json.dumps(value, sort_keys=True)
                else:  # charts inline as data URIs: their hash
                    value = re.sub(r"data:image/\w+;base64,([^\"')]+)",
                                   lambda m: "sha256:" + hashlib.sha256(m.group(1).encode()).hexdigest(), value)
                # random element ids (charts, pandas' styled tables) and object addresses
                value = re.sub(r"synclib-vega-[0-9a-f]+", "synclib-vega-ID", value)
                value = re.sub(r"T_[0-9a-f]{5}", "T_ID", value)
                value = re.sub(r" at 0x[0-9a-f]+", " at 0xADDR", value)
                out.append(f"[{kind}]")
                out.extend(value.splitlines())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("build", type=Path, help="the built site, e.g. _build/html")
    s.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    n = sub.add_parser("numbers")
    n.add_argument("before", type=Path)
    n.add_argument("after", type=Path)
    n.add_argument("--moved", action="append", default=[], metavar="OLD=NEW", help="a page that moved")
    o = sub.add_parser("outputs")
    o.add_argument("before", type=Path)
    o.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "outputs":
        diff = list(difflib.unified_diff(notebook_outputs(args.before), notebook_outputs(args.after), str(args.before),
                                         str(args.after), lineterm="", n=1))
        print("\n".join(diff) if diff else "the two notebooks' outputs are the same")
        return 1 if diff else 0
    if args.cmd == "numbers":
        moved = dict(m.split("=", 1) for m in args.moved)
        diff = compare_numbers(json.loads(args.before.read_text()), json.loads(args.after.read_text()), moved)
        print("\n".join(diff) if diff else "every page keeps its numbers, verdicts and charts")
        return 1 if diff else 0
    if args.cmd == "snapshot":
        args.out.write_text(json.dumps(snapshot(args.build), indent=1))
        return 0
    diff = compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()))
    print("\n".join(diff) if diff else "the two books' pages are the same (text and charts)")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
