"""Every contrast on the same rows (issue 63, item 1): genuine against each control fitted on the
samples both hold (:mod:`synclib.analysis.contrasts`), so that only the targets differ; and what
the pages say of them.  Units: SyncR² (R² averaged over source layers) and sample counts."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from synclib.analysis import analyze
from synclib.analysis.contrasts import common_rows, contrast_fits
from synclib.analysis.samples import build_dataset
from synclib.analysis.scores import seed_aggregate
from synclib.analysis.sizing import planned_samples
from synthetic import Planted, Shapes, make_synthetic_cube

QUIET = dict(progress=False, log=lambda m: None)


def test_each_contrast_fits_both_sides_on_the_same_rows():
    """Per contrast, direction and split seed the two sides have the same training and test
    counts; a lag's contrast has the lag's rows, fewer than genuine's own; where a control holds
    exactly genuine's rows (shuffled; passive with every seed read) its contrast is the conditions'
    own fits, value for value."""
    cube = make_synthetic_cube(n_episodes=24, n_seeds=2, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=12, layers_b=3, dim_b=12), seed=1)
    rng = np.random.default_rng(5)  # a second reader (told it is the agent it replaces): the first's states, moved
    for side in "ab":
        v = cube[f"hidden_{side}_passive"]
        cube[f"hidden_{side}_passive_own"] = (v.dims, v.values + 0.1 * rng.standard_normal(v.shape))
    out = analyze(cube, conditions=["genuine", "passive", "passive_own", "shuffled", "pseudo"], lags=[1, 2],
                  n_samples=None, alpha=0.1, n_boot=50, cka=False, **QUIET)
    assert list(out["contrast"].values) == ["passive", "passive_own", "shuffled", "pseudo", "lag1", "lag2"]
    # two seeds per task: every pseudo-dyad's partner is the same task's other conversation
    assert (out["pseudo_same_task"] == 1.0).all() and "same task" in out.attrs["pseudo_partner"]
    # a lag's size-matched genuine (issue 74, item 3): the contrast's size, every split; none for other controls
    for lag in ("lag1", "lag2"):
        assert out["n_train_matched"].sel(contrast=lag).values.tolist() == \
            out["n_train_contrast"].sel(contrast=lag, side="genuine").values.tolist()
    assert np.isfinite(out["sync_r2_matched_pooled"].sel(contrast=["lag1", "lag2"])).all()
    assert np.isnan(out["sync_r2_matched_pooled"].sel(contrast="passive")).all()
    assert out["sync_r2_matched_boot"].sizes["boot"] == 50
    for var in ("n_train_contrast", "n_test_contrast"):
        v = out[var]
        assert (v.sel(side="genuine") == v.sel(side="control")).all() and (v > 0).all(), var
    own = out["n_train"]
    lag2 = out["n_train_contrast"].sel(contrast="lag2", side="genuine")
    assert (lag2 < own.sel(condition="genuine")).all()  # genuine on lag 2's rows: fewer than all its own
    for c in ("shuffled", "passive", "passive_own"):
        per = out["sync_r2_contrast"].sel(contrast=c)
        np.testing.assert_array_equal(per.sel(side="genuine").values, out["sync_r2_per_seed"].sel(condition="genuine").values)
        np.testing.assert_array_equal(per.sel(side="control").values, out["sync_r2_per_seed"].sel(condition=c).values)
        np.testing.assert_array_equal(out["sync_r2_contrast_boot"].sel(contrast=c, side="control").values,
                                      out["sync_r2_boot"].sel(condition=c).values)
    assert "samples both hold" in out.attrs["contrast_rule"]
    # the sides' rows are the same positions: the contrast of lag 2 fitted again by hand
    g, c = build_dataset(cube, "A->B", "genuine"), build_dataset(cube, "A->B", "lag2")
    gi, ci = common_rows(g, c)
    assert np.array_equal(g.episode[gi], c.episode[ci]) and np.array_equal(g.round[gi], c.round[ci])
    assert np.array_equal(g.x_rows[gi], c.x_rows[ci])  # the same source states: only the targets differ
    assert not np.array_equal(g.y_rows[gi], c.y_rows[ci])


def _late_synchrony_cube():
    """Synchrony planted in the last three rounds only: there agent 2's state is agent 1's plus a
    little noise; before, it is unrelated noise of half the spread."""
    cube = make_synthetic_cube(n_episodes=40, n_seeds=1, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=16, layers_b=3, dim_b=16), seed=7,
                               planted=Planted(min_utterances=12), passive=False, tom=False)
    rng = np.random.default_rng(0)
    a = cube["hidden_a"].values
    h = rng.standard_normal(a.shape) * 0.5 * np.nanstd(a)
    h[:, :, 3:] = a[:, :, 3:] + 0.1 * np.nanstd(a) * rng.standard_normal(a[:, :, 3:].shape)
    cube["hidden_b"] = (cube["hidden_b"].dims, h)
    return cube


def test_a_contrast_whose_only_difference_is_the_rows_positions_shows_no_gap():
    """A "control" that is genuine itself on lag 2's positions (the last two rounds missing), where
    synchrony lives in the last rounds: each on its own samples, genuine is well above it (the
    positions alone); on the rows both hold the two sides are the same fits and the gap is 0."""
    from synclib.analysis.context import Context
    from synclib.analysis.samples import HiddenCache
    from synclib.penalty import Penalty
    from synclib.analysis.blocks import _fit_splits, own_splits

    cube = _late_synchrony_cube()
    ctx = Context(cube=cube, directions=("A->B",), split_seeds=[0, 1, 2], n_samples=None, penalty=Penalty("cv"),
                  device=None, precision="float32", max_resident_bytes=None, progress=False, log=lambda m: None,
                  arrays=HiddenCache(cube))
    ctx.bar = type("Bar", (), {"update": lambda self, n=1: None})()
    g = build_dataset(cube, "A->B", "genuine", ctx.arrays)
    early = g.round < g.round.max() - 1
    c = replace(g, condition="early", x_rows=g.x_rows[early], y_rows=g.y_rows[early], episode=g.episode[early],
                sim_seed=g.sim_seed[early], round=g.round[early])
    rank = np.zeros(1, dtype=int)
    g_own, c_own = (_fit_splits(ctx, s, rank, own_splits(ctx, s)) for s in (g, c))
    *sides, matched = contrast_fits(ctx, g, c, g_own, c_own)
    assert matched is None  # not a lag: no size-matched genuine

    def value(fits):
        return float(seed_aggregate(np.stack([f.r2 for f in fits])).sync_r2)
    gap_own = value(g_own) - value(c_own)
    gap_contrast = value(sides[0]) - value(sides[1])
    print(f"genuine {value(g_own):.3f} on all its rows, {value(c_own):.3f} on the early positions alone")
    assert gap_own > 0.1  # the positions alone
    assert gap_contrast == pytest.approx(0.0, abs=1e-12)
    for a, b in zip(*sides):
        assert len(a.train) == len(b.train) and len(a.test) == len(b.test)
    assert value(sides[0]) < value(g_own) - 0.1  # on the early positions genuine itself falls


def test_the_size_matched_genuine_separates_a_lags_positions_from_its_sample_size():
    """Issue 74, item 3: beside genuine on lag 2's rows, genuine on a random subset of its own samples of the same
    size (drawn from its own training and test samples).  Where synchrony lives in the last rounds (which lag 2
    lacks), genuine at lag 2's size on its own positions stays near genuine on all its rows, while genuine on lag 2's
    positions falls: the drop is the positions, not the n."""
    from synclib.analysis.blocks import _fit_splits, own_splits
    from synclib.analysis.context import Context
    from synclib.analysis.samples import HiddenCache
    from synclib.penalty import Penalty

    cube = _late_synchrony_cube()
    ctx = Context(cube=cube, directions=("A->B",), split_seeds=[0, 1, 2], n_samples=None, penalty=Penalty("cv"),
                  device=None, precision="float32", max_resident_bytes=None, progress=False, log=lambda m: None,
                  arrays=HiddenCache(cube))
    ctx.bar = type("Bar", (), {"update": lambda self, n=1: None})()
    g, c = (build_dataset(cube, "A->B", k, ctx.arrays) for k in ("genuine", "lag2"))
    rank = np.zeros(1, dtype=int)
    g_own, c_own = (_fit_splits(ctx, s, rank, own_splits(ctx, s)) for s in (g, c))
    g_side, c_side, matched = contrast_fits(ctx, g, c, g_own, c_own)
    for m, side, own in zip(matched, g_side, g_own):
        assert len(m.train) == len(side.train) < len(own.train) and len(m.test) == len(side.test)
        assert set(m.train) <= set(own.train) and set(m.test) <= set(own.test)
        assert m.split["matched"] and g.round[m.train].max() > c.round.max()  # from all of genuine's positions

    def value(fits):
        return float(seed_aggregate(np.stack([f.r2 for f in fits])).sync_r2)
    print(f"genuine all {value(g_own):.3f}, at lag 2's size {value(matched):.3f}, on lag 2's rows {value(g_side):.3f}")
    assert value(matched) - value(g_side) > 0.1                     # the positions
    assert abs(value(g_own) - value(matched)) < value(matched) - value(g_side)  # the size, much less


def test_the_dry_run_plans_each_conditions_own_samples():
    planned = planned_samples(64, 1, 16, None, (1, 2), 0)
    for d in ("A->B", "B->A"):
        assert planned["genuine"][d]["train"] > planned["lag1"][d]["train"] > planned["lag2"][d]["train"] > 0


# --------------------------------------------------------------------------- what the pages say
@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    from book_fixtures import tiny_results

    return tiny_results(tmp_path_factory.getbasetemp())


def test_the_contrast_table_and_sentence_are_the_analyses_numbers(results_dir, monkeypatch):
    from pages import run_page
    from synclib.analysis import results

    res = results.load_results(results_dir)
    table = res.contrast_table()
    assert set(table["control"]) == set(res.conditions()) - {"genuine"}
    for _, row in table.iterrows():
        runs = res.runs_of(row["pair"])
        pooled = [res.analysis(r.name)["sync_r2_contrast_pooled"].sel(contrast=row["control"]) for r in runs]
        own = [res.analysis(r.name)["sync_r2"] for r in runs]
        gap = np.mean([(v.sel(side="genuine") - v.sel(side="control")).values for v in pooled])
        gap_all = np.mean([(v.sel(condition="genuine") - v.sel(condition=row["control"])).values for v in own])
        assert row["gap"] == pytest.approx(gap) and row["gap_all"] == pytest.approx(gap_all)
        assert row["genuine_moved"] == pytest.approx(row["genuine"] - row["genuine_all"])
        n = [res.analysis(r.name)["n_train_contrast"].sel(contrast=row["control"]) for r in runs]
        assert row["n_train"] == pytest.approx(np.mean([v.sel(side="control").mean() for v in n]))
    # the controls page words the contrasts from the same table
    text = run_page("fig03_04_controls", results_dir=str(results_dir)).text
    lag2 = table[table["control"] == "lag2"]
    assert f"(gap {lag2['gap'].mean():.3f})" in text and f"gap {lag2['gap_all'].mean():.3f}" in text
    assert "These are numbers from synthetic test data; the paper fixes 6,500" in text
    monkeypatch.setattr(results.Results, "contrast_table", lambda self: table.iloc[:0])
    assert "This run's analyses have no contrasts" in run_page("fig03_04_controls", results_dir=str(results_dir)).text


def test_the_passive_share_is_the_pairs_mean_ratio(results_dir, monkeypatch):
    """The first page and the controls page quote the share of genuine SyncR² the passive reader keeps: the
    mean over pairs (genuine above 0) of each pair's ratio; a run without the passive reader says so."""
    from pages import run_page
    from synclib.analysis import results

    res = results.load_results(results_dir)
    g, p = res.sync_table(), res.sync_table("passive")
    m = g.merge(p, on="pair", suffixes=("_g", "_p"))
    m = m[np.isfinite(m["mean_g"]) & np.isfinite(m["mean_p"]) & (m["mean_g"] > 0)]
    want = 100 * (m["mean_p"] / m["mean_g"]).mean()
    sentence = f"The passive reader, who reads the same dialog without taking part in it, keeps {want:.0f} %"
    for stem in ("intro", "fig03_04_controls"):
        assert sentence in run_page(stem, results_dir=str(results_dir)).text, stem
    conditions = results.Results.conditions
    monkeypatch.setattr(results.Results, "conditions", lambda self: [c for c in conditions(self) if c != "passive"])
    text = run_page("intro", results_dir=str(results_dir)).text
    assert "The passive reader, who reads the same dialog without taking part in it, keeps" not in text
    assert "This run has no passive reader" in text


def test_the_method_page_says_where_the_penalties_fell(tmp_path):
    """alpha='cv' stores each fit's penalty over its layer's scale on the grid it searched; figure 8's
    page counts the fits at the grid's ends, per run (a fixed penalty says so)."""
    from pages import run_page
    from synclib.analysis import claims, results
    from synclib.analysis.ridge import DEFAULT_CV_ALPHAS
    from synthetic import SYNTHETIC_PAIRS, build_synthetic_results

    root = build_synthetic_results(tmp_path / "cv", pairs=SYNTHETIC_PAIRS[:1], n_episodes=16,
                                   analyze_kwargs=dict(alpha="cv", persona_disjoint=False, relationship=False,
                                                       sample_sizes=None, nonlinear=False, tom=False))
    res = results.load_results(root)
    ds = res.analysis("S-S")
    grid = np.asarray(ds.attrs["cv_alphas"])
    assert np.allclose(grid, DEFAULT_CV_ALPHAS) and "layer_scale" in ds.attrs["cv_alphas_rule"]
    rel = ds["alpha_relative"].values
    assert np.isfinite(rel).any() and all(np.isclose(grid, v).any() for v in rel[np.isfinite(rel)])
    t = res.penalty_table()
    g = t[t["condition"] == "genuine"].iloc[0]
    v = ds["alpha_relative"].sel(condition="genuine").values
    v = v[np.isfinite(v)]
    assert g["fits"] == v.size and g["at_top"] == pytest.approx(np.isclose(v, grid.max()).mean())
    claims.write(res, results.load_published())
    page = run_page("fig08_clipping", results_dir=str(root)).text
    assert "| S-S | genuine |" in page and "times each source layer's scale" in page
    fixed_root = build_synthetic_results(tmp_path / "fixed", pairs=SYNTHETIC_PAIRS[:1], n_episodes=8,
                                         analyze_kwargs=dict(persona_disjoint=False, tom=False))
    fixed = results.load_results(fixed_root)
    claims.write(fixed, results.load_published())
    assert fixed.penalty_table().empty
    assert "λ = 0.1 for every map" in run_page("fig08_clipping", results_dir=str(fixed_root)).text


def test_a_layer_a_thousand_times_larger_chooses_the_same_relative_penalty():
    """Issue 49: the CV grid follows each layer's scale. A source layer multiplied by 1000 (its
    variance by 10^6, as Gemma-3's layers differ) is the same problem: the same relative penalty
    is chosen, its absolute value 10^6 times larger, and the same test R² results; an absolute
    grid would have had to reach 10^6 times further."""
    cube = make_synthetic_cube(n_episodes=30, n_seeds=1, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=16, layers_b=3, dim_b=16), seed=4,
                               planted=Planted(min_utterances=12))
    h = cube["hidden_a"].values.copy()
    h[..., 2, :] = h[..., 1, :] * 1000.0          # layer 2 = layer 1, a thousand times larger
    cube["hidden_a"] = (cube["hidden_a"].dims, h)
    out = analyze(cube, conditions=["genuine"], alpha="cv", n_samples=None, split_seeds=(0, 1), n_boot=0, cka=False, **QUIET)
    g = out.sel(condition="genuine", direction="A->B")
    np.testing.assert_allclose(g["alpha_relative"].values[:, 2], g["alpha_relative"].values[:, 1], rtol=1e-9)
    np.testing.assert_allclose(g["alpha"].values[:, 2], 1e6 * g["alpha"].values[:, 1], rtol=1e-3)
    np.testing.assert_allclose(g["r2"].values[:, 2, :3], g["r2"].values[:, 1, :3], atol=1e-4)
