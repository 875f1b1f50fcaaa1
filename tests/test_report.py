"""The pages that quote measured numbers: notebooks/benchmarks.md quotes bench/results' JSON and says what
is missing; notebooks/fig09_sample_size.md the measured sample-size curves; notebooks/fig02_heatmaps.md how
the maps generalise.  Each page is run here (tests/pages.py) on the files a test gives it."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from pages import run_page
from synclib import paths

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def benchmarks_page(monkeypatch, folder: Path) -> str:
    """The benchmarks page as it reads ``folder`` instead of bench/results."""
    monkeypatch.setattr(paths, "BENCH_RESULTS", folder)
    return run_page("benchmarks").text


def test_missing_results_are_said_to_be_missing(tmp_path, monkeypatch):
    md = benchmarks_page(monkeypatch, tmp_path)
    for script in ("bench_ridge.py", "bench_engine.py", "bench_candidates.py", "bench_analysis.py"):
        assert f"*No result yet: run `python bench/{script}`.*" in md
    assert "not measured yet" in md  # the GPU benchmarks


def test_numbers_come_from_the_json(tmp_path, monkeypatch):
    shutil.copytree(RESULTS, tmp_path, dirs_exist_ok=True)
    stream = {
        "shape": {"episodes": 450, "seeds": 3, "rounds": 8, "layers": 32, "dim": 4096},
        "machine": {"cpu_count": 2}, "write_parts_s": 101.5, "finalize_s": 202.5,
        "cube_file_gib": 10.25, "hidden_variable_gib_in_memory": 5.27, "samples_read_per_fit_gib": 6.35,
        "what": "WHAT", "analysis": {"mask_seconds": 12.5, "analyze_seconds": 333.5, "peak_rss_gib": 9.75,
                                     "n_train": 5200, "n_test": 1300},
    }
    (tmp_path / "analysis_stream_cpu.json").write_text(json.dumps(stream))
    md = benchmarks_page(monkeypatch, tmp_path)
    ridge = json.loads((RESULTS / "ridge_embedded_cpu.json").read_text())
    assert f"| batched grid (ours), one grid | {ridge['ours_per_grid_s']:.3g} |" in md
    engine = json.loads((RESULTS / "engine_cpu.json").read_text())
    for m in engine["modes"].values():
        assert f"| {m['utterances_per_s']:.3g} | {m['prefill_tokens']} |" in md
    cand = json.loads((RESULTS / "candidates_cpu.json").read_text())
    for t in cand["tom_emotions"]:
        assert (f"| {t['paths']['prefix_tree']['seconds']:.3g} | {t['paths']['per_prefix']['seconds']:.3g} "
                f"| {t['speedup']:.3g}x |") in md
    assert "Peak resident memory: 9.75 GiB" in md and "the two variables alone would take 10.5 GiB" in md
    assert "5,200 training and 1,300 test samples" in md and "No result yet" not in md


def test_scheduling_section_quotes_the_seconds_by_part_and_only_the_lines_it_has(tmp_path, monkeypatch):
    """The continuous-batching section gives each mode's seconds by part from the JSON, the reads
    made in the joins, the prompt tokens shared across sessions, and points at the half-batch reference
    line only where the JSON has one."""
    shutil.copytree(RESULTS, tmp_path, dirs_exist_ok=True)
    c = json.loads((RESULTS / "scheduling_cpu.json").read_text())
    r = next(iter(c["results"].values()))
    r.pop("agreement_turns_half_batch", None)
    r["modes"]["continuous"]["seconds"] = {"join": 92.4, "decode": 69.5, "tom": 17.1}
    r["modes"]["continuous"].setdefault("counters", {})["stream_reads"] = 128
    r["modes"]["continuous"]["counters"]["shared_tokens"] = 4162
    r["modes"]["turns"].setdefault("counters", {})["shared_tokens"] = 0
    (tmp_path / "scheduling_cpu.json").write_text(json.dumps(c))
    md = benchmarks_page(monkeypatch, tmp_path)
    # each mode's seconds by part, a column per mode that has them (turns: its own parts, blank in the others)
    assert "| part | turns, s | continuous, s |" in md
    assert "| joins |  | 92.4 |" in md and "| decoding steps |  | 69.5 |" in md
    assert f"| ToM read-outs | {r['modes']['turns']['seconds']['tom']:.3g} | 17.1 |" in md
    assert ("continuous: 128 passive prompts read in the joins, 4,162 prompt tokens taken from blocks that other "
            "sessions stored.") in md
    assert "turns: 0 prompt tokens" not in md and "0 prompt tokens taken" not in md
    assert "For reference, turn by turn at half" not in md
    r["agreement_turns_half_batch"] = {"identical_text_share": 0.5, "max_abs_diff_hidden": 1.0}
    (tmp_path / "scheduling_cpu.json").write_text(json.dumps(c))
    md = benchmarks_page(monkeypatch, tmp_path)
    assert "For reference, turn by turn at half the batch size" in md
    assert "identical texts 50.0 %, largest state difference 1" in md


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    from book_fixtures import tiny_results

    return tiny_results(tmp_path_factory.getbasetemp())


def test_sample_curve_page_quotes_the_benchmark_json(results_dir):
    """Issue 22: the figure 9 page's table of the measured curves carries the numbers of
    bench/results/sample_curve_*.json (read here directly), for every pair, condition and size."""
    from synclib.analysis.sizing import clip_size, load_curves
    from synclib.paths import BENCH_RESULTS

    files = sorted(BENCH_RESULTS.glob("sample_curve_*.json"))
    assert {json.loads(f.read_text())["pair"] for f in files} >= {"S-S", "G-G"}
    text = run_page("fig09_sample_size", results_dir=str(results_dir)).text
    for f in files:
        d = json.loads(f.read_text())
        assert f"**{d['pair']}** (`{f.name}`: one ordered run of {d['settings']['tasks']} embedded tasks" in text
        for cond, pts in d["curve"].items():
            for p in pts:
                if p["sync_r2"] is None:
                    continue
                assert f"{p['sync_r2']:.2f} ± {(p['se'] or 0):.2f}" in text, (d["pair"], cond, p["n_samples"])
        genuine = {p["n_samples"]: p["sync_r2"] for p in d["curve"]["genuine"]}
        # the curve leaves 0 and reaches the paper's ordering: genuine above shuffled and lag 2 with all samples
        full = {c: next(p["sync_r2"] for p in pts if p["n_samples"] in (None, -1, 0))
                for c, pts in d["curve"].items()}
        assert genuine[50] < 0.05 < full["genuine"] and full["genuine"] > max(full["shuffled"], full["lag2"])
    # the size guard reads the same curves
    n, how = clip_size(576, load_curves())
    assert 50 < n < 250 and "sample_curve_S-S.json" in how


def test_where_syncr2_leaves_zero_has_one_source():
    """The point where SyncR² leaves 0 used to read "about 82", "100-200", "80-120" and "122" on
    four pages. The measured curves are its one source (synclib.analysis.sizing.leaves_zero_range /
    leaves_zero_text); the pages' own text and the default config quote the same rounded range."""
    from synclib.analysis.sizing import leaves_zero_range, leaves_zero_text, load_curves
    from synclib.paths import REPO_ROOT

    lo, hi = leaves_zero_range()
    curves = load_curves()
    assert lo == round(min(c.leaves_zero for c in curves) / 10) * 10 and lo < hi
    text = leaves_zero_text()
    assert f"about {lo}-{hi}" in text
    for c in curves:
        assert f"first reaches 0.05 at {c.leaves_zero:.0f}" in text
    for doc in ("notebooks/reproduce.md", "notebooks/embedded_models.md", "config/default.yaml"):
        body = " ".join((REPO_ROOT / doc).read_text().split())  # line breaks as spaces
        assert f"about {lo}-{hi} training samples" in body, doc
        for stale in ("100-200 training samples", "about 82 training", "has at least 250 training samples"):
            assert stale not in body, (doc, stale)


def test_generalisation_sentence_states_the_summary(results_dir, monkeypatch):
    """Issue 38 (3): figure 2's page quotes each run's gap, share of positive test R² and samples; it
    names embedded tiny models as such, leaves out samples the analysis did not record, and says when
    the analysis has no training R² at all."""
    from synclib.analysis import results

    published = results.load_published()
    summary = pd.DataFrame([
        {"run": "S-G", "pair": "S-G", "family": "Cross", "layer_pairs": 60, "train_median": 0.8123,
         "test_median": 0.1234, "gap_median": 0.6889, "gap_mean": 0.7012, "share_positive": 0.65,
         "n_train": 416.0, "n_test": 104.0},
        {"run": "G-S", "pair": "S-G", "family": "Cross", "layer_pairs": 60, "train_median": 0.7,
         "test_median": -0.05, "gap_median": 0.75, "gap_mean": 0.8, "share_positive": 0.4,
         "n_train": math.nan, "n_test": math.nan}])
    summary.attrs["present"] = True
    monkeypatch.setattr(results.Results, "generalisation_summary", lambda self, table=None: summary)
    monkeypatch.setattr(results.Results, "embedded", property(lambda self: True))
    text = run_page("fig02_heatmaps", results_dir=str(results_dir)).text
    assert "These are the embedded tiny models, not the paper's" in text
    assert ("S-G loses a median of 0.689 (mean 0.701; median training R² 0.812, test 0.123) and keeps a positive "
            "test R² in 65% of its 60 layer pairs, on a mean of 416 training and 104 test samples per dataset") in text
    assert "G-S loses a median of 0.750 (mean 0.800; median training R² 0.700, test -0.050) and keeps a positive " \
           "test R² in 40% of its 60 layer pairs." in text
    assert (f"*Paper ({published['fig2']['generalisation_source']}):* {published['fig2']['generalisation']}"
            in text)
    monkeypatch.setattr(results.Results, "embedded", property(lambda self: False))
    assert "embedded tiny models" not in run_page("fig02_heatmaps", results_dir=str(results_dir)).text
    empty = summary.iloc[:0].copy()
    empty.attrs["present"] = False
    monkeypatch.setattr(results.Results, "generalisation_summary", lambda self, table=None: empty)
    text = run_page("fig02_heatmaps", results_dir=str(results_dir)).text
    assert "do not store the maps' training R² (`train_r2`)" in text and "*Paper (" in text


def test_the_gpu_loop_section_quotes_its_json():
    """Issue 52: where the dialog loop's time goes on a GPU (each part's seconds and share of
    the wall time) and the library comparison come from their bench JSON files."""
    from synclib.paths import BENCH_RESULTS

    md = run_page("benchmarks").text
    loop = json.loads((BENCH_RESULTS / "loop_cuda_mistral7b.json").read_text())
    m = loop["results"]["mistral7b"]["modes"]["continuous"]
    assert f"**{m['utterances_per_s']:.3g} utterances/s**" in md
    for part in ("join", "decode", "cube", "passive", "tom"):
        sec = m["seconds"][part]
        assert f"| {sec:.3g} | {100 * sec / m['wall_s']:.0f} % |" in md, part
    lib = json.loads((BENCH_RESULTS / "library_cuda.json").read_text())["results"]
    assert f"| {lib['synclib']['tokens_per_s']:.3g} |" in md and f"| {lib['library']['tokens_per_s']:.3g} |" in md
