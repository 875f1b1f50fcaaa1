"""The package's shape, as book/architecture.md states it: layers, module and function sizes.

The layers are read from the page's "Layers" table, so the page and this test cannot drift
apart: a module imports (at load time or inside a function) only modules of its own layer or
of a lower one, the modules of one layer import each other without cycles, and every module
of the package is in the table.  No module is over 1,000 lines and no function over 120.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "synclib"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 1000, 120


def _layers() -> dict[str, int]:
    """``{component: layer number}`` from the page's table (rows ``| N name | `a`, `b` |``)."""
    text = (REPO / "book" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out = {}
    for number, cells in re.findall(r"^\|\s*(\d+)[^|]*\|([^|]*)\|", section, flags=re.M):
        for name in re.findall(r"`([\w.]+)`", cells):
            out[name] = int(number)
    assert out, "book/architecture.md has no Layers table"
    return out


def _component(module: str) -> str:
    """``synclib.engine.core`` -> ``engine``; ``synclib`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST):
    """Every ``synclib`` module an AST imports, at load time or inside functions."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("synclib"):
            if node.module == "synclib":
                yield from (f"synclib.{a.name}" for a in node.names if a.name != "__version__")
            else:
                yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("synclib"))


def test_every_import_follows_the_layers_of_the_architecture_page():
    layers = _layers()
    graph: dict[str, set] = {}
    against, unlisted = [], set()
    for path, module in _modules():
        src = _component(module)
        if src not in layers:
            unlisted.add(src)
            continue
        for target in _imports(ast.parse(path.read_text())):
            dst = _component(target)
            if dst == src:
                continue
            if dst not in layers:
                unlisted.add(dst)
            elif layers[dst] > layers[src]:
                against.append(f"{module} (layer {layers[src]}) imports {target} (layer {layers[dst]})")
            elif layers[dst] == layers[src]:
                graph.setdefault(src, set()).add(dst)
    assert not unlisted, f"not in book/architecture.md's Layers table: {sorted(unlisted)}"
    assert not against, "imports against the layers:\n" + "\n".join(against)
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"modules of one layer import each other in a cycle: {exc.args[1]}")


def _module_imports(module: str, path: Path, modules: set) -> set:
    """The package's modules ``module`` imports (at load time or inside functions), counting
    ``from synclib.pkg import mod`` as ``synclib.pkg.mod``; a package's own ``__init__`` not."""
    tree = ast.parse(path.read_text())
    deps = {t for t in _imports(tree) if t in modules}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("synclib"):
            deps |= {f"{node.module}.{a.name}" for a in node.names} & modules
    return {d for d in deps if d != module and not module.startswith(d + ".")}


def test_no_two_modules_import_each_other_in_a_circle():
    """Module by module, lazy imports included: a circle (``a`` imports ``b``, which imports ``a``
    inside a function) means one concept is split over two homes."""
    found = dict((m, p) for p, m in _modules())
    graph = {m: _module_imports(m, p, set(found)) for m, p in found.items()}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"modules import each other in a circle: {' -> '.join(exc.args[1])}")


def test_no_module_over_1000_lines_and_no_function_over_120():
    big, long = [], []
    for path, module in _modules():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            big.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{module}.{node.name}: {n} lines")
    assert not big and not long, big + long


def test_the_config_and_the_engine_load_without_torch():
    """``synclib.config`` reads the engine's vocabularies; neither loads torch or transformers
    (they are imported where the engine uses them), in a fresh interpreter."""
    code = ("import sys, synclib.config, synclib.engine; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_imports_inside_functions_say_why():
    """Imports sit at the top of a module; one of the package's own modules imported inside a
    function (to keep torch, xarray, pandas or altair out of a light module, or to break a cycle
    at load time) says why in a comment on its line or on the line just above."""
    silent = []
    for path, _ in _modules():
        lines = path.read_text().split("\n")
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] if node.level == 0 else []
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                if not any(n == "synclib" or n.startswith("synclib.") for n in names):
                    continue
                line, above = lines[node.lineno - 1], lines[node.lineno - 2].strip()
                if "#" not in line and not above.startswith("#"):
                    silent.append(f"{path.relative_to(REPO)}:{node.lineno}: {line.strip()}")
    assert not silent, "imports inside functions without a comment saying why:\n" + "\n".join(silent)


MAX_PARAMETERS = 10


def test_no_function_takes_more_than_10_parameters():
    """Options that belong together travel as one validated object (a dataclass), as
    scikit-learn's estimators and ``RidgeCV`` do, not as a long list of keywords."""
    many = []
    for path, module in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                n -= bool(a.args and a.args[0].arg in ("self", "cls"))
                if n > MAX_PARAMETERS:
                    many.append(f"{module}.{node.name}: {n} parameters")
    assert not many, many


def _notebook_imports(path: Path):
    """``(module, name)`` of every import in a notebook's code cells (``name`` None for ``import module``)."""
    text = path.read_text()
    for cell in re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        code = "\n".join(line for line in cell.splitlines() if not line.startswith(":"))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom):
                yield from ((node.module or "", a.name) for a in node.names)
            elif isinstance(node, ast.Import):
                yield from ((a.name, None) for a in node.names)


#: what runs a statistical test (module -> its names that do; None: the whole module): a page reads the
#: tests of the claims step (``claims.json``) instead, so that no two pages can judge a claim differently
TESTS = {"synclib.analysis.power": None, "synclib.analysis.planted": None, "scipy": None, "scipy.stats": None,
         "synclib.analysis.cka": {"cka_null"},
         "synclib.stats": {"pearson", "partial_pearson", "correlations_by_group", "compare_groups", "bootstrap_p",
                           "bootstrap_interval", "bca_interval", "acceleration", "rank_p", "holm"}}


def test_no_page_runs_a_statistical_test_while_it_renders():
    """A notebook imports no test (:data:`TESTS`), and of the claims only their constants (the rules'
    numbers, the verdicts' words): the claims and their tests are computed once, by the claims step."""
    notebooks = sorted((REPO / "notebooks").glob("*.md"))
    assert notebooks
    wrong = []
    for nb in notebooks:
        for module, name in _notebook_imports(nb):
            if module in TESTS and (TESTS[module] is None or name in TESTS[module] or name in (None, "*")):
                wrong.append(f"{nb.name}: {module} {name or ''}".rstrip())
            elif module == "synclib.analysis.claims" and not (name or "").isupper():
                wrong.append(f"{nb.name}: {module} {name or ''}".rstrip())
            elif module in ("synclib", "synclib.analysis") and name in ("claims", "power", "planted"):
                wrong.append(f"{nb.name}: {module} {name}")
    assert not wrong, wrong


def test_every_figure_and_table_notebook_draws_its_charts_in_its_own_cells():
    """The chart is in the notebook: every notebook that shows a chart builds it with ``alt.Chart(`` in its
    own code, and none imports a chart from the package (the package's pages are only the theme)."""
    for nb in sorted((REPO / "notebooks").glob("*.md")):
        text = nb.read_text()
        if nb.stem.startswith(("fig", "table")) and nb.stem != "table4_fig10_judge_human" or "alt." in text:
            assert "alt.Chart(" in text, f"{nb.name} draws no chart of its own"
    assert not (PACKAGE / "figures").exists() or not list((PACKAGE / "figures").glob("*.py")), \
        "synclib/figures still holds page modules"


def test_the_top_level_holds_at_most_15_modules():
    """The rest lives in packages that show the layers (tasks, engine, cube, simulate, judge,
    analysis, run, cli), each opened by a docstring a newcomer reads first."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 15, top
    for pkg in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 200, f"synclib/{pkg.name}/__init__.py: no paragraph for a newcomer"
