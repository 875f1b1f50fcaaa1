"""Linear CKA (synclib.analysis.cka), debiased and Kornblith et al.'s: against reference implementations, its
invariances, its permutation null, the analysis' ``cka`` variables, the results tables and the controls page."""
from __future__ import annotations

import numpy as np
import pytest

from synclib.analysis import analyze, build_dataset, cka_grid, linear_cka, shuffle_training_targets, sim_seed_rank
from synclib.analysis.blocks import CKA_PERMUTATIONS, CKA_SHUFFLE_SEED
from synclib.analysis.cka import cka_null
from synclib.analysis.contrasts import common_rows
from synclib.stats import fmt
from synthetic import Planted, Shapes, build_synthetic_results, make_synthetic_cube


def hsic_cka(X, Y) -> float:
    """The HSIC form with an explicit centering matrix: HSIC(K, L) = tr(K H L H) / (n-1)^2."""
    X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
    n = len(X)
    H = np.eye(n) - np.ones((n, n)) / n
    K, L = X @ X.T, Y @ Y.T

    def hsic(A, B):
        return np.trace(A @ H @ B @ H) / (n - 1) ** 2

    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def unbiased_cka(X, Y) -> float:
    """Song et al.'s unbiased HSIC, written out term by term, normalised as CKA:
    HSIC_u(K, L) = [tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)), K~ the Gram with a zero
    diagonal."""
    X, Y = np.asarray(X, dtype=np.float64), np.asarray(Y, dtype=np.float64)
    n = len(X)

    def tilde(Z):
        K = Z @ Z.T
        np.fill_diagonal(K, 0.0)
        return K

    def hsic(A, B):
        one = np.ones(n)
        return (np.trace(A @ B) + (one @ A @ one) * (one @ B @ one) / ((n - 1) * (n - 2))
                - 2.0 / (n - 2) * (one @ A @ B @ one)) / (n * (n - 3))

    K, L = tilde(X), tilde(Y)
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def _pair(seed=0, n=40, dx=30, dy=12):
    """Paired samples (n, dx), (n, dy): Y a noisy linear image of X, both off-centre."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dx)) + 3.0  # an offset: centering matters
    Y = X @ rng.normal(size=(dx, dy)) + 0.7 * rng.normal(size=(n, dy)) - 1.0
    return X, Y


@pytest.mark.parametrize("n, dx, dy", [(40, 30, 12), (25, 64, 48), (80, 5, 7)])
def test_linear_cka_equals_the_hsic_references(n, dx, dy):
    X, Y = _pair(n, n, dx, dy)
    assert linear_cka(X, Y, debiased=False) == pytest.approx(hsic_cka(X, Y), abs=1e-6)
    assert linear_cka(X, Y) == pytest.approx(unbiased_cka(X, Y), abs=1e-6)
    assert linear_cka(X.astype(np.float32), Y.astype(np.float32)) == pytest.approx(unbiased_cka(X, Y), abs=1e-6)
    assert 0.0 <= linear_cka(X, Y, debiased=False) <= 1.0 and linear_cka(X, Y) <= 1.0


def test_debiased_cka_is_about_0_for_unrelated_states_at_any_sample_count():
    """The issue's case: independent random states of the embedded models' widths, 150 samples: Kornblith et al.'s
    estimator scores them about 0.8, and more as the samples fall; the debiased one about 0 at every count."""
    rng = np.random.default_rng(0)
    for n in (60, 150):
        draws = [(rng.standard_normal((n, 576)), rng.standard_normal((n, 640))) for _ in range(3)]
        biased = np.mean([linear_cka(X, Y, debiased=False) for X, Y in draws])
        debiased = np.mean([linear_cka(X, Y) for X, Y in draws])
        assert biased > 0.75 and abs(debiased) < 0.02, (n, biased, debiased)


def test_cka_null_is_the_grids_mean_with_the_targets_permuted():
    rng = np.random.default_rng(4)
    src = rng.normal(size=(40, 3, 10))
    tgt = np.stack([src[:, 0, :6] + 0.5 * rng.normal(size=(40, 6)), rng.normal(size=(40, 6))], axis=1)
    tgt[:, 1] = 2.0  # a constant layer: NaN in the grid, left out of the mean
    observed, null = cka_null(src, tgt, 20, seed=3)
    grid = cka_grid(src, tgt)
    assert np.isnan(grid[:, 1]).all() and observed == pytest.approx(np.nanmean(grid), abs=1e-12)
    perms = np.random.default_rng(3)
    for k in range(3):  # the same permutations, drawn in order
        p = perms.permutation(40)
        assert null[k] == pytest.approx(np.nanmean(cka_grid(src, tgt[p])), abs=1e-12)
    assert null.shape == (20,) and observed > np.quantile(null, 0.95) and abs(null.mean()) < 0.05
    assert np.isnan(cka_null(src[:3], tgt[:3], 5)[0])


def test_cka_of_a_set_with_itself_is_one_and_it_is_symmetric():
    X, Y = _pair()
    assert linear_cka(X, X) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(X, Y) == pytest.approx(linear_cka(Y, X), abs=1e-12)


def test_cka_invariances():
    X, Y = _pair(seed=3)
    rng = np.random.default_rng(7)
    Q, _ = np.linalg.qr(rng.normal(size=(X.shape[1], X.shape[1])))  # orthogonal
    base = linear_cka(X, Y)
    assert linear_cka(X @ Q, Y) == pytest.approx(base, abs=1e-10)
    assert linear_cka(4.5 * X, 0.01 * Y) == pytest.approx(base, abs=1e-10)  # isotropic scaling
    assert linear_cka(X + 11.0, Y - 2.0) == pytest.approx(base, abs=1e-10)  # translation (centred)
    # not invariant to an arbitrary invertible map: anisotropic scaling changes it
    assert abs(linear_cka(X * np.linspace(0.1, 10, X.shape[1]), Y) - base) > 1e-3


def test_cka_grid_equals_linear_cka_per_layer_pair_and_in_blocks():
    rng = np.random.default_rng(1)
    src = rng.normal(size=(30, 3, 20)).astype(np.float32)
    tgt = (src[:, [2, 0, 1, 1], :8] + rng.normal(size=(30, 4, 8))).astype(np.float32)
    grid = cka_grid(src, tgt)
    assert grid.shape == (3, 4) and grid.dtype == np.float64
    for i in range(3):
        for j in range(4):
            assert grid[i, j] == pytest.approx(unbiased_cka(src[:, i], tgt[:, j]), abs=1e-6)
            assert grid[i, j] == pytest.approx(linear_cka(src[:, i], tgt[:, j]), abs=1e-12)
    np.testing.assert_allclose(cka_grid(src, tgt, block_bytes=1), grid, atol=1e-12)  # one row a block
    np.testing.assert_allclose(cka_grid(src, tgt, block_bytes=8 * 30 * 7 * 4), grid, atol=1e-12)
    np.testing.assert_allclose(cka_grid(src, tgt, debiased=False, block_bytes=1),
                               [[hsic_cka(src[:, i], tgt[:, j]) for j in range(4)] for i in range(3)], atol=1e-6)


def test_cka_degenerate_inputs():
    X = np.ones((10, 4))
    assert np.isnan(linear_cka(X, np.random.default_rng(0).normal(size=(10, 3))))
    assert np.isnan(cka_grid(np.zeros((1, 2, 3)), np.zeros((1, 2, 3)), debiased=False)).all()
    assert np.isnan(cka_grid(*np.random.default_rng(0).normal(size=(2, 3, 2, 3)))).all()  # 3 samples: too few
    with pytest.raises(ValueError, match="same n"):
        linear_cka(np.zeros((5, 2)), np.zeros((4, 2)))


# --------------------------------------------------------------------------- the analysis
@pytest.fixture(scope="module")
def cube():
    return make_synthetic_cube(n_episodes=30, n_seeds=2, n_rounds=5,
                               shapes=Shapes(layers_a=4, dim_a=16, layers_b=3, dim_b=12), coupling=0.85, seed=2,
                               planted=Planted(signal=3.0), tom=False)


@pytest.fixture(scope="module")
def result(cube):
    return analyze(cube, n_samples=200, split_seeds=(0, 1), n_boot=0, progress=False, log=lambda m: None)


def test_analysis_has_cka_on_all_samples(cube, result):
    v = result["cka"]
    assert v.dims == ("condition", "direction", "src_layer", "tgt_layer")
    assert list(v.condition.values) == ["genuine", "passive", "shuffled", "pseudo", "lag1", "lag2"]
    assert "all samples" in v.attrs["samples"] and "all samples" in result.attrs["cka_rule"]
    assert v.attrs["estimator"] == "debiased"
    # A->B: 4 source layers, 3 target layers; the rest NaN padding
    ab = v.sel(direction="A->B").values
    assert np.isfinite(ab[:, :4, :3]).all() and np.isnan(ab[:, :, 3]).all()
    ba = v.sel(direction="B->A").values
    assert np.isfinite(ba[:, :3, :4]).all() and np.isnan(ba[:, 3, :]).all()
    assert (ab[:, :4, :3] <= 1).all()
    # each condition's value is cka_grid of its whole dataset
    for cond in ("genuine", "lag1", "passive"):
        s = build_dataset(cube, "B->A", cond)
        np.testing.assert_allclose(v.sel(condition=cond, direction="B->A").values[:3, :4], cka_grid(*s.take(
            np.arange(s.n))), atol=1e-12)
    # shuffled: the genuine samples, every dialog's targets permuted by the shuffle rule
    s = build_dataset(cube, "A->B", "shuffled")
    y = shuffle_training_targets(s, range(cube.sizes["episode"]), np.random.RandomState(CKA_SHUFFLE_SEED),
                                 sim_seed_rank(cube))
    assert (y != s.y_rows).any()
    np.testing.assert_allclose(v.sel(condition="shuffled", direction="A->B").values[:4, :3],
                               cka_grid(s.X[s.x_rows], s.Y[y]), atol=1e-12)
    # the permutation null: genuine's mean over layer pairs with its targets permuted
    g = build_dataset(cube, "A->B", "genuine")
    observed, null = cka_null(*g.take(np.arange(g.n)), CKA_PERMUTATIONS, CKA_SHUFFLE_SEED)
    assert result["cka_null"].dims == ("direction", "permutation")
    np.testing.assert_allclose(result["cka_null"].sel(direction="A->B").values, null, atol=1e-12)
    assert observed == pytest.approx(float(np.nanmean(ab[0])), abs=1e-12)
    # each control beside genuine on the rows both hold
    lag = build_dataset(cube, "A->B", "lag1")
    gi, li = common_rows(g, lag)
    assert len(gi) < g.n
    side = result["cka_contrast"].sel(contrast="lag1", direction="A->B").values
    np.testing.assert_allclose(side, [np.nanmean(cka_grid(*g.take(gi))), np.nanmean(cka_grid(*lag.take(li)))],
                               atol=1e-12)


def test_cka_leaves_the_other_variables_unchanged(cube, result):
    without = analyze(cube, n_samples=200, split_seeds=(0, 1), n_boot=0, cka=False, progress=False,
                      log=lambda m: None)
    assert not {"cka", "cka_null", "cka_contrast"} & set(without) and "cka_rule" not in without.attrs
    for name in without.data_vars:
        np.testing.assert_array_equal(without[name].values, result[name].values)


# --------------------------------------------------------------------------- results and the sentence
def test_cka_table_frame_and_sentence(tmp_path, monkeypatch):
    import xarray as xr

    from pages import copy_results, run_page
    from synclib.analysis import claims, results

    root = build_synthetic_results(tmp_path / "r", analyze_kwargs={"tom": False})
    res = results.load_results(root)
    f = res.cka_frame(res.example_run())
    assert list(f.columns) == ["src_layer", "tgt_layer", "cka", "best"] and len(f)
    assert f["src_layer"].min() == 1 and f.groupby("src_layer")["best"].sum().eq(1).all()
    best = f[f["best"]].set_index("src_layer")["cka"]
    assert np.allclose(best, f.groupby("src_layer")["cka"].max().loc[best.index])
    t = res.cka_table()
    assert set(t["condition"]) == set(res.conditions()) and set(t["pair"]) == set(res.pair_names)
    assert (t["mean"] <= 1).all() and (t["best"] >= t["mean"]).all()
    assert (t["n_min"] <= t["n_max"]).all()
    g = t[(t.pair == "S-G") & (t.condition == "genuine")].iloc[0]
    assert g["sync_r2"] == pytest.approx(res.sync_table().set_index("pair").loc["S-G", "mean"])
    grids = [res.analysis(r)["cka"].sel(condition="genuine", direction=d).values
             for r in ("S-G", "G-S") for d in ("A->B", "B->A")]
    assert g["mean"] == pytest.approx(np.mean([np.nanmean(x) for x in grids]))
    # the controls page: the example run's CKA heatmap and the sentence, from the same table
    claims.write(res, results.load_published())
    shown = run_page("fig03_04_controls", results_dir=str(root))
    text = shown.text
    assert "These are numbers from synthetic test data, never the paper's" in text
    assert "shuffled: CKA puts genuine" in text and "samples of each dataset" in text
    null = res.tests("cka_null").set_index("pair")
    mean = fmt(null.loc["S-G", "null_mean"], 3).replace("-0.000", "0.000")
    assert f"S-G {fmt(null.loc['S-G', 'genuine'], 3)} against {mean} on average" in text
    assert f"the rank test's floor is {fmt(1 / (1 + CKA_PERMUTATIONS), 3)}" in text
    assert "On the samples both hold" in text and (null["n_perm"] == CKA_PERMUTATIONS).all()
    (spec,) = [c for c in shown.charts if "linear CKA per layer pair" in str(c.get("vconcat"))]
    assert "linear CKA" in str(spec) and "test R²" not in str(spec)
    monkeypatch.setattr(results.Results, "embedded", property(lambda self: True))
    monkeypatch.setattr(results.Results, "synthetic", property(lambda self: False))
    text = run_page("fig03_04_controls", results_dir=str(root)).text
    assert "the embedded tiny models' numbers, never the paper's: the paper reports no CKA" in text
    monkeypatch.undo()
    # an analysis written before CKA: empty tables, no heatmap drawn, a sentence that says so
    old = copy_results(root, tmp_path / "old")
    for path in (old / "analysis").glob("*.nc"):
        ds = xr.load_dataset(path).drop_vars("cka")
        ds.to_netcdf(path)
    before = results.load_results(old)
    assert before.cka_frame(before.example_run()).empty and before.cka_table().empty
    text = run_page("fig03_04_controls", results_dir=str(old)).text
    assert "lack `cka`" in text and "linear CKA per layer pair (A->B)**: not drawn. No data in this run" in text
