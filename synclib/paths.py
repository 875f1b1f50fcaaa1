"""Where things live in the repository: absolute paths found from this file's location (synclib runs from a
checkout), not from the working directory."""
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
BUILD_DIR = REPO_ROOT / "_build"
BENCH_RESULTS = REPO_ROOT / "bench" / "results"
#: in a results directory: the paper's claims judged on the run, and their tests (synclib.analysis.claims)
CLAIMS_FILE = "claims.json"


def in_repo(path: str | Path) -> Path:
    """``path`` as given when absolute, else relative to the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO_ROOT / p


def display(path: str | Path) -> str:
    """``path`` relative to the repository root when inside it (for pages and logs), else as given."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)
