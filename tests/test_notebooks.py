"""The notebooks: each runs under papermill on a tiny synthetic results directory and
produces its figure; plus the stats, loader and chart functions the notebooks use."""
from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest

from book_fixtures import NOTEBOOKS, ROOT, execute_notebook, executed_notebooks, tiny_results
from synclib import notebook, stats
from synclib.analysis import results, synthetic
from synclib.figures import report
from synclib.figures import charts

STEMS = [nb.stem for nb in NOTEBOOKS]
CDN = re.compile(r"https?://(cdn|unpkg|fastly|cdnjs)[^\"' ]*", re.I)


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory):
    return tiny_results(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def executed(tmp_path_factory):
    return executed_notebooks(tmp_path_factory.getbasetemp())


def _outputs(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            yield from cell.get("outputs", [])


def _png_is_drawn(b64: str) -> bool:
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("L"))
    return img.shape[0] > 20 and img.shape[1] > 20 and float(img.std()) > 5.0


# --------------------------------------------------------------------------- notebooks
def test_every_figure_and_table_has_a_notebook():
    expected = {"fig01_framework", "fig02_heatmaps", "fig03_04_controls", "fig05_relationship", "fig06_table1_social",
                "fig07_topk", "fig08_clipping", "fig09_sample_size", "table2_persona_disjoint",
                "table5_nonlinear", "fig11_tom", "dialogs", "power", "table4_fig10_judge_human"}
    assert expected == set(STEMS)
    toc = (ROOT / "_toc.yml").read_text()
    for stem in STEMS:
        assert f"book/executed/{stem}" in toc, f"{stem} missing from _toc.yml"


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_source_shape(stem):
    """Parameters cell first (tagged), results_dir declared, no logic copied between notebooks."""
    nb = notebook.read(ROOT / "notebooks" / f"{stem}.md")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert re.search(r"^results_dir = ", code[0].source, re.M)
    assert all(not c.get("outputs") for c in code), "commit notebooks without outputs"
    body = "\n".join(c.source for c in code[1:])
    assert "def " not in body and "class " not in body, "heavy logic belongs in synclib"


#: pages that draw no chart and quote no paper number: the dialogs themselves
NO_FIGURE = ("dialogs",)
#: pages that read nothing of the run's results (table 4 holds a judge against the human
#: ratings given to the page, and quotes the judges measured by bench/bench_judge_human.py)
NO_RESULTS = ("table4_fig10_judge_human",)


@pytest.mark.slow
def test_dialogs_page_runs_and_shows_the_widget(executed, results_dir):
    path, proc = executed["dialogs"]
    assert proc.returncode == 0, f"papermill failed for dialogs:\n{proc.stderr[-3000:]}"
    html = "\n".join(o["data"]["text/html"] for o in _outputs(nbformat.read(path, 4))
                     if "text/html" in o.get("data", {}))
    assert "data-sdlg" in html and "<select" in html and not CDN.search(html)
    text = "\n".join(o["data"]["text/markdown"] for o in _outputs(nbformat.read(path, 4))
                     if "text/markdown" in o.get("data", {}))
    assert "Synthetic test data" in text and re.search(r"\d+ dialogs", text)
    # what the models read: the three prompts (an illustration here: synthetic data has no task texts)
    assert all(f'data-view="{v}"' in html for v in ("active", "passive", "tom")) and 'class="spv-cut"' in html
    assert "illustration" in text


@pytest.mark.slow
def test_controls_page_has_the_pseudo_dyads_and_the_rounds(executed):
    """Ours: the pseudo-dyads (bars, partner rule, claim) and SyncR² per round (chart, trend)."""
    path, proc = executed["fig03_04_controls"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs = list(_outputs(nbformat.read(path, 4)))
    text = "\n".join(o["data"]["text/markdown"] for o in outs if "text/markdown" in o.get("data", {}))
    titles = json.dumps([o["data"][charts.VEGALITE_MIME].get("title") for o in outs
                         if charts.VEGALITE_MIME in o.get("data", {})], ensure_ascii=False)
    assert "SyncR², genuine dyads vs pseudo-dyads" in titles and "SyncR² per round of the dialog" in titles
    assert "Here the partner dialog is the same task under another simulation seed" in text
    assert "Pseudo-dyads, agents of different dialogs, below genuine (ours; not in the paper): **" in text
    assert "Genuine SyncR² per round of the test episodes" in text and "The pseudo-dyads (agents of different dialogs)" in text


@pytest.mark.slow
@pytest.mark.parametrize("stem", [s for s in STEMS if s not in NO_FIGURE])
def test_notebook_runs_and_draws_its_figure(stem, executed, results_dir):
    path, proc = executed[stem]
    assert proc.returncode == 0, f"papermill failed for {stem}:\n{proc.stderr[-3000:]}"
    nb = nbformat.read(path, 4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and str(results_dir) in injected[0].source
    drawn = [o for o in _outputs(nb) if charts.VEGALITE_MIME in o.get("data", {})]
    assert drawn, f"{stem} produced no Vega-Lite chart"
    for o in drawn:
        data = o["data"]
        spec = data[charts.VEGALITE_MIME]
        assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/v6")
        html = data["text/html"]
        assert 'class="synclib-vega"' in html and "vegaEmbed" in html
        assert not CDN.search(html), "chart output must not load anything from a CDN"
        assert "<script src" not in html
        assert _png_is_drawn(data["image/png"]), "the static PNG fallback is blank"
        assert "tooltip" in json.dumps(spec), "charts should show values on hover"
    text = "\n".join(o["data"]["text/markdown"] for o in _outputs(nb)
                     if "text/markdown" in o.get("data", {}))
    if stem in NO_RESULTS:  # nothing of the synthetic run is shown, so nothing to label
        assert "Synthetic test data" not in text
    else:
        assert "Synthetic test data" in text, "synthetic results must be labelled as such"
    assert "*Paper (" in text or "Paper claim (" in text, "each notebook shows the paper's number or claim beside ours"
    assert re.search(r"\d\.\d", text), "the sentence should state numbers from the data"


@pytest.mark.slow
def test_table1_with_ability_scores_is_honest_about_n(results_dir, tmp_path):
    """With ability scores for 3 pairs, table 1 says a partial r needs 4 pairs instead of faking one."""
    res = results.load_results(results_dir)
    models = sorted({p.model_a for p in res.runs} | {p.model_b for p in res.runs})
    csv = tmp_path / "ability.csv"
    pd.DataFrame({"model": models, "ifeval": np.linspace(30, 60, len(models)),
                  "musr": np.linspace(5, 15, len(models))}).to_csv(csv, index=False)
    nb = ROOT / "notebooks" / "fig06_table1_social.md"
    out = tmp_path / "out.ipynb"
    proc = execute_notebook(nb, out, {"results_dir": results_dir, "ability_scores": csv})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = "\n".join(o["data"]["text/markdown"] for o in _outputs(nbformat.read(out, 4))
                     if "text/markdown" in o.get("data", {}))
    assert "No ability scores were given" not in text
    assert "needs at least 4" in text


# --------------------------------------------------------------------------- results loader
def test_results_tables(results_dir):
    from synclib.figures import fig03_04_controls, fig06_table1_social, fig09_sample_size

    res = results.load_results(results_dir)
    assert res.synthetic and res.run_names == ["S-S", "S-G", "G-S", "G-G"]
    assert res.pair_names == ["S-S", "S-G", "G-G"] and res.orders_played() == "both"
    sync = res.sync_table()
    assert list(sync["pair"]) == res.pair_names and list(sync["orders"]) == [1, 2, 1]
    assert (sync["mean"].between(0, 1)).all() and (sync["n_values"] >= 2).all()
    # a pair's SyncR² is the mean of its four directional values (2 directions x 2 orders),
    # its band the mean of their standard errors (the reference's)
    g = [res.analysis(r)[v].sel(condition="genuine").values for r in ("S-G", "G-S")
         for v in ("sync_r2", "sync_r2_se")]
    row = sync.set_index("pair").loc["S-G"]
    assert row["mean"] == pytest.approx(np.mean(np.r_[g[0], g[2]]))
    assert row["se"] == pytest.approx(np.mean(np.r_[g[1], g[3]]))
    assert len(res.sync_table(separate=True)) == 4
    hm = res.heatmap_frame(res.run_names[0])
    assert hm.groupby("src_layer")["best"].sum().eq(1).all(), "one best target per source layer"
    best = hm[hm["best"]].set_index("src_layer")["r2"]
    assert np.allclose(best, hm.groupby("src_layer")["r2"].max().loc[best.index])
    lag = fig03_04_controls.lag_table(res)
    assert set(lag["k"]) >= {0, 1, 2}
    # social performance: the mean over the pair's orders
    social = res.social_table().set_index("pair")["social"]
    assert social["S-G"] == pytest.approx((res.run_social("S-G") + res.run_social("G-S")) / 2)
    pt = res.pair_table()
    assert pt["social"].notna().all() and not pt["fit"].any()  # one pair per family
    # table 1 as compute_partial_correlation: the order-1 run's social score, the A->B
    # SyncR² of both orders
    scores = pd.DataFrame({"model": ["synthetic-S", "synthetic-G"], "ifeval": [1, 2], "musr": [3, 4]})
    ab = fig06_table1_social.ability_table(res, scores)
    row = ab.set_index("pair").loc["S-G"]
    assert row["social"] == pytest.approx(res.run_social("S-G"))
    assert row["sync"] == pytest.approx(np.mean([res.analysis(r)["sync_r2"].sel(condition="genuine",
                                                                                direction="A->B").item()
                                                 for r in ("S-G", "G-S")]))
    assert row["ifeval"] == 1.5
    # figure 4a's error bar is the reference's
    control = fig03_04_controls.control_table(res)
    fam = control[(control.family == "Cross") & (control.condition == "genuine")].iloc[0]
    assert fam["se"] == pytest.approx(stats.reference_family_se([row_mean for row_mean in
                                                                 sync[sync.family == "Cross"]["mean"]], 3))
    assert {"genuine", "passive", "shuffled"} <= set(control["condition"])
    judge = res.judge(res.run_names[0])
    assert (judge["judge"] == synthetic.SYNTHETIC_JUDGE).all()
    # figure 9: the sweep, then the run's full size (its mean training + test samples) where larger
    size = fig09_sample_size.sample_size_table(res)
    for pair, t in size.groupby("pair"):
        sweep, full = t[t["point"] == "sweep"], t[t["point"] == "full run"]
        runs = res.runs_of(pair)
        n = np.concatenate([(res.analysis(r.name)["n_train"] + res.analysis(r.name)["n_test"])
                            .sel(condition="genuine").values.ravel() for r in runs])
        assert list(sweep["n_samples"]) == [40, 80, 120]
        if n.mean() > 120:
            assert len(full) == 1 and full["n_samples"].item() == round(n.mean())
            assert full["mean"].item() == pytest.approx(sync.set_index("pair").loc[pair, "mean"])
        else:
            assert full.empty
    assert "S-S from" in fig09_sample_size.sentence_sample_size(size, results.load_published())
    # pages name a results directory inside the repository relative to it, never by a machine path
    inside = results.Results(root=ROOT / "results" / "x", manifest={"name": "x"}, runs=res.runs)
    assert "results: results/x (x," in inside.describe() and str(ROOT) not in inside.describe()


def test_generalisation_table_is_the_analysis_averaged_by_hand(results_dir):
    """Issue 38 (3): training and test R² per layer pair are the analysis' ``train_r2`` and
    ``r2`` (genuine) averaged over split seeds; the summary and the sentence state its numbers."""
    from synclib.figures import fig02_heatmaps as fig

    res = results.load_results(results_dir)
    gen = fig.generalisation_table(res)
    assert list(dict.fromkeys(gen["run"])) == res.run_names
    for name in res.run_names:
        ds, run = res.analysis(name), res.run(name)
        for direction in ("A->B", "B->A"):
            train, test = (ds[v].sel(condition="genuine", direction=direction)
                           .transpose("split_seed", "src_layer", "tgt_layer").values for v in ("train_r2", "r2"))
            finite = np.isfinite(train).all(0) & np.isfinite(test).all(0)
            sub = gen[(gen["run"] == name) & (gen["direction"] == direction)]
            assert len(sub) == int(finite.sum()) > 0 and (sub["n_seeds"] == train.shape[0]).all()
            src = run.model_a if direction == "A->B" else run.model_b
            assert (sub["source"] == src).all() and (sub["pair"] == run.pair).all()
            for row in sub.itertuples():  # layers are 1-based as in the heatmaps
                i, j = row.src_layer - 1, row.tgt_layer - 1
                assert row.train_r2 == pytest.approx(train[:, i, j].mean())
                assert row.test_r2 == pytest.approx(test[:, i, j].mean())
                assert row.gap == pytest.approx(train[:, i, j].mean() - test[:, i, j].mean())
    assert (gen["train_r2"] > gen["test_r2"]).mean() > 0.5  # ridge fits its own rows better
    # the test R² column is heatmap_frame's value (r2_mean) for the same run and direction
    hm = res.heatmap_frame("S-G", direction="B->A").set_index(["src_layer", "tgt_layer"])["r2"]
    sg = gen[(gen["run"] == "S-G") & (gen["direction"] == "B->A")].set_index(["src_layer", "tgt_layer"])["test_r2"]
    assert np.allclose(sg.sort_index(), hm.sort_index())
    summary = fig.generalisation_summary(res, gen)
    counts = res.sample_counts()
    for row in summary.itertuples():
        sub = gen[gen["run"] == row.run]
        assert row.layer_pairs == len(sub)
        assert row.gap_median == pytest.approx(np.median(sub["train_r2"] - sub["test_r2"]))
        assert row.gap_mean == pytest.approx(np.mean(sub["train_r2"] - sub["test_r2"]))
        assert row.share_positive == pytest.approx(np.mean(sub["test_r2"] > 0))
        n = res.analysis(row.run)["n_train"].sel(condition="genuine").values
        assert row.n_train == pytest.approx(n[n > 0].mean())
        assert row.n_test == pytest.approx(counts[(counts["run"] == row.run)
                                                  & (counts["condition"] == "genuine")]["n_test"].mean())
    published = results.load_published()
    text = fig.sentence_generalisation(summary, published, embedded=res.embedded)
    for row in summary.itertuples():
        assert (f"{row.run} loses a median of {row.gap_median:.3f} (mean {row.gap_mean:.3f}; median training R² "
                f"{row.train_median:.3f}, test {row.test_median:.3f}) and keeps a positive test R² in "
                f"{100 * row.share_positive:.0f}% of its {row.layer_pairs} layer pairs, on a mean of {row.n_train:.0f} "
                f"training and {row.n_test:.0f} test samples per dataset") in text
    assert "generalizes well to the test set" in text and "embedded tiny models" not in text
    assert "embedded tiny models, not the paper's" in fig.sentence_generalisation(summary, published, True)
    # the chart: one hoverable point per layer pair, the diagonal; a run without train_r2 is left out
    spec = fig.generalisation_scatter(gen, "t").to_dict()
    assert "tooltip" in json.dumps(spec) and len(spec["layer"]) == 3
    res._analysis["G-G"] = res.analysis("G-G").drop_vars("train_r2")
    assert "G-G" not in set(fig.generalisation_table(res)["run"])
    # an empty table: values that could not be computed, or analyses without train_r2 at all
    assert "none of its values could be computed" in fig.sentence_generalisation(
        fig.generalisation_summary(res, gen.iloc[:0]), published)
    for name in res.run_names:
        res._analysis[name] = res.analysis(name).drop_vars("train_r2", errors="ignore")
    assert "lack `train_r2`" in fig.sentence_generalisation(fig.generalisation_summary(res), published)
    assert fig.generalisation_scatter(gen.iloc[:0], "none").to_dict()["mark"]["type"] == "text"


def test_load_results_errors_name_the_file(tmp_path):
    with pytest.raises(results.ResultsError, match="manifest.json"):
        results.load_results(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"pairs": [{"name": "S-S"}]}))
    with pytest.raises(results.ResultsError, match=r"pairs\[0\] lacks field.*model_a"):
        results.load_results(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(results.ResultsError, match="not valid JSON"):
        results.load_results(tmp_path)


def test_load_ability_scores_validates(tmp_path):
    from synclib.figures.fig06_table1_social import load_ability_scores

    bad = tmp_path / "a.csv"
    bad.write_text("model,ifeval\nx,1\n")
    with pytest.raises(results.ResultsError, match=r"missing column.*musr"):
        load_ability_scores(bad)
    bad.write_text("Model,IFEval,MuSR\nx,high,3\n")
    with pytest.raises(results.ResultsError, match="non-numeric"):
        load_ability_scores(bad)
    bad.write_text("Model,IFEval,MuSR,source\nx,50.5,3,leaderboard\n")
    df = load_ability_scores(bad)
    assert df.loc[0, "ifeval"] == 50.5 and "source" in df


def test_published_numbers_have_sources():
    pub = results.load_published()
    for key, entry in pub.items():
        if isinstance(entry, dict) and key != "models":
            assert entry.get("source"), f"published[{key!r}] has no source"
    assert [d["r"] for d in pub["fig6"]["pearson"]] == [0.88, 0.89, 0.99]
    assert pub["table2"]["rows"][2]["persona-disjoint"] == [0.74, 0.05]


# --------------------------------------------------------------------------- stats
def test_pearson_matches_numpy_and_refuses_small_n():
    rng = np.random.default_rng(1)
    x = rng.normal(size=12)
    y = 0.5 * x + rng.normal(size=12)
    c = stats.pearson(x, y)
    assert c.ok and c.n == 12 and np.isclose(c.r, np.corrcoef(x, y)[0, 1])
    assert 0 < c.p < 1
    small = stats.pearson([1.0, 2.0], [3.0, 1.0])
    assert not small.ok and np.isnan(small.r) and "at least 3" in small.reason
    assert "no r" in small.describe()
    flat = stats.pearson([1, 2, 3], [2, 2, 2])
    assert not flat.ok and "does not vary" in flat.reason
    three = stats.pearson([1, 2, 3], [1, 3, 2])
    assert three.ok and "not evidence" in three.describe()


def test_partial_pearson_matches_residual_correlation():
    rng = np.random.default_rng(2)
    z = rng.normal(size=30)
    x = z + rng.normal(size=30)
    y = z + 0.5 * x + rng.normal(size=30)
    df = pd.DataFrame({"x": x, "y": y, "z": z})
    c = stats.partial_pearson(df, "x", "y", "z")
    rx = x - np.polyval(np.polyfit(z, x, 1), z)
    ry = y - np.polyval(np.polyfit(z, y, 1), z)
    assert c.ok and np.isclose(c.r, np.corrcoef(rx, ry)[0, 1], atol=1e-6)
    few = stats.partial_pearson(df.head(3), "x", "y", "z")
    assert not few.ok and "needs at least 4" in few.reason
    with pytest.raises(KeyError, match="'w'"):
        stats.partial_pearson(df, "x", "y", "w")


def test_mean_se_and_pair_ability():
    m, s = stats.mean_se([1.0, 2.0, 3.0, np.nan])
    assert m == 2.0 and np.isclose(s, 1.0 / np.sqrt(3))
    assert np.isnan(stats.mean_se([4.0])[1])
    pairs = pd.DataFrame({"model_a": ["a", "a"], "model_b": ["b", "c"]})
    scores = pd.DataFrame({"model": ["a", "b"], "ifeval": [10.0, 20.0], "musr": [1.0, 3.0]})
    out = stats.pair_ability(pairs, scores)
    assert out.loc[0, "ifeval"] == 15.0 and np.isnan(out.loc[1, "ifeval"])


def test_partial_table_uses_ability(tmp_path):
    from synclib.figures.fig06_table1_social import partial_table, sentence_table1

    rng = np.random.default_rng(3)
    n = 8
    t = pd.DataFrame({"family": ["F"] * n, "sync": rng.normal(size=n),
                      "social": rng.normal(size=n), "ifeval": rng.normal(size=n),
                      "musr": rng.normal(size=n)})
    table = partial_table(t)
    assert list(table["family"]) == ["F", "All pairs"]
    assert np.isfinite(table["ifeval"]).all() and np.isfinite(table["musr"]).all()
    assert "r = " in sentence_table1(table, "x.csv", results.load_published())


# --------------------------------------------------------------------------- plots
def test_offline_renderer_bundle_has_no_cdn_and_a_drawn_png():
    frame = pd.DataFrame({"src_layer": [1, 1, 2, 2], "tgt_layer": [1, 2, 1, 2],
                          "r2": [0.5, -0.1, 0.2, 0.3], "best": [True, False, False, True]})
    chart = charts.r2_heatmap(frame, title="t")
    bundle = charts.offline_renderer(chart.to_dict())
    assert set(bundle) == {charts.VEGALITE_MIME, "text/html", "text/plain", "image/png"}
    assert not CDN.search(bundle["text/html"]) and "http" not in bundle["text/html"].split(
        "var spec")[0]
    assert _png_is_drawn(bundle["image/png"])
    spec = json.dumps(bundle[charts.VEGALITE_MIME])
    assert charts.NEGATIVE_GREY in spec and '"stroke": "black"' in spec


@pytest.mark.parametrize("n_layers", [5, 9, 17, 25, 29, 31, 32, 33, 65])
def test_heatmap_layer_ticks_are_evenly_spaced(n_layers):
    """Ticks every few layers, the first and the last layer labelled, and no two labels crowded
    (31 layers used to end ..., 24, 28, 30)."""
    grid = np.arange(n_layers)
    frame = pd.DataFrame({"src_layer": np.repeat(grid, n_layers), "tgt_layer": np.tile(grid, n_layers),
                          "r2": 0.1, "best": False})
    spec = charts.r2_heatmap(frame, title="t").to_dict()
    encoding = spec["layer"][0]["encoding"] if "layer" in spec else spec["encoding"]
    for axis in ("x", "y"):
        ticks = encoding[axis]["axis"]["values"]
        assert ticks[0] == 0 and ticks[-1] == n_layers - 1 and len(ticks) <= 9
        gaps = np.diff(ticks)
        step = gaps[0]
        assert (gaps[:-1] == step).all() and step <= gaps[-1] < 2 * step, ticks


def test_readable_tables_show_whole_text_and_formatted_numbers():
    """Tables on the pages: no row numbers, three decimals, p-values as format_p writes them,
    a dash for missing values, long notes whole (pandas cuts them at 50 characters)."""
    note = "no r (only 1 point; a correlation needs at least 3 points, here 1)" * 2
    frame = pd.DataFrame({"group": ["a", "b"], "n": [1, 3], "r": [np.nan, 0.999176],
                          "p": [np.nan, 0.0002], "musr p": [0.02584, np.nan], "note": [note, "y"]})
    html = report.readable(frame).to_html()
    assert note in html and ">0.999<" in html and "&lt; 0.001" in html and ">0.026<" in html
    assert html.count(">–<") == 3 and 'class="dataframe"' in html and "0.999176" not in html
    assert ">0<" not in html and ">1<" in html  # n stays an integer; no row numbers


def test_empty_frames_give_a_placeholder_chart():
    chart = charts.lines_with_se(pd.DataFrame(), x="k", series="pair", title="none")
    spec = chart.to_dict()
    assert spec["mark"]["type"] == "text" and "no data" in json.dumps(spec)


@pytest.mark.slow
@pytest.mark.long
def test_controls_notebook_without_a_passive_run(tmp_path):
    """A run with ``simulate.passive: false`` has no passive condition; the controls page says so."""
    root = synthetic.build_synthetic_results(tmp_path / "no-passive", cube_kwargs={"passive": False},
                                           analyze_kwargs={"tom": False})
    assert "passive" not in results.load_results(root).conditions()
    out = tmp_path / "out.ipynb"
    proc = execute_notebook(ROOT / "notebooks" / "fig03_04_controls.md", out, {"results_dir": root})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = "\n".join(o["data"]["text/markdown"] for o in _outputs(nbformat.read(out, 4))
                     if "text/markdown" in o.get("data", {}))
    assert "no passive-reader condition" in text


# --------------------------------------------------------------------------- papermill routes
@pytest.mark.long
def test_synclib_notebooks_runs_chosen_notebooks(results_dir, tmp_path):
    """`synclib notebooks --results DIR NAMES -p k v`: executed copies with the parameters;
    bad input refused before anything runs."""
    import subprocess
    import sys

    from book_fixtures import kernel_env

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "synclib", "notebooks", *args], capture_output=True,
                              text=True, env=kernel_env(), timeout=600, cwd=tmp_path)

    out = tmp_path / "executed"
    p = cli("--results", str(results_dir), "fig09", "--out", str(out))
    assert p.returncode == 0, p.stderr
    nb = nbformat.read(out / "fig09_sample_size.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and str(results_dir) in injected[0].source
    assert any(o.get("output_type") == "display_data" for o in _outputs(nb))
    assert "1 notebook(s) executed" in p.stdout
    for args, said in ((["--results", str(tmp_path)], "no manifest.json"),
                       (["--results", str(results_dir), "fig99"], "matches none; choose from"),
                       (["--results", str(results_dir), "fig0"], "matches fig01_framework, fig02_heatmaps"),
                       (["--results", str(results_dir), "fig09", "-p", "colour", "red"],
                        "-p colour: no chosen notebook declares")):
        p = cli(*args, "--out", str(tmp_path / "never"))
        assert p.returncode == 2 and said in p.stderr, (args, p.stderr)
    assert not (tmp_path / "never").exists()


def test_synclib_notebooks_names_the_failing_notebook_and_cell(results_dir, tmp_path, monkeypatch, capsys):
    from synclib import cli
    from synclib import notebook as nbmod

    folder = tmp_path / "nbs"
    folder.mkdir()
    head = ("---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
            "kernelspec:\n  display_name: Python 3\n  language: python\n  name: python3\n---\n\n")
    params = "```{code-cell}\n:tags: [parameters]\n\nresults_dir = 'x'\n```\n\n"
    (folder / "a_good.md").write_text(head + "# Good\n\n" + params + "```{code-cell}\nprint(results_dir)\n```\n")
    (folder / "b_bad.md").write_text(head + "# Bad\n\n" + params + "```{code-cell}\nx = 1\n```\n\n"
                                     "```{code-cell}\nraise RuntimeError('no such table')\n```\n")
    monkeypatch.setattr(nbmod, "NOTEBOOK_DIR", folder)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    rc = cli.main(["notebooks", "--results", str(results_dir), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "b_bad: cell" in err and "RuntimeError: no such table" in err and "1 of 2 failed: b_bad" in err
    assert (tmp_path / "out" / "a_good.ipynb").is_file() and (tmp_path / "out" / "b_bad.ipynb").is_file()


def test_readme_papermill_command_runs_as_printed(results_dir, tmp_path):
    """The README's papermill line (a jupytext pipe), copied as printed, executes a notebook;
    only the results directory is pointed at the test's results."""
    import os
    import shutil
    import subprocess
    import sys

    from book_fixtures import kernel_env

    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if ln.startswith("jupytext --to ipynb -o - notebooks/"))
    assert "| papermill - " in line and "-p results_dir results/embedded" in line
    work = tmp_path / "checkout"
    shutil.copytree(ROOT / "notebooks", work / "notebooks")
    env = kernel_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    cmd = line.replace("results/embedded", str(results_dir))
    p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], cwd=work, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = work / line.split("| papermill - ")[1].split()[0]
    nb = nbformat.read(out, as_version=4)
    assert any(o.get("output_type") == "display_data" for o in _outputs(nb))
    assert not any(o.get("output_type") == "error" for o in _outputs(nb))


@pytest.mark.long
def test_parameter_mistakes_get_one_synclib_line_on_every_route(results_dir, tmp_path):
    """A misspelt parameter, a run or direction that does not exist and a results directory that
    is not one: each is refused before the notebook computes anything, in one line that says what
    is valid, with a non-zero exit, whichever route ran the notebook (issue 35)."""
    import os
    import subprocess
    import sys

    from book_fixtures import kernel_env

    nb = str(ROOT / "notebooks" / "fig02_heatmaps.md")
    runs = ", ".join(results.load_results(results_dir).run_names)

    def run(*args):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=kernel_env(),
                              timeout=600, cwd=tmp_path)

    def module(*params):
        return run("-m", "synclib.cli.notebooks", nb, str(tmp_path / "o.ipynb"), *params)

    cases = [
        (module("-p", "results_dir", str(results_dir), "-p", "directon", "B->A"), 2,
         "synclib: unknown parameter 'directon': fig02_heatmaps's parameters are columns, direction, panel_size, "
         "results_dir, runs, vmax"),
        (module("-p", "results_dir", str(results_dir), "-p", "direction", "B-A"), 1,
         "synclib: direction = 'B-A': choose from A->B, B->A"),
        (module("-p", "results_dir", str(tmp_path)), 1, "synclib: results_dir = "),
        (run("-m", "synclib", "notebooks", "--results", str(results_dir), "fig02", "-p", "runs", "[X-Y]",
             "--out", str(tmp_path / "x")), 1,
         "synclib notebooks: fig02_heatmaps: runs = ['X-Y']: 'X-Y' is not an ordered run of"),
    ]
    for proc, rc, said in cases:
        assert proc.returncode == rc, (said, proc.stderr[-2000:])
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert any(ln.startswith(said) for ln in err), (said, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"choose from {runs}" in cases[3][0].stderr

    # the papermill pipe: papermill exits non-zero (it only warned and ran the default before); the
    # kernel's part of its report is synclib's one line (papermill's own command line adds its frames)
    env = kernel_env()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    pipe = (f"jupytext --to ipynb -o - {nb} | papermill - {tmp_path / 'p.ipynb'} "
            f"-p results_dir {results_dir} -p directon B-A")
    p = subprocess.run(["bash", "-c", "set -o pipefail; " + pipe], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert p.returncode != 0
    assert "synclib: unknown parameter 'directon'" in p.stdout + p.stderr
    # in the executed notebook (what JupyterLab shows) the error is that line alone, no traceback
    errors = [o for o in _outputs(nbformat.read(tmp_path / "p.ipynb", as_version=4)) if o["output_type"] == "error"]
    assert len(errors) == 1 and errors[0]["traceback"] == [
        "synclib: unknown parameter 'directon': this notebook's parameters are columns, direction, panel_size, "
        "results_dir, runs, vmax"]


def test_heatmap_knobs_are_parameters(results_dir, tmp_path):
    """The knobs a student reaches for first on figure 2 (which runs, colour scale, panel size,
    panels per row) are parameters, not edits of synclib."""
    from book_fixtures import execute_notebook

    res = results.load_results(results_dir)
    out = tmp_path / "fig02.ipynb"
    proc = execute_notebook(ROOT / "notebooks" / "fig02_heatmaps.md", out,
                            {"results_dir": results_dir, "runs": res.run_names[1], "vmax": 0.9, "panel_size": 280,
                             "columns": 1})
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec = next(v for o in _outputs(nbformat.read(out, as_version=4)) for k, v in o.get("data", {}).items()
                if k.startswith("application/vnd.vegalite"))
    text = json.dumps(spec)
    assert '"domain": [0, 0.9]' in text and '"width": 280' in text
    assert res.run_names[1] in text and res.run_names[0] + " genuine" not in text


def test_the_parameters_page_lists_every_notebooks_parameters():
    from synclib.notebook import figure_notebooks, parameters, parameters_markdown

    page = parameters_markdown()
    for nb in figure_notebooks():
        for name in parameters(nb):
            assert f"| `{nb.stem}` | `{name}` |" in page, (nb.stem, name)
    assert "| `fig02_heatmaps` | `vmax` | `None` | upper end of the colour scale" in page


def test_topk_sentence_is_true_of_the_ks_drawn(results_dir):
    """Figure 7's sentence names the largest k of the table it is given: every partner layer only
    where that k is the partner's depth (a student who filters to k <= 2 gets "of its partner's 5
    layers"; a pair of models of two depths, "of the partners' 4 and 5 layers")."""
    from synclib.figures import fig07_topk

    res = results.load_results(results_dir)
    topk = fig07_topk.topk_table(res)
    published = results.load_published()
    full = fig07_topk.sentence_topk(topk, fig07_topk.topk_correlations(res), published)
    assert "S-S from" in full and "(k = 5, all its partner's layers)" in full
    assert "(k = 4, of the partners' 4 and 5 layers)" in full  # S-G: its targets have 4 and 5 layers
    few = fig07_topk.sentence_topk(topk[topk["k"] <= 2], fig07_topk.topk_correlations(res), published)
    assert "all its partner's layers" not in few and "(k = 2, of its partner's 5 layers)" in few


def _documented_commands() -> list[tuple[str, str]]:
    """Every command line that runs a notebook in the README, the book's pages and synclib's
    docstrings: ``(file, command)``, continuation lines joined, Markdown's inline code spans
    included; commands with placeholders (``NB OUT``, ``notebooks/NAME.md``) left out."""
    sources = [ROOT / "README.md", *sorted((ROOT / "book").glob("*.md")), ROOT / "synclib" / "notebook.py",
               ROOT / "synclib" / "cli" / "notebooks.py"]
    start = re.compile(r"(synclib notebooks |python -m synclib\.cli\.notebooks |jupytext --to ipynb )")
    out = []
    for path in sources:
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        fenced = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
        rest = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.S)
        lines = [ln for block in fenced for ln in block.splitlines()]
        if path.suffix == ".md":  # inline code, across lines
            lines += [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", rest)]
        else:                     # a docstring's literal block
            lines += [ln for ln in rest.splitlines() if "`" not in ln]
        for ln in lines:
            m = start.search(ln)
            if m and len(ln[m.end():].split()) >= 2 and not re.search(r"\b[A-Z]{2,}\b", ln):  # not prose
                out.append((path.name, ln[m.start():].strip()))
    return list(dict.fromkeys(out))


def _pairs(tokens: list[str], flag: str) -> dict:
    """``{NAME: VALUE}`` of every ``flag NAME VALUE`` in ``tokens``."""
    from synclib.cli.notebooks import _value

    return {tokens[i + 1]: _value(tokens[i + 2]) for i, t in enumerate(tokens[:-2]) if t == flag}


def test_documented_notebook_commands_run_as_the_shell_reads_them():
    """Each documented command, split as the shell splits it (an unquoted ``B->A`` is a redirection),
    names notebooks that exist and parameters they declare: what `synclib notebooks` checks before
    it runs anything."""
    import shlex

    from synclib.cli import build_parser
    from synclib.cli.notebooks import request

    commands = _documented_commands()
    assert {f for f, _ in commands} >= {"README.md", "reproduce.md", "notebook.py", "notebooks.py"}
    parser = build_parser(only="notebooks")
    for where, cmd in commands:
        lex = shlex.shlex(cmd, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        tokens = list(lex)
        ops = [t for t in tokens if t and set(t) <= set("();<>|&") and t != "|"]
        assert not ops, f"{where}: the shell reads {ops} in `{cmd}` as an operator (quote the value)"
        pipeline = " ".join(tokens).split(" | ")
        nb = None
        for part in pipeline:
            seg = part.split(" ")
            if seg[:2] == ["synclib", "notebooks"]:
                args = parser.parse_args(seg[1:])
                request(args.names, _pairs(seg, "-p"))  # raises, naming the notebook or parameter
                continue
            if seg[:3] == ["python", "-m", "synclib.cli.notebooks"] or seg[0] == "jupytext":
                nb = ROOT / next(t for t in seg if t.endswith(".md"))
                assert nb.is_file(), f"{where}: {nb} does not exist"
            params = _pairs(seg, "-p")
            assert nb is not None and set(params) <= set(notebook.parameters(nb)), f"{where}: `{cmd}`"
