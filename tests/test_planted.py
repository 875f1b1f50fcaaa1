"""Planted differences (synclib.analysis.planted) and their power curve
(synclib.analysis.power.planted_power): the rows each share replaces, the block against one
r2_grid per set on the same rows, and the curve against the corrected test run by hand.
Units: SyncR² (R² averaged over source layers), shares of target rows, detection rates."""
from __future__ import annotations

import numpy as np
import pytest

import synclib.analysis.core as core
from synclib.analysis import power, ridge
from synclib.analysis.planted import PLANTED_SPLIT_STRIDE, _layers, _shares_rows, planted_block
from synclib.analysis.results import load_results
from synclib.analysis.scores import sync_r2
from synthetic import Shapes, build_synthetic_results, make_synthetic_cube


def test_each_share_replaces_its_count_of_rows_nested_where_a_partner_has_one():
    y = np.arange(100) * 10
    sur = np.where(np.arange(100) % 7 == 0, -1, 5000 + np.arange(100))   # every 7th sample has no partner
    order = np.random.default_rng(0).permutation(100)
    sets = _shares_rows(y, sur, order, (0.0, 0.1, 0.25, 0.5))
    np.testing.assert_array_equal(sets[0], y)
    changed = [set(np.flatnonzero(s != y)) for s in sets]
    assert [len(c) for c in changed] == [0, 10, 25, 50]
    assert changed[1] <= changed[2] <= changed[3]                        # nested
    for s, c in zip(sets, changed):
        idx = np.array(sorted(c), dtype=int)
        assert (sur[idx] >= 0).all() and (s[idx] == sur[idx]).all()     # only from a partner that has the row
    np.testing.assert_array_equal(_layers(30, 8), [0, 4, 8, 12, 17, 21, 25, 29])
    np.testing.assert_array_equal(_layers(3, 8), [0, 1, 2])


@pytest.fixture(scope="module")
def fitted():
    """A synthetic cube's analysis context and genuine fits (CV penalty, three split seeds)."""
    cube = make_synthetic_cube(n_episodes=30, n_seeds=1, n_rounds=6, shapes=Shapes(layers_a=5, dim_a=12,
                               layers_b=4, dim_b=10), coupling=0.8, seed=2, passive=False, tom=False)
    seen = {}
    real = core.conditions_block

    def keep(ctx, conditions, cka=False):
        out = real(ctx, conditions, cka=cka)
        seen.update(ctx=ctx, genuine=out.genuine)
        return out
    core.conditions_block = keep
    try:
        core.analyze(cube, conditions=["genuine"], alpha="cv", n_samples=None, split_seeds=(0, 1, 2), n_boot=0,
                     cka=False, progress=False, log=lambda m: None)
    finally:
        core.conditions_block = real
    return seen["ctx"], seen["genuine"]


def test_the_block_fits_each_share_as_its_own_grid_on_the_same_rows(fitted):
    ctx, genuine = fitted
    shares = (0.0, 0.1, 0.5)
    out = planted_block(ctx, genuine, 3, shares=shares, max_layers=3)
    assert out["planted_sync_r2"].dims == ("direction", "replicate", "split_seed", "share")
    assert out["planted_sync_r2"].shape == (2, 3, 3, 3)
    assert out.attrs["planted_layers_a"] == "0 2 4" and out.attrs["planted_layers_b"] == "0 2 3"
    # replicate 0 is the run's own splits; share 0 is genuine, here on the layers fitted
    d, seed = "A->B", 1
    fit = genuine.fits[(d, seed)]
    s = genuine.samples[d]
    assert out["n_train_planted"].sel(direction=d, replicate=0, split_seed=seed) == len(fit.train)
    src, tgt = np.array([0, 2, 4]), np.array([0, 2, 3])
    X, Y = s.X.array[:, src], s.Y.array[:, tgt]
    one = ridge.r2_grid(X, Y, (s.x_rows[fit.train], s.y_rows[fit.train]), (s.x_rows[fit.test], s.y_rows[fit.test]),
                        fit.alpha[src])
    assert out["planted_sync_r2"].sel(direction=d, replicate=0, split_seed=seed, share=0.0) == \
        pytest.approx(sync_r2(one.r2), abs=1e-6)
    # a later replicate: the analysis' own split rule at a fresh seed, and a share's rows from a partner
    split = ctx.split(s.episode, ctx.cube.sizes["episode"], seed + PLANTED_SPLIT_STRIDE * 2, "check")
    tr, te = split[0], split[1]
    assert out["n_train_planted"].sel(direction=d, replicate=2, split_seed=seed) == len(tr)
    from synclib.analysis.planted import PLANTED_SEED
    from synclib.analysis.surrogates import surrogate_rows
    sur = surrogate_rows(ctx.cube, s, 3)[0][:, 2]
    order = np.random.default_rng([PLANTED_SEED, 0, 2]).permutation(s.n)
    y = _shares_rows(s.y_rows, sur, order, shares)[2]
    one = ridge.r2_grid(X, Y, (s.x_rows[tr], y[tr]), (s.x_rows[te], y[te]), fit.alpha[src])
    assert out["planted_sync_r2"].sel(direction=d, replicate=2, split_seed=seed, share=0.5) == \
        pytest.approx(sync_r2(one.r2), abs=1e-6)
    # taking half the targets from other dialogs lowers SyncR² on every re-split
    v = out["planted_sync_r2"]
    assert (v.sel(share=0.5) < v.sel(share=0.0)).all()
    # deterministic
    again = planted_block(ctx, genuine, 3, shares=shares, max_layers=3)
    np.testing.assert_array_equal(out["planted_sync_r2"].values, again["planted_sync_r2"].values)


def test_the_power_curve_is_the_corrected_test_per_replicate(tmp_path):
    root = build_synthetic_results(tmp_path / "r", n_episodes=30,
                                   analyze_kwargs={"sample_sizes": None, "nonlinear": False, "relationship": False,
                                                   "persona_disjoint": False, "tom": False, "n_boot": 0,
                                                   "surrogates": 0, "planted": 6})
    res = load_results(root)
    curve = power.planted_power(res)
    assert list(curve.columns) == power.PLANTED_COLUMNS
    shares = res.analysis(res.runs[0].name)["share"].values
    assert list(curve["share"]) == [0.0] + [f for f in shares if f > 0]
    # share 0, the null: the control at PLANTED_NULL_SHARE against the same share of other rows; a false finding
    # is any p < 0.05, either sign
    from synclib.analysis.planted import PLANTED_NULL_SHARE
    null = [[] for _ in range(6)]
    for r in res.runs:
        ds = res.analysis(r.name)
        side = ds["planted_sync_r2"].sel(share=PLANTED_NULL_SHARE).transpose("direction", "replicate", "split_seed")
        other = ds["planted_null_sync_r2"].transpose("direction", "replicate", "split_seed")
        for rep in range(6):
            null[rep] += list((side.values[:, rep] - other.values[:, rep]).ravel())
    zero = curve.iloc[0]
    found = [power.corrected_resampled_test(np.array(d), curve.attrs["test_train_ratio"]) for d in null]
    assert zero["detected"] == sum(t["p"] < 0.05 for t in found) and zero["n_reps"] == 6
    assert abs(zero["planted"]) < curve["planted"].iloc[-1] / 5  # nothing planted between the sides
    assert (curve["n_reps"] == 6).all() and curve.attrs["runs"] == [r.name for r in res.runs]
    # by hand: one share, every run's directions x split seeds pooled per replicate
    k = len(shares) - 1
    ratios, per_rep = [], [[] for _ in range(6)]
    for r in res.runs:
        ds = res.analysis(r.name)
        v = ds["planted_sync_r2"].transpose("direction", "replicate", "split_seed", "share").values
        for rep in range(6):
            per_rep[rep] += list((v[:, rep, :, 0] - v[:, rep, :, k]).ravel())
        ntr, nte = ds["n_train_planted"].values.ravel(), ds["n_test_planted"].values.ravel()
        ratios += list(nte / ntr)
    tests = [power.corrected_resampled_test(np.array(d), np.mean(ratios)) for d in per_rep]
    row = curve.iloc[-1]
    assert row["n_pairs"] == len(per_rep[0]) == len(res.runs) * 2 * len(ds["split_seed"])
    assert row["detected"] == sum(t["p"] < 0.05 and t["mean"] > 0 for t in tests)
    assert row["planted"] == pytest.approx(np.mean([t["mean"] for t in tests]))
    assert row["mde"] == pytest.approx(np.mean([t["mde"] for t in tests]))
    # the largest share is found; the planted difference grows with the share
    assert row["rate"] == 1.0 and curve["planted"].iloc[-1] > curve["planted"].iloc[0]
    assert power.detection_size(curve) is not None
    assert len(power.planted_power(res, runs=[])) == 0
    # the claims step keeps the curve (with where it reaches 80 %) for the power page, which quotes its own counts
    # and says what the re-splits cannot show
    from synclib.analysis import claims, results
    from pages import plant_test, run_page

    claims.write(res, results.load_published())
    kept = load_results(root).tests("planted")
    np.testing.assert_allclose(kept[power.PLANTED_COLUMNS].to_numpy(float), curve.to_numpy(float))
    assert kept.attrs["detection_size"] == power.detection_size(curve)
    shown = run_page("power", results_dir=str(root))
    text = shown.text
    last = curve.sort_values("planted").iloc[-1]
    assert f"in {int(last['detected'])} of 6" in text and "evenly spaced layers of each model" in text
    assert "not the spread between new runs of dialogs" in text and "at most the curve's" in text
    (table,) = [t for t in shown.tables if "found (p < 0.05)" in t.columns]
    assert len(table) == len(curve) and table["found (p < 0.05)"].iloc[-1] == f"{int(last['detected'])} of 6"
    flat = curve.assign(planted=0.0, detected=0, rate=0.0)        # a run whose SyncR² stays at 0
    flat.attrs.update(curve.attrs, detection_size=None)
    plant_test(root, "planted", flat)
    assert "none could be planted" in run_page("power", results_dir=str(root)).text


def test_detection_size_reads_where_the_curve_stays_above_the_target():
    import pandas as pd
    c = pd.DataFrame({"planted": [0.01, 0.02, 0.04, 0.08], "rate": [0.9, 0.5, 0.85, 1.0]})
    assert power.detection_size(c) == 0.04
    assert power.detection_size(c.assign(rate=[0.1, 0.2, 0.3, 0.5])) is None
