"""Like-for-like controls (issue 49): every condition fitted on equal samples.

With ``equal_samples`` each condition of a direction is split by the reference's rule at the
smallest condition's sample count and cut to the smallest training and test counts
(:data:`synclib.analysis.blocks.EQUAL_RULE`, :func:`synclib.splits.trim_split`); each is also
fitted on all its own samples (``sync_r2_unmatched``), the sensitivity line.
"""
from __future__ import annotations

import numpy as np
import pytest

from synclib.analysis import analyze
from synclib.analysis.sizing import planned_samples
from synclib.analysis.synthetic import Planted, Shapes, make_synthetic_cube
from synclib.splits import RidgeInputError, episode_split, trim_split

QUIET = dict(progress=False, log=lambda m: None)


def test_trim_split_keeps_whole_episodes_in_the_order_taken_then_a_draw():
    groups = np.repeat(np.arange(10), [3, 5, 4, 0, 6, 2, 5, 5, 4, 3])
    tr, te, info = episode_split(groups, None, 1, n_groups=10)
    order = list(info["train_groups"])
    assert trim_split(tr, groups, order, len(tr), 1).tolist() == sorted(tr.tolist())
    assert len(trim_split(tr, groups, order, 0, 1)) == 0
    for n in range(1, len(tr)):
        kept = trim_split(tr, groups, order, n, 1)
        assert len(kept) == n and set(kept) <= set(tr) and np.all(np.diff(kept) > 0)
        sizes = {g: int((groups[tr] == g).sum()) for g in order}
        got = {g: int((groups[kept] == g).sum()) for g in order}
        taken = [g for g in order if sizes[g]]
        full = [g for g in taken if got[g] == sizes[g]]
        part = [g for g in taken if 0 < got[g] < sizes[g]]
        assert taken[:len(full)] == full and len(part) <= 1     # whole episodes first, in the split's order
        assert not part or taken.index(part[0]) == len(full)     # then part of the next one
        assert np.array_equal(kept, trim_split(tr, groups, order, n, 1))  # seeded
    with pytest.raises(RidgeInputError, match="cannot be cut"):
        trim_split(tr, groups, order, len(tr) + 1, 1)


def test_every_condition_has_the_same_training_and_test_counts():
    cube = make_synthetic_cube(n_episodes=24, n_seeds=2, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=12, layers_b=3, dim_b=12), seed=1)
    out = analyze(cube, conditions=["genuine", "passive", "shuffled", "pseudo"], lags=[1, 2], n_samples=None, alpha=0.1,
                  equal_samples=True, n_boot=0, **QUIET)
    for counts in ("n_train", "n_test"):
        c = out[counts].values                                         # (condition, direction, split_seed)
        assert (c == c[:1]).all() and (c > 0).all(), counts
    own = out["n_train_unmatched"]
    assert (own.sel(condition="genuine") > own.sel(condition="lag2")).all()  # lag 2 has the fewest samples
    assert (out["n_train"].sel(condition="genuine") <= own.sel(condition="lag2")).all()
    assert out.attrs["equal_samples"] == 1 and "trim_split" in out.attrs["equal_rule"]
    assert np.isfinite(out["sync_r2_unmatched"]).all()
    # without it, each condition on its own samples (the reference): the unmatched fits of the run above
    ref = analyze(cube, conditions=["genuine", "passive", "shuffled", "pseudo"], lags=[1, 2], n_samples=None, alpha=0.1,
                  n_boot=0, **QUIET)
    assert "sync_r2_unmatched" not in ref and ref.attrs["equal_samples"] == 0
    assert np.array_equal(ref["n_train"].values, own.values)
    np.testing.assert_allclose(ref["sync_r2"].values, out["sync_r2_unmatched"].values, atol=1e-6)


def test_equal_samples_remove_a_planted_sample_size_effect():
    """The passive reader planted as the genuine source itself on every other episode: the same
    states, half the samples. Each on its own samples, genuine is far above passive (a sample-size
    effect: SyncR² climbs steeply over these counts); on equal samples the gap is gone."""
    cube = make_synthetic_cube(n_episodes=40, n_seeds=1, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=32, layers_b=3, dim_b=32), seed=3,
                               planted=Planted(min_utterances=12, signal=3.0), coupling=0.9)
    for side in "ab":
        h = cube[f"hidden_{side}"].values.copy()
        h[::2] = np.nan
        cube[f"hidden_{side}_passive"] = (cube[f"hidden_{side}"].dims, h)
    out = analyze(cube, conditions=["genuine", "passive"], n_samples=None, alpha="cv", split_seeds=(0, 1, 2, 3),
                  equal_samples=True, n_boot=0, cka=False, **QUIET)

    def gap(var):
        v = out[var].mean(["direction", "split_seed"])
        return float(v.sel(condition="genuine") - v.sel(condition="passive"))

    assert (out["n_train_unmatched"].sel(condition="genuine") == 2 * out["n_train"].sel(condition="genuine")).all()
    assert gap("sync_r2_unmatched_per_seed") > 0.15
    assert abs(gap("sync_r2_per_seed")) < 0.05


def test_the_dry_run_plans_equal_samples():
    planned = planned_samples(64, 1, 16, None, (1, 2), 0, equal_samples=True)
    for d in ("A->B", "B->A"):
        assert len({(v[d]["train"], v[d]["test"]) for v in planned.values()}) == 1
        assert planned["genuine"][d]["train"] == planned_samples(64, 1, 16, None, (1, 2), 0)["lag2"][d]["train"]


# --------------------------------------------------------------------------- what the pages say
@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    from book_fixtures import tiny_results

    return tiny_results(tmp_path_factory.getbasetemp())


def test_the_matching_table_and_sentence_are_the_analyses_numbers(results_dir):
    from synclib.analysis import results
    from synclib.figures import fig03_04_controls as controls

    res = results.load_results(results_dir)
    table = controls.matching_table(res)
    assert set(table["control"]) == set(res.conditions()) - {"genuine"}
    for _, row in table.iterrows():
        runs = res.runs_of(row["pair"])
        eq = [res.analysis(r.name)["sync_r2"] for r in runs]
        own = [res.analysis(r.name)["sync_r2_unmatched"] for r in runs]
        gap = np.mean([(v.sel(condition="genuine") - v.sel(condition=row["control"])).values for v in eq])
        gap_own = np.mean([(v.sel(condition="genuine") - v.sel(condition=row["control"])).values for v in own])
        assert row["gap_equal"] == pytest.approx(gap) and row["gap_own"] == pytest.approx(gap_own)
        assert row["removed"] == pytest.approx(gap_own - gap)
        n = [res.analysis(r.name)["n_train"] for r in runs]
        assert row["n_train"] == pytest.approx(np.mean([v.sel(condition=row["control"]).mean() for v in n]))
    text = controls.sentence_matching(table, res.sample_counts(), res.embedded, res.synthetic)
    lag2 = table[table["control"] == "lag2"]
    assert f"lag2 {lag2['gap_own'].mean():.3f} on each condition's own samples" in text
    assert f"{lag2['gap_equal'].mean():.3f} on equal ones" in text and "synthetic test data" in text
    # a run that fits each condition on its own samples says how unequal they are
    off = controls.sentence_matching(table.iloc[:0], res.sample_counts(), False)
    assert "`analysis.equal_samples` is off" in off and "lag2" in off


def test_the_passive_share_is_the_pairs_mean_ratio(results_dir):
    from synclib.figures import report
    from synclib.analysis import results

    res = results.load_results(results_dir)
    g, p = res.sync_table(), res.sync_table("passive")
    m = g.merge(p, on="pair", suffixes=("_g", "_p"))
    want = 100 * (m["mean_p"] / m["mean_g"]).mean()
    text = report.passive_share(g, p)
    assert text.startswith(f"the passive reader, who reads the same dialog without taking part in it, keeps {want:.0f} %")
    assert report.passive_share(g, None) == ""


def test_the_method_page_says_where_the_penalties_fell(tmp_path):
    """alpha='cv' stores each fit's penalty over its layer's scale on the grid it searched; the
    method page counts the fits at the grid's ends, per run (a fixed penalty says so)."""
    from synclib.analysis import results
    from synclib.figures import run_summary
    from synclib.analysis.ridge import DEFAULT_CV_ALPHAS
    from synclib.analysis.synthetic import SYNTHETIC_PAIRS, build_synthetic_results

    root = build_synthetic_results(tmp_path / "cv", pairs=SYNTHETIC_PAIRS[:1], n_episodes=16,
                                   analyze_kwargs=dict(alpha="cv", persona_disjoint=False, relationship=False,
                                                       sample_sizes=None, nonlinear=False, tom=False))
    res = results.load_results(root)
    ds = res.analysis("S-S")
    grid = np.asarray(ds.attrs["alpha_grid"])
    assert np.allclose(grid, DEFAULT_CV_ALPHAS) and "layer_scale" in ds.attrs["alpha_grid_rule"]
    rel = ds["alpha_relative"].values
    assert np.isfinite(rel).any() and all(np.isclose(grid, v).any() for v in rel[np.isfinite(rel)])
    t = run_summary.penalty_table(res)
    g = t[t["condition"] == "genuine"].iloc[0]
    v = ds["alpha_relative"].sel(condition="genuine").values
    v = v[np.isfinite(v)]
    assert g["fits"] == v.size and g["at_top"] == pytest.approx(np.isclose(v, grid.max()).mean())
    page = run_summary.penalty_markdown(res)
    assert "| S-S | genuine |" in page and "times each source layer's scale" in page
    fixed = results.load_results(build_synthetic_results(tmp_path / "fixed", pairs=SYNTHETIC_PAIRS[:1], n_episodes=8,
                                                         analyze_kwargs=dict(persona_disjoint=False, tom=False)))
    assert run_summary.penalty_table(fixed).empty and "λ = 0.1 for every map" in run_summary.penalty_markdown(fixed)


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
