"""Where things live in the repository (the one place that knows its layout).

synclib runs from a checkout (``pip install -e .``); every path below is absolute,
found from this file's location, not from the working directory.
"""
from __future__ import annotations

from pathlib import Path

#: the repository root (the folder holding ``_config.yml``, ``synclib/``, ``data/``)
REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
EMBEDDED_SCENARIOS = DATA_DIR / "scenarios"
PUBLISHED_NUMBERS = DATA_DIR / "published.json"
CONFIG_DIR = REPO_ROOT / "config"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"
PAPER_CONFIG = CONFIG_DIR / "paper.yaml"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
BOOK_DIR = REPO_ROOT / "book"
EXECUTED_DIR = BOOK_DIR / "executed"
GENERATED_DIR = BOOK_DIR / "_generated"
BUILD_DIR = REPO_ROOT / "_build"
BENCH_RESULTS = REPO_ROOT / "bench" / "results"


def in_repo(path: str | Path) -> Path:
    """``path`` as given when absolute, else relative to the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def display(path: str | Path) -> str:
    """``path`` relative to the repository root when it lies inside it (for pages and logs:
    no machine's absolute paths), else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)
