"""synclib.analysis: datasets, splits, scores, analyze(), the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from conftest import write_chunked_cube
from synclib.analysis import (AnalysisError, analyze, build_dataset, persona_keys, seed_aggregate,
                              shuffle_training_targets, sync_r2, sync_r2_noclip, sync_r2_se, sync_r2_topk)
from synthetic import Planted, Shapes, make_synthetic_cube
from synclib.splits import episode_split
from synclib.stats import mean_se, reference_family_se
from synclib.tasks.scenarios import RELATIONSHIPS


# --------------------------------------------------------------------------- hand-built cube
def hand_cube():
    """Hidden states that encode their own (episode, seed, round, model) in every entry."""
    E, S, R, L, D = 3, 2, 4, 2, 3
    code = lambda m: (np.arange(E)[:, None, None] * 1000 + np.arange(S)[None, :, None] * 100  # noqa: E731
                      + np.arange(R)[None, None, :] + m)
    ha = np.broadcast_to(code(0)[..., None, None], (E, S, R, L, D)).astype(np.float32).copy()
    hb = np.broadcast_to(code(10)[..., None, None], (E, S, R, L, D)).astype(np.float32).copy()
    hap, hbp = ha + 50, hb + 50
    n_utt = np.array([[8, 8], [5, 8], [2, 8]])  # episode 1 seed 0 stops after utterance 4
    for arr, first in ((ha, 0), (hb, 1), (hap, 0), (hbp, 1)):
        for e in range(E):
            for s in range(S):
                for k in range(R):
                    if 2 * k + first >= n_utt[e, s]:
                        arr[e, s, k] = np.nan
    d5a, d5b = ("episode", "sim_seed", "round", "layer_a", "dim_a"), ("episode", "sim_seed", "round", "layer_b", "dim_b")
    return xr.Dataset(
        {"hidden_a": (d5a, ha), "hidden_b": (d5b, hb), "hidden_a_passive": (d5a, hap),
         "hidden_b_passive": (d5b, hbp), "n_utterances": (("episode", "sim_seed"), n_utt)},
        coords={"episode": [10, 11, 12], "agent1_id": ("episode", ["x", "y", "x"]),
                "agent2_id": ("episode", ["y", "x", "z"])})


def decode(v):
    v = int(round(float(v)))
    return v // 1000, (v % 1000) // 100, v % 100  # episode, seed, round + model offset


@pytest.mark.parametrize("direction, condition, shift, xoff, yoff", [
    ("A->B", "genuine", 0, 0, 10), ("B->A", "genuine", 1, 10, 0),
    ("A->B", "lag1", 1, 0, 10), ("A->B", "lag2", 2, 0, 10), ("B->A", "lag1", 2, 10, 0),
    ("A->B", "passive", 0, 50, 10), ("B->A", "passive", 1, 60, 0),
])
def test_dataset_index_arithmetic(direction, condition, shift, xoff, yoff):
    cube = hand_cube()
    ds = build_dataset(cube, direction, condition)
    assert ds.n > 0
    utt_src = 0 if direction == "A->B" else 1
    expected = 0
    for e in range(3):
        for s in range(2):
            n_utt = int(cube.n_utterances[e, s])
            for k in range(4 - shift):
                tgt_utt = 2 * (k + shift) + (1 - utt_src)
                expected += tgt_utt < n_utt
    assert ds.n == expected  # unreached rounds dropped
    for i in range(ds.n):
        xe, xs, xk = decode(ds.X[ds.x_rows[i], 0, 0])
        ye, ys, yk = decode(ds.Y[ds.y_rows[i], 1, 2])
        assert (xe, xs) == (ye, ys) == (ds.episode[i], ds.sim_seed[i])
        assert xk - xoff == ds.round[i] and yk - yoff == ds.round[i] + shift


def test_unknown_condition_and_missing_variable():
    cube = hand_cube()
    with pytest.raises(AnalysisError, match="unknown condition"):
        build_dataset(cube, "A->B", "lag0")
    with pytest.raises(AnalysisError, match="hidden_a_passive"):
        build_dataset(cube.drop_vars("hidden_a_passive"), "A->B", "passive")


# --------------------------------------------------------------------------- splits
def test_persona_disjoint_split():
    cube = make_synthetic_cube(n_episodes=40, n_seeds=1, n_rounds=2,
                               shapes=Shapes(layers_a=2, dim_a=4, layers_b=2, dim_b=4), tom=False, passive=False)
    keys = persona_keys(cube)
    assert len(set(keys)) < len(keys)  # pairs recur across scenarios
    ds = build_dataset(cube, "A->B")
    tr, te, _ = episode_split(keys[ds.episode], None, 0)
    assert not set(keys[ds.episode[tr]]) & set(keys[ds.episode[te]])
    # swapped agent order is the same pair
    assert persona_keys(hand_cube())[0] == persona_keys(hand_cube())[1]


# --------------------------------------------------------------------------- scores
def test_sync_r2_formulas_on_hand_grid():
    g = np.array([[0.5, 0.2, -0.1],
                  [-0.3, -0.2, -0.6],
                  [0.1, 0.9, 0.4]])
    assert sync_r2(g) == pytest.approx((0.5 + 0 + 0.9) / 3)
    assert sync_r2_noclip(g) == pytest.approx((0.5 - 0.2 + 0.9) / 3)
    assert sync_r2_topk(g, 1) == pytest.approx(sync_r2(g))  # k = 1 is the original: clipped
    # top-k keeps the clip per source layer: row 2's top-2 mean (-0.25) counts 0
    assert sync_r2_topk(g, 2) == pytest.approx(((0.5 + 0.2) / 2 + 0 + (0.9 + 0.4) / 2) / 3)
    assert np.isnan(sync_r2_topk(g, 4))
    padded = np.full((4, 4), np.nan)
    padded[:3, :3] = g
    assert sync_r2(padded) == pytest.approx(sync_r2(g))
    m, se = mean_se([0.4, 0.5, 0.6])
    assert m == pytest.approx(0.5) and se == pytest.approx(0.1 / np.sqrt(3))


def test_seed_aggregation_on_hand_grids():
    """The reference's aggregation: seed-mean grid first, then max, clip, mean; its SE."""
    g0 = [[0.5, 0.2, -0.1], [-0.3, -0.2, -0.6]]
    g1 = [[0.3, 0.4, -0.1], [-0.1, -0.4, -0.2]]
    grids = np.array([g0, g1])
    # mean grid [[0.4, 0.3, -0.1], [-0.2, -0.3, -0.4]], ddof-0 variance [[.01, .01, 0], [.01, .01, .04]]
    a = seed_aggregate(grids)
    np.testing.assert_allclose(a.mean, [[0.4, 0.3, -0.1], [-0.2, -0.3, -0.4]])
    np.testing.assert_allclose(a.var, [[0.01, 0.01, 0.0], [0.01, 0.01, 0.04]], atol=1e-15)
    assert a.n_seeds == 2
    assert a.sync_r2 == pytest.approx((0.4 + 0) / 2)
    # order matters: the mean of the per-seed scores is (0.25 + 0.2) / 2 = 0.225
    assert np.mean([sync_r2(g) for g in grids]) == pytest.approx(0.225)
    # SE: row 0 best target 0 (variance .01); row 1's best mean is negative -> 0
    assert a.sync_r2_se == pytest.approx(np.sqrt(0.01) / 2)
    assert sync_r2_se(grids) == pytest.approx(0.05)
    # unclipped (figure 8): row 1 counts -0.2, its variance enters the SE
    assert a.noclip == pytest.approx((0.4 - 0.2) / 2)
    assert a.noclip_se == pytest.approx(np.sqrt(0.02) / 2)
    assert sync_r2_se(grids, clip=False) == pytest.approx(np.sqrt(0.02) / 2)
    # top-k on the mean grid, clipped per source layer: k=1 is SyncR^2
    np.testing.assert_allclose(a.topk, [0.2, (0.35 + 0) / 2, (0.2 + 0) / 2])
    # padding (a 2 x 3 grid stored in a 3 x 3 square, a failed seed all-NaN) changes nothing
    padded = np.full((3, 3, 3), np.nan)
    padded[:2, :2, :3] = grids
    b = seed_aggregate(padded)
    assert (b.sync_r2, b.sync_r2_se, b.noclip, b.noclip_se, b.n_seeds) == pytest.approx(
        (a.sync_r2, a.sync_r2_se, a.noclip, a.noclip_se, 2))
    np.testing.assert_allclose(b.topk, a.topk)


def test_seed_aggregation_ties_and_single_seed():
    # a tie in the mean row: the first maximum is the chosen target (np.argmax)
    grids = np.array([[[0.1, 0.5]], [[0.5, 0.1]]])  # mean [0.3, 0.3], variances [0.04, 0.04]
    grids[1, 0] = [0.5, 0.4]                        # mean [0.3, 0.45]: target 1, variance 0.0025
    assert sync_r2_se(grids) == pytest.approx(0.05)
    tie = np.array([[[0.1, 0.3]], [[0.5, 0.3]]])     # mean [0.3, 0.3]: target 0 (variance 0.04)
    assert sync_r2_se(tie) == pytest.approx(0.2)
    # one split seed: the score, but no standard error (undefined; the reference's std gives 0)
    one = seed_aggregate(grids[:1])
    assert one.sync_r2 == pytest.approx(0.5) and np.isnan(one.sync_r2_se) and np.isnan(one.noclip_se)
    # every seed failed: NaN throughout
    none = seed_aggregate(np.full((2, 2, 2), np.nan))
    assert none.n_seeds == 0 and np.isnan(none.sync_r2) and np.isnan(none.topk).all()
    with pytest.raises(AnalysisError, match="grids"):
        seed_aggregate(np.zeros((2, 2)))
    with pytest.raises(AnalysisError, match="k must be"):
        sync_r2_topk(np.zeros((2, 2)), 0)


def test_mean_se_over_split_seeds():
    """One mean_se (synclib.stats) for the results file and the book: over an axis,
    NaN-aware, and the standard error of a single value is undefined (NaN, not 0)."""
    v = np.array([[0.4, 0.5, 0.6], [0.3, np.nan, np.nan], [np.nan, np.nan, np.nan]])
    m, se = mean_se(v, axis=-1)
    np.testing.assert_allclose(m, [0.5, 0.3, np.nan])
    np.testing.assert_allclose(se, [0.1 / np.sqrt(3), np.nan, np.nan])
    assert mean_se(v[0]) == pytest.approx((0.5, 0.1 / np.sqrt(3)))  # flattened: floats
    m, se = mean_se([0.7])
    assert m == 0.7 and np.isnan(se)
    m, se = mean_se(np.array([[1.0, np.inf, 3.0]]), axis=1)  # non-finite values are left out
    assert m[0] == 2.0 and se[0] == pytest.approx(1.0)
    # figure 4a's reference error bar: std (ddof 0) of the pair means / sqrt(3 n_pairs)
    assert reference_family_se([0.2, 0.4, np.nan]) == pytest.approx(0.1 / np.sqrt(6))
    assert np.isnan(reference_family_se([]))


# --------------------------------------------------------------------------- analyze
@pytest.fixture(scope="module")
def cube():
    return make_synthetic_cube(n_episodes=40, n_seeds=2, n_rounds=6,
                               shapes=Shapes(layers_a=4, dim_a=16, layers_b=3, dim_b=12), coupling=0.85, seed=1,
                               planted=Planted(signal=3.0))


@pytest.fixture(scope="module")
def result(cube):
    return analyze(cube, n_samples=400, split_seeds=(0, 1), persona_disjoint=True, relationship=True,
                   relationship_min=3, sample_sizes=(120, 240), progress=False, log=lambda m: None)


def test_genuine_beats_passive_and_lag(result):
    m = result.sync_r2
    assert m.dims == ("condition", "direction")
    for d in ("A->B", "B->A"):
        g = float(m.sel(condition="genuine", direction=d))
        assert g > float(m.sel(condition="passive", direction=d)) > float(m.sel(condition="lag2", direction=d))
        assert g > float(m.sel(condition="lag1", direction=d))
        assert g > float(m.sel(condition="shuffled", direction=d))
    assert result.r2.dims == ("condition", "direction", "split_seed", "src_layer", "tgt_layer")
    assert result.train_r2.dims == result.r2.dims
    # A has 4 layers, B 3: A->B grid is 4 x 3 padded with NaN
    g = result.r2.sel(condition="genuine", direction="A->B", split_seed=0).values
    assert np.isnan(g[:, 3]).all() and np.isfinite(g[:, :3]).all()
    assert np.isnan(result.r2.sel(condition="genuine", direction="B->A").values[:, 3]).all()
    # the maps fit their training rows at least as well as the test rows
    t = result.train_r2.sel(condition="genuine").values
    assert (t[np.isfinite(t)] > result.r2.sel(condition="genuine").values[np.isfinite(t)] - 0.05).all()
    # per seed: the formula on each stored grid; reference: on the seed-mean grid
    assert float(result.sync_r2_per_seed.sel(condition="genuine", direction="A->B", split_seed=0)) == \
        pytest.approx(sync_r2(g))
    for c in result.condition.values:
        for d in result.direction.values:
            grids = result.r2.sel(condition=c, direction=d).values
            a = seed_aggregate(grids)
            got = result.sel(condition=c, direction=d)
            np.testing.assert_allclose([float(got.sync_r2), float(got.sync_r2_se), float(got.sync_r2_noclip),
                                        float(got.sync_r2_noclip_se)],
                                       [a.sync_r2, a.sync_r2_se, a.noclip, a.noclip_se])
            np.testing.assert_allclose(got.sync_r2_topk.values, a.topk)
            np.testing.assert_allclose(got.r2_mean.values, a.mean)
            assert float(got.sync_r2_topk.sel(k=1)) == pytest.approx(float(got.sync_r2))
    for name in ("sync_r2", "sync_r2_se", "sync_r2_per_seed", "sync_r2_topk", "r2_mean"):
        assert result[name].attrs["aggregation"] and name + ":" in result.attrs["aggregation"]
    # the split: the reference's rule (here every dataset is short of 400: test >= 80, train the rest)
    assert (result.n_train + result.n_test == result.n_available.broadcast_like(result.n_train)).all()
    assert (result.split_short == 1).all() and (result.n_test >= 80).all()
    # the shuffled control uses the genuine dataset and split
    for v in ("n_train", "n_test", "n_available"):
        np.testing.assert_array_equal(result[v].sel(condition="shuffled"), result[v].sel(condition="genuine"))


def test_reference_split_in_analyze(cube):
    """n_samples below what the cube holds: the reference's targets, recorded per split."""
    r = analyze(cube, conditions=("genuine", "lag2"), n_samples=200, split_seeds=(0, 1, 2), progress=False,
                log=lambda m: None)
    g = r.sel(condition="genuine")
    assert (g.split_short == 0).all() and (g.n_test >= 200 - 160).all() and (g.n_train >= 160).all()
    ds = build_dataset(cube, "A->B")
    for si, seed in enumerate((0, 1, 2)):
        tr, te, info = episode_split(ds.episode, 200, seed, n_groups=cube.sizes["episode"])
        assert int(g.n_train.sel(direction="A->B", split_seed=seed)) == len(tr) == info["n_train"]
        assert int(g.n_test.sel(direction="A->B", split_seed=seed)) == len(te)
    # B->A lag2 holds 106 samples: test >= 40, training 160 or all the rest
    short = r.sel(condition="lag2", direction="B->A")
    assert int(short.n_available) < 200 and (short.split_short == 1).all()
    assert (short.n_train + short.n_test == short.n_available).all()


def test_bad_split_seed_names_the_parameter(cube):
    with pytest.raises(AnalysisError, match="split_seeds"):
        analyze(cube, conditions=("genuine",), split_seeds=(-1,), progress=False)


def test_empty_training_set_is_a_note_not_a_crash(cube):
    notes = []
    r = analyze(cube, conditions=("lag2",), n_samples=600, split_seeds=(0,), directions=("B->A",),
                progress=False, log=notes.append)  # 106 samples: the test set (>= 120) takes them all
    assert np.isnan(r.r2).all() and np.isnan(r.sync_r2).all()
    assert int(r.split_short[0, 0, 0]) == -1 and int(r.n_train[0, 0, 0]) == 0
    assert any("leaves none of the 106 available for training" in n for n in notes)


def test_shuffled_control_moves_only_training_targets_within_dialogs():
    cube = hand_cube()
    ds = build_dataset(cube, "A->B", "shuffled")
    seed = 1
    rs = np.random.RandomState(seed)
    tr, te, info = episode_split(ds.episode, 10, rs, n_groups=3)
    y = shuffle_training_targets(ds, info["train_groups"], rs)
    np.testing.assert_array_equal(y[te], ds.y_rows[te])  # test set untouched
    assert not np.array_equal(y[tr], ds.y_rows[tr])      # training targets moved
    for e in range(3):
        for s in range(2):
            dialog = (ds.episode == e) & (ds.sim_seed == s)
            assert sorted(y[dialog]) == sorted(ds.y_rows[dialog])  # within each dialog
    # the reference's draws: the split's RandomState continues over training episodes in split
    # order, seeds ascending, one permutation per dialog with more than one sample
    ref = np.random.RandomState(seed)
    ref.permutation(3)
    expected = ds.y_rows.copy()
    for e in info["train_groups"]:
        for s in range(2):
            idx = np.flatnonzero((ds.episode == e) & (ds.sim_seed == s))
            if len(idx) > 1:
                expected[idx] = ds.y_rows[idx[ref.permutation(len(idx))]]
    np.testing.assert_array_equal(y, expected)
    # decoded: sources stay, a training target comes from the same dialog
    for i in tr:
        ye, ys, _ = decode(ds.Y[y[i], 0, 0])
        assert (ye, ys) == (ds.episode[i], ds.sim_seed[i])


def test_optional_blocks(result):
    pd = result.persona_disjoint_sync_r2_per_seed
    assert pd.dims == ("direction", "split_seed") and np.isfinite(pd).all()
    ss = result.sample_size_sync_r2_per_seed
    assert list(ss.sample_size.values) == [120, 240] and np.isfinite(ss).all()
    assert ((result.sample_size_n_used >= ss.sample_size) | (result.sample_size_n_used == 0)).all()
    rel = result.relationship_sync_r2
    assert rel.dims == ("relationship", "direction", "split_seed", "relationship_seed")
    assert list(rel.relationship.values) == [RELATIONSHIPS[c] for c in sorted(RELATIONSHIPS)]  # code order
    assert np.isfinite(rel).any()
    assert "social_iqa" in result.attrs["relationship_sources"]
    assert result.persona_disjoint_sync_r2.dims == ("direction",)
    assert result.persona_disjoint_sync_r2_per_seed.dims == ("direction", "split_seed")
    assert result.sample_size_sync_r2.dims == ("sample_size", "direction")
    assert np.isfinite(result.persona_disjoint_sync_r2).all() and np.isfinite(result.sample_size_sync_r2).all()
    assert "agent pairs" in result.attrs["persona_split_rule"]


def test_short_cube_is_noted(cube):
    notes = []
    r = analyze(cube, conditions=("genuine",), n_samples=350, split_seeds=(0,), progress=False,
                log=notes.append)
    assert notes and "fewer than n_samples" in notes[0]
    assert "fewer than n_samples" in r.attrs["notes"]
    assert int(r.n_train[0, 0, 0] + r.n_test[0, 0, 0]) == int(r.n_available[0, 0])
    assert int(r.split_short[0, 0, 0]) == 1
    # one split seed: a score, but no standard error (undefined for one value)
    assert np.isfinite(r.sync_r2).all() and np.isnan(r.sync_r2_se).all()


def test_analyze_cv_records_alphas(cube):
    r = analyze(cube, conditions=("genuine",), alpha="cv", n_samples=600, split_seeds=(0,),
                progress=False, log=lambda m: None)
    a = r.alpha.sel(condition="genuine", direction="A->B", split_seed=0).values
    assert np.isfinite(a[:4]).all() and np.isnan(a[4:]).all()
    assert r.attrs["alpha"] == "cv"


def test_netcdf_roundtrip_and_cli(tmp_path, cube, result):
    p = tmp_path / "res.nc"
    result.to_netcdf(p)
    back = xr.open_dataset(p).load()
    assert back.identical(result)
    cpath = tmp_path / "cube.nc"
    cube.to_netcdf(cpath)
    from synclib.cli import main

    out = tmp_path / "out" / "pair.nc"
    # without --config every analysis block is on (the keys' defaults): the blocks this test does not read, off
    rc = main(["analyze", str(cpath), "--out", str(out), "--conditions", "genuine,lag1",
               "--n-samples", "500", "--split-seeds", "0,1", "--persona-disjoint", "--no-progress",
               "--surrogates", "0", "--planted", "0", "--no-relationship", "--no-nonlinear", "--no-tom",
               "--max-resident-gib", "0"])  # stream every variable
    assert rc == 0 and out.exists()
    r = xr.open_dataset(out)
    assert list(r.condition.values) == ["genuine", "lag1"]
    assert (r.sync_r2.sel(condition="genuine") > r.sync_r2.sel(condition="lag1")).all()
    assert "persona_disjoint_sync_r2" in r
    assert main(["analyze", str(tmp_path / "missing.nc"), "--out", str(out)]) == 2
    with pytest.raises(SystemExit) as refused:  # refused by argparse before the cube is opened
        main(["analyze", str(cpath), "--out", str(out), "--max-resident-gib", "-1"])
    assert refused.value.code == 2


def test_nonlinear_comparator_runs(cube):
    r = analyze(cube, conditions=("genuine",), n_samples=600, split_seeds=(0,), nonlinear=True,
                nonlinear_options={"epochs": 15, "hidden": 64, "lr": 1e-3}, progress=False, log=lambda m: None)
    nl, af = r.nonlinear_r2.values, r.affine_r2.values
    used = (r.nonlinear_src_layer >= 0).values[:, None, :]  # B->A has 3 source layers: 3 pairs
    assert nl.shape == af.shape and np.isfinite(nl[np.broadcast_to(used, nl.shape)]).all()
    assert np.isnan(nl[1, :, 3]).all()
    # the planted map is linear: the MLP learns a real part of it
    assert (nl[np.broadcast_to(used, nl.shape)] > 0.2 * af[np.broadcast_to(used, af.shape)]).all()
    src = r.nonlinear_src_layer.sel(direction="A->B").values
    tgt = r.nonlinear_tgt_layer.sel(direction="A->B", split_seed=0).values
    g = r.r2.sel(condition="genuine", direction="A->B", split_seed=0).values
    np.testing.assert_allclose(af[0, 0], g[src, tgt])
    assert np.isfinite(r.nonlinear_val_r2.sel(direction="A->B").values).all()


def test_nonlinear_targets_are_chosen_without_the_test_set(cube):
    """Table 5's target layers come from a validation part of each split's training set: noise
    written over the test samples' targets changes the scores, never the chosen layers (they
    used to be chosen by the affine map's test R^2, which favoured the affine map)."""
    from synclib.analysis.samples import build_dataset
    from synclib.splits import episode_split

    kw = dict(conditions=("genuine",), n_samples=600, split_seeds=(0,), nonlinear=True,
              nonlinear_options={"epochs": 2, "hidden": 8}, progress=False, log=lambda m: None)
    r = analyze(cube, **kw)
    samples = build_dataset(cube, "A->B")
    _, test, _ = episode_split(samples.episode, 600, 0, n_groups=cube.sizes["episode"])
    noisy = cube.copy(deep=True)
    hb = noisy.hidden_b.values  # A->B targets: hidden_b at the source's round
    rng = np.random.default_rng(1)
    for i in test:
        e, s, k = samples.episode[i], samples.sim_seed[i], samples.round[i]
        hb[e, s, k] = rng.normal(size=hb[e, s, k].shape)
    r2 = analyze(noisy, **kw)
    sel = dict(direction="A->B", split_seed=0)
    assert (r2.nonlinear_tgt_layer.sel(**sel) == r.nonlinear_tgt_layer.sel(**sel)).all()
    np.testing.assert_allclose(r2.nonlinear_val_r2.sel(**sel), r.nonlinear_val_r2.sel(**sel))
    assert not np.allclose(r2.affine_r2.sel(**sel), r.affine_r2.sel(**sel))


def test_mlp_batch_equals_each_map_alone():
    """mlp_r2_batch trains P maps side by side, each exactly as mlp_r2 trains it alone."""
    from synclib.analysis.mlp import MLPOptions, mlp_r2, mlp_r2_batch

    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, 120, 6))
    Y = np.stack([np.tanh(x @ rng.normal(size=(6, 4))) for x in X])
    opts = MLPOptions(epochs=8, hidden=16, lr=1e-2, batch_size=32)
    batch = mlp_r2_batch(X[:, :90], Y[:, :90], X[:, 90:], Y[:, 90:], opts, seed=3)
    alone = [mlp_r2(X[p, :90], Y[p, :90], X[p, 90:], Y[p, 90:], opts, seed=3) for p in range(3)]
    np.testing.assert_allclose(batch, alone, atol=1e-5)


def test_mlp_early_stopping_picks_the_epochs_on_the_validation_part():
    """Noisy targets and a large learning rate: the MLP overfits, so the validation error turns
    up and the rule stops early; the refit on all rows for those epochs is the fixed-epoch MLP
    trained for them (each map at its own epoch count)."""
    from synclib.analysis.mlp import MLPOptions, mlp_r2_batch

    rng = np.random.default_rng(1)
    X = rng.normal(size=(2, 150, 8))
    Y = np.stack([np.tanh(x[:, :3]) + rng.normal(scale=1.0, size=(150, 3)) for x in X])
    opts = dict(hidden=64, lr=3e-2, batch_size=32)
    val = np.arange(90, 120)  # inside the training rows 0..119
    r2, epochs = mlp_r2_batch(X[:, :120], Y[:, :120], X[:, 120:], Y[:, 120:],
                              MLPOptions(epochs=150, patience=10, **opts), seed=0, val=val, return_epochs=True)
    assert epochs.shape == (2,) and (1 <= epochs).all() and (epochs < 150).all()
    for p in range(2):
        alone = mlp_r2_batch(X[p:p + 1, :120], Y[p:p + 1, :120], X[p:p + 1, 120:], Y[p:p + 1, 120:],
                             MLPOptions(epochs=int(epochs[p]), **opts), seed=0)
        np.testing.assert_allclose(r2[p], alone[0], atol=1e-5)


def test_mlp_group_losses_resample_its_test_r2():
    """The MLP's losses per test group resample its R² as the ridge grids' do (resampled_r2): all groups once give
    its test R², and a resample's residual sum equals the one of the same network scored on the drawn rows alone
    (one target column, so R² = 1 - SS_res / SS_tot on either set of rows)."""
    from synclib.analysis.mlp import MLPOptions, mlp_r2_batch
    from synclib.analysis.ridge import resampled_r2

    rng = np.random.default_rng(2)
    X = rng.normal(size=(2, 140, 5))
    Y = np.stack([np.tanh(x[:, :1]) + rng.normal(scale=0.3, size=(140, 1)) for x in X])
    groups = np.repeat([7, 3, 9, 5], 10)  # four test episodes of 10 samples
    opts = MLPOptions(epochs=5, hidden=8, lr=1e-2)
    r2, loss = mlp_r2_batch(X[:, :100], Y[:, :100], X[:, 100:], Y[:, 100:], opts, seed=1, test_groups=groups)
    np.testing.assert_array_equal(loss.labels, [3, 5, 7, 9])
    assert loss.loss.shape == (4, 2) and list(loss.sizes) == [10] * 4
    np.testing.assert_allclose(resampled_r2(r2[None], loss.loss[:, None], loss.sizes, np.ones((1, 4)))[0, 0], r2,
                               atol=1e-12)
    got = resampled_r2(r2[None], loss.loss[:, None], loss.sizes, np.array([[2, 0, 1, 1]]))[0, 0]  # 3 twice, 5 never
    rows = np.concatenate([np.flatnonzero(groups == g) for g in (3, 3, 7, 9)]) + 100
    alone = mlp_r2_batch(X[:, :100], Y[:, :100], X[:, rows], Y[:, rows], opts, seed=1)  # the same network
    for p in range(2):
        ss_full = ((Y[p, 100:, 0] - Y[p, 100:, 0].mean()) ** 2).sum()
        ss_rows = ((Y[p, rows, 0] - Y[p, rows, 0].mean()) ** 2).sum()
        res_rows = (1 - alone[p]) * ss_rows
        assert (1 - got[p]) * ss_full * len(rows) / 40 == pytest.approx(res_rows, rel=1e-5)


def test_nonlinear_seeds_fits_the_first_split_seeds_only(cube, monkeypatch):
    """The MLPs on the first split seed only; their episode bootstrap (nonlinear_gap_boot), on a resample that draws
    every episode once, is the split's MLP minus affine test R² averaged over the layer pairs."""
    import synclib.analysis.core as core

    monkeypatch.setattr(core, "episode_draws", lambda n, b: np.ones((1, n), dtype=np.int64))
    r = analyze(cube, conditions=("genuine",), n_samples=600, split_seeds=(0, 1), nonlinear=True,
                nonlinear_options={"epochs": 3, "hidden": 16, "lr": 1e-3}, nonlinear_seeds=1, n_boot=1,
                progress=False, log=lambda m: None)
    used = (r.nonlinear_src_layer >= 0).values
    assert np.isfinite(r.nonlinear_r2.sel(split_seed=0).values[used]).all()
    assert np.isnan(r.nonlinear_r2.sel(split_seed=1).values).all()
    assert np.isnan(r.affine_r2.sel(split_seed=1).values).all()
    gap = (r.nonlinear_r2 - r.affine_r2).sel(split_seed=0).mean("layer_pair")
    np.testing.assert_allclose(r.nonlinear_gap_boot.sel(boot=0).values, gap.values, atol=1e-9)


# --------------------------------------------------------------------------- streaming
class _LargestResult:
    """A dask callback recording the largest array any task produced."""

    def __init__(self):
        from dask.callbacks import Callback

        outer = self
        self.nbytes = 0

        class CB(Callback):
            def _posttask(self, key, result, dsk, state, id):
                outer.nbytes = max(outer.nbytes, getattr(result, "nbytes", 0))

        self.callback = CB()


def test_lazy_cube_streams_and_equals_in_memory(tmp_path, cube):
    """A lazily opened cube whose variables exceed the resident budget is analysed
    from disk, reading only the rows of each split, with the in-memory results."""
    lazy = write_chunked_cube(cube, tmp_path / "cube.nc")
    assert lazy.hidden_a.chunks is not None
    kw = dict(conditions=("genuine", "passive", "lag1"), n_samples=150, split_seeds=(0, 1),
              persona_disjoint=True, relationship=True, relationship_min=3, sample_sizes=(100,),
              nonlinear=True, nonlinear_options={"epochs": 2}, tom=True,
              tom_options={"alphas": (1.0, 100.0)}, progress=False, log=lambda m: None)
    ref = analyze(cube, **kw)
    largest = _LargestResult()
    with largest.callback:
        got = analyze(lazy, max_resident_bytes=0, **kw)
    var_bytes = lazy.hidden_a.nbytes
    # no task ever produced a whole variable: the largest read is a split's rows
    assert 0 < largest.nbytes < var_bytes / 2, (largest.nbytes, var_bytes)
    for name in ref.data_vars:
        np.testing.assert_allclose(got[name].values, ref[name].values, rtol=1e-9, atol=1e-12,
                                   err_msg=name)


@pytest.mark.parametrize("batch_bytes", [1, 256 << 20])  # one unit per read, all units at once
def test_hidden_rows_indexing(tmp_path, cube, monkeypatch, batch_bytes):
    from synclib.cube import reader as cube_mod
    from synclib.cube import CubeError, HiddenRows

    monkeypatch.setattr(cube_mod, "READ_BATCH_BYTES", batch_bytes)
    lazy = write_chunked_cube(cube, tmp_path / "cube.nc")
    full = cube.hidden_b.values.reshape(-1, *cube.hidden_b.shape[3:])
    mem, streamed = HiddenRows(cube.hidden_b), HiddenRows(lazy.hidden_b, max_resident_bytes=0)
    assert mem.resident and not streamed.resident and streamed.array is None
    assert streamed.shape == mem.shape == full.shape
    np.testing.assert_array_equal(streamed.ok, np.isfinite(full).reshape(len(full), -1).all(1))
    rows = np.array([7, 3, 3, len(full) - 1])
    lay, dim = np.array([2, 0]), np.array([1, 4, 4])
    cases = [((rows,), full[rows]), ((rows, 1), full[rows, 1]), ((rows, slice(0, 2)), full[rows, :2]),
             ((5,), full[5]), ((5, 1, 3), full[5, 1, 3]),
             ((rows, lay), full[rows][:, lay]),  # outer indexing, one axis at a time
             ((rows, lay, dim), full[rows][:, lay][:, :, dim])]
    for key, expected in cases:
        np.testing.assert_array_equal(streamed[key], expected, err_msg=str(key))
        np.testing.assert_array_equal(mem[key], expected, err_msg=str(key))
    assert streamed[np.array([], dtype=int)].shape == (0,) + full.shape[1:]
    with pytest.raises(IndexError, match="hidden_b"):
        streamed[np.array([0.5])]
    with pytest.raises(IndexError, match="hidden_b: rows outside"):
        streamed[np.array([0, len(full)])]
    with pytest.raises(CubeError, match="n_utterances"):
        HiddenRows(cube.n_utterances)


# --------------------------------------------------------------------------- reference parity
def _reference_checkout():
    """A checkout of the reference code: $SYNCLIB_REFERENCE, else /tmp/ref; None if neither is one."""
    for p in (os.environ.get("SYNCLIB_REFERENCE"), "/tmp/ref"):
        if p and (Path(p) / "affine_transformation.py").is_file() and \
                (Path(p) / "playground" / "data_analysis.py").is_file():
            return Path(p)
    return None


@pytest.mark.skipif(_reference_checkout() is None,
                    reason="no reference checkout: set SYNCLIB_REFERENCE to a checkout of "
                           "zzn-nzz/LM_neural_synchrony @ 49fe97e1 (or extract it to /tmp/ref)")
def test_reference_parity_harness(tmp_path):
    """tools/reference_analysis_parity.py: the reference's own training and aggregation on a
    synthetic cube equal synclib's analysis within 1e-5, splits identical (~30 s)."""
    out = tmp_path / "parity.json"
    tool = Path(__file__).resolve().parents[1] / "tools" / "reference_analysis_parity.py"
    proc = subprocess.run([sys.executable, str(tool), "--reference", str(_reference_checkout()),
                           "--n-episodes", "60", "--n-samples", "1200", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["pass"] and max(rep["max_abs_diff"].values()) <= 1e-5
    assert {(j["condition"], j["direction"]) for j in rep["jobs"]} == {
        (c, d) for c in ("genuine", "passive", "lag1", "lag2", "shuffled") for d in ("A->B", "B->A")}
    assert all(all(j["split_equal"]) for j in rep["jobs"])
    shorts = {max(j["split_short"]) for j in rep["jobs"]}
    assert shorts == {0, 1}  # both branches of the split rule were compared


# --------------------------------------------------------------------------- issue 34
def test_the_papers_penalty_is_refitted_for_a_run_with_another(cube, result):
    """Figure 8 at the paper's lambda: a cross-validated run also scores the genuine maps at 0.1,
    on the same splits, exactly as a run at 0.1 scores them."""
    cv = analyze(cube, conditions=("genuine",), alpha="cv", n_samples=400, split_seeds=(0, 1), n_boot=0,
                 progress=False, log=lambda m: None)
    np.testing.assert_allclose(cv.paper_alpha_r2.values, result.r2.sel(condition="genuine").values, atol=1e-9)
    for v in ("sync_r2", "sync_r2_se", "sync_r2_noclip", "sync_r2_noclip_se"):
        np.testing.assert_allclose(cv[f"paper_alpha_{v}"].values, result[v].sel(condition="genuine").values)
    assert cv.attrs["paper_alpha"] == 0.1 and "paper_alpha_sync_r2" not in result  # a run at 0.1 has it already
    g = cv.sel(condition="genuine")
    assert (np.isfinite(g.train_r2) == np.isfinite(g.r2)).all()  # training R^2 wherever a map was fitted


def test_training_r2_only_for_the_genuine_condition(result):
    assert np.isfinite(result.train_r2.sel(condition="genuine")).any()
    assert np.isnan(result.train_r2.sel(condition="passive")).all()


def test_episode_resamples_all_once_give_the_reported_syncr2(cube, result):
    """The dialog-level resampling with every episode drawn once is the analysis itself; the
    stored resamples centre on it and differ between conditions."""
    from synclib.analysis.blocks import episode_bootstrap, episode_draws
    from synclib.analysis.context import Context
    from synclib.analysis.samples import HiddenCache, build_dataset
    from synclib.penalty import Penalty
    from synclib.splits import episode_split

    ctx = Context(cube=cube, directions=("A->B",), split_seeds=[0, 1], n_samples=400, penalty=Penalty(), device=None,
                  precision="float32", max_resident_bytes=None, progress=False, log=lambda m: None,
                  arrays=HiddenCache(cube))
    samples = build_dataset(cube, "A->B")
    fits = []
    for seed in (0, 1):
        tr, te, _ = episode_split(samples.episode, 400, seed, n_groups=cube.sizes["episode"])
        fits.append(ctx.fit(samples, seed, tr, te, "x", episode_loss=True))
    ones = np.ones((1, cube.sizes["episode"]))
    got = episode_bootstrap(fits, ones)[0]
    assert got == pytest.approx(float(result.sync_r2.sel(condition="genuine", direction="A->B")), abs=1e-9)
    draws = episode_draws(cube.sizes["episode"], 50)
    assert draws.shape == (50, cube.sizes["episode"]) and (draws.sum(1) == cube.sizes["episode"]).all()
    assert (episode_draws(cube.sizes["episode"], 50) == draws).all()  # the same draws every time
    boot = result.sync_r2_boot
    assert boot.dims == ("condition", "direction", "boot") and boot.sizes["boot"] == 2000
    g = boot.sel(condition="genuine")
    assert (np.abs(g.median("boot") - result.sync_r2.sel(condition="genuine")) < 3 * g.std("boot")).all()
    assert (boot.sel(condition="genuine") - boot.sel(condition="lag2")).mean() > 0
    assert "episodes" in result.attrs["boot_rule"] and result.attrs["n_episodes"] == cube.sizes["episode"]


def test_relationship_categories_count_their_scenarios(cube, result):
    from synclib.analysis.blocks import RELATIONSHIP_SOURCES

    keep = np.isin(cube.source.values.astype(str), RELATIONSHIP_SOURCES)
    for code, rel in enumerate(result.relationship.values):
        sel = keep & (cube.relationship.values == code)
        assert int(result.relationship_n_episodes.sel(relationship=rel)) == sel.sum()
        assert int(result.relationship_n_scenarios.sel(relationship=rel)) == len(set(cube.codename.values[sel]))


def test_relationships_skip_a_split_whose_maps_were_not_fitted(cube, monkeypatch):
    """A split whose ridge fit raised (too few or degenerate samples) keeps NaN penalties; the
    relationship block notes it and leaves the categories NaN instead of stopping the analysis."""
    from synclib.analysis import context
    from synclib.splits import RidgeInputError

    def refuse(*args, **kwargs):
        raise RidgeInputError("no usable training samples (test)")

    monkeypatch.setattr(context, "r2_grid", refuse)
    notes = []
    out = analyze(cube, conditions=("genuine",), n_samples=400, split_seeds=(0,), relationship=True,
                  relationship_min=3, cka=False, n_boot=0, progress=False, log=notes.append)
    assert np.isnan(out["relationship_sync_r2"].values).all()
    assert any("relationship" in n and "not fitted" in n for n in notes), notes
