"""The front door (issue 51): README.md stays short and says what a newcomer needs first (the
picture, the two commands, the presets, the book's pages, how to cite, the licence), and
CITATION.cff is a valid Citation File Format 1.2.0 file that points at the paper."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
CFF = REPO / "CITATION.cff"
PAPER_TITLE = "Neural Synchrony Between Socially Interacting Language Models"
PAPER_AUTHORS = ["Zhang", "Zhu", "Han", "Wang", "Ji"]


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _fenced(text: str, lang: str = "") -> list[str]:
    return re.findall(r"```" + re.escape(lang) + r"[^\n]*\n(.*?)```", text, re.S)


def test_readme_is_at_most_120_lines():
    n = len(_readme().splitlines())
    assert n <= 120, f"README.md has {n} lines; the measurement history belongs on notebooks/benchmarks.md"


def test_readme_opens_with_the_picture_then_the_two_commands():
    text = _readme()
    images = list(re.finditer(r"!\[[^\]]*\]\(([^)\s]+)\)", text))
    assert images, "README.md shows no picture"
    image = images[0]
    path = image.group(1)
    assert not re.match(r"[a-z]+://", path) and not path.startswith("/"), path  # relative, reads offline
    assert (REPO / path).is_file(), f"README.md shows {path}, which does not exist"
    caption = text[image.end():].lstrip().splitlines()[0]
    assert "default run" in caption and "SmolLM2-135M" in caption and "Gemma-3-270M" in caption
    assert "not the paper's models" in caption
    first_section = text.index("\n## ")
    assert image.start() < first_section
    commands = next(b for b in _fenced(text, "bash") if "make book" in b)
    assert re.search(r"^make book\b", commands, re.M) and re.search(r"^make test\b", commands, re.M)
    assert image.start() < text.index(commands) < first_section
    for what in ("_build/html/index.html", "results/embedded/", "minutes", "GiB"):
        assert what in text[:first_section], what


def test_readme_has_the_presets_table():
    rows = [ln for ln in _readme().splitlines() if ln.startswith("|")]
    for preset in ("default", "overnight", "paper"):
        row = next((r for r in rows if f"config/{preset}.yaml" in r), None)
        assert row is not None, f"no table row for config/{preset}.yaml"
        assert (REPO / "config" / f"{preset}.yaml").is_file()
        assert re.search(r"\d", row.split("|")[-2]), f"{preset}: no measured time or price"
    paper = next(r for r in rows if "config/paper.yaml" in r)
    assert "--dry-run" in paper and "H100" in paper


def test_readme_links_resolve_and_reach_the_books_pages():
    text = _readme()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        assert (REPO / link.split("#")[0]).exists(), f"README.md links to {link}, which does not exist"
    for page in ("book/method.md", "notebooks/reproduce.md", "notebooks/benchmarks.md", "book/architecture.md"):
        assert page in links, page


def test_readme_says_how_to_cite_and_the_licence():
    text = _readme()
    bib = " ".join(" ".join(_fenced(text, "bibtex")).split())
    assert bib.startswith("@inproceedings{") and PAPER_TITLE in bib and "2026" in bib and "ICLR" in bib
    for name in PAPER_AUTHORS:
        assert name in bib
    assert "(CITATION.cff)" in text
    licence = (REPO / "LICENSE").read_text().splitlines()[0].split()[0]  # "MIT License" -> "MIT"
    assert re.search(rf"^Licence: {licence}\b", text, re.M)


def _cff() -> dict:
    return yaml.safe_load(CFF.read_text(encoding="utf-8"))


def test_citation_cff_has_the_required_keys_and_the_paper():
    cff = _cff()
    # CFF 1.2.0 requires cff-version, message, title and authors; each author a person
    # (family-names or given-names) or an entity (name)
    assert cff["cff-version"] == "1.2.0"
    assert cff.get("type", "software") == "software"
    assert isinstance(cff["message"], str) and cff["message"].strip()
    assert isinstance(cff["title"], str) and "synclib" in cff["title"]
    assert cff["authors"] and all({"name", "family-names", "given-names"} & set(a) for a in cff["authors"])
    assert cff["license"] == (REPO / "LICENSE").read_text().splitlines()[0].split()[0]
    paper = cff["preferred-citation"]
    assert paper["type"] in ("conference-paper", "article", "proceedings")
    assert paper["title"] == PAPER_TITLE and paper["year"] == 2026
    assert [a["family-names"] for a in paper["authors"]] == PAPER_AUTHORS
    assert "ICLR 2026" in paper["conference"]["name"]


def test_citation_cff_validates_against_the_cff_schema():
    """The full CFF 1.2.0 JSON schema (tests/data/cff-1.2.0.schema.json, as cffconvert 2.0.0 ships
    it: cffconvert itself pins a jsonschema older than the notebooks need)."""
    import json

    import jsonschema

    schema = json.loads((Path(__file__).parent / "data" / "cff-1.2.0.schema.json").read_text())
    assert schema["$id"].endswith("/1.2.0/schema.json")
    jsonschema.validate(_cff(), schema)
    broken = {k: v for k, v in _cff().items() if k != "authors"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)
