"""synclib.analysis.ridge: equality to scikit-learn, planted maps, CV, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from synclib.analysis.ridge import ComputeOptions, Penalty, r2_grid, r2_grid_subsets, relative_alphas, ridge_solve
from synclib.splits import RidgeInputError, episode_folds, episode_split


def sklearn_grid(X, Y, tr, te, alpha):
    """The paper's method: one sklearn fit per layer pair (float64 reference)."""
    X, Y = X.astype(np.float64), Y.astype(np.float64)
    out = np.zeros((X.shape[1], Y.shape[1]))
    for i in range(X.shape[1]):
        for j in range(Y.shape[1]):
            a = alpha[i] if np.ndim(alpha) else alpha
            m = Ridge(alpha=a, fit_intercept=True).fit(X[tr, i], Y[tr, j])
            out[i, j] = r2_score(Y[te, j], m.predict(X[te, i]), multioutput="uniform_average")
    return out


def make(n, Ls, D, Lt, Dt, seed=0, noise=0.5):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((n, Ls, D)) * np.exp(rng.normal(0, 1, D)) + 3).astype(np.float32)
    W = rng.standard_normal((Ls, D, Dt)) / np.sqrt(D) / np.exp(rng.normal(0, 1, D))[:, None]
    Y = (np.einsum("nld,ldk->nk", X, W)[:, None] * rng.uniform(0.2, 1, (1, Lt, 1))
         + noise * rng.standard_normal((n, Lt, Dt))).astype(np.float32)
    perm = rng.permutation(n)
    k = int(0.8 * n)
    return X, Y, perm[:k], perm[k:]


SHAPES = [  # (n, L_src, D_src, L_tgt, D_tgt): n < D, n > D, unequal depths/widths
    (60, 3, 100, 4, 30),
    (300, 4, 20, 2, 50),
    (150, 5, 64, 3, 40),
    (400, 2, 16, 3, 8),
]


@pytest.mark.parametrize("n, D", [(80, 12), (30, 50)])  # primal (D <= n) and dual (D > n)
def test_solver_equals_sklearn(n, D):
    """The one solver, in each of its forms, predicts as sklearn's Ridge(fit_intercept=True)."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((n + 20, D)) * np.exp(rng.normal(0, 1, D)) + 3
    Y = X @ rng.standard_normal((D, 5)) + rng.standard_normal((n + 20, 5)) + 2
    tr, te = np.arange(n), np.arange(n, n + 20)
    ref = Ridge(alpha=0.7, fit_intercept=True).fit(X[tr], Y[tr]).predict(X[te])
    Xtr, Xte, Ytr = (torch.from_numpy(a) for a in (X[tr], X[te], Y[tr]))
    my = Ytr.mean(0, keepdim=True)
    pred = ridge_solve(Xtr, Xte, 0.7, Ytr)
    assert pred.shape == (20, 5)
    H = ridge_solve(Xtr, Xte, 0.7, form="hat")
    assert H.shape == (20, n)
    G = ridge_solve(Xtr, Xte, 0.7, form="left")
    assert G.shape == (20, D)
    Xc = Xtr - Xtr.mean(0, keepdim=True)
    for got in (pred, H @ (Ytr - my) + my, G @ (Xc.T @ (Ytr - my)) + my):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-8, atol=1e-8)


def test_solver_errors_name_the_parameter():
    X = torch.ones(5, 2, dtype=torch.float64)
    with pytest.raises(RidgeInputError, match="form"):
        ridge_solve(X, X, 1.0, form="weights")
    with pytest.raises(RidgeInputError, match="Ytr"):
        ridge_solve(X, X, 1.0)
    with pytest.raises(RidgeInputError, match="Ytr"):
        ridge_solve(X, X, 1.0, X, form="hat")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("method", ["auto", "gram", "direct"])
def test_equals_sklearn(shape, method):
    X, Y, tr, te = make(*shape)
    ref = sklearn_grid(X, Y, tr, te, 0.1)
    got = r2_grid(X, Y, tr, te, 0.1, compute=ComputeOptions(method=method)).r2
    assert got.shape == (shape[1], shape[3])
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)


def test_constant_and_near_constant_target_columns_match_sklearn():
    X, Y, tr, te = make(200, 3, 40, 2, 20, seed=1)
    Y[:, 0, 3] = 2.5                      # constant everywhere: sklearn scores it 1
    Y[te, 1, 4] = -1.0                    # constant on test only: sklearn scores it 0
    Y[:, 1, 5] *= 1e-3                    # near-constant (tiny variance)
    ref = sklearn_grid(X, Y, tr, te, 0.1)
    for method in ("gram", "direct"):
        np.testing.assert_allclose(r2_grid(X, Y, tr, te, 0.1, compute=ComputeOptions(method=method)).r2, ref, atol=1e-5,
                                   rtol=0)


def test_torch_input_and_float16_storage():
    X, Y, tr, te = make(120, 3, 30, 2, 10, seed=2)
    ref = sklearn_grid(X, Y, tr, te, 0.1)
    got = r2_grid(torch.from_numpy(X), torch.from_numpy(Y), torch.as_tensor(tr), torch.as_tensor(te)).r2
    np.testing.assert_allclose(got, ref, atol=1e-5)
    # float16 storage is upcast per layer; compare with sklearn on the same float16 values
    X16, Y16 = X.astype(np.float16), Y.astype(np.float16)
    np.testing.assert_allclose(r2_grid(X16, Y16, tr, te).r2,
                               sklearn_grid(X16.astype(np.float32), Y16.astype(np.float32), tr, te, 0.1), atol=1e-5)


def test_paired_rows_and_per_layer_alpha():
    X, Y, tr, te = make(150, 3, 20, 2, 10, seed=3)
    alphas = np.array([0.1, 10.0, 1000.0])
    ref = sklearn_grid(X, Y, tr, te, alphas)
    # pair X rows with shifted Y rows explicitly
    Ys = np.concatenate([np.zeros((5, 2, 10), np.float32), Y])
    got = r2_grid(X, Ys, (tr, tr + 5), (te, te + 5), alphas).r2
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_planted_linear_map_recovered_and_shuffled_target_is_not():
    rng = np.random.default_rng(4)
    n, D = 500, 20
    X = rng.standard_normal((n, 2, D)).astype(np.float32)
    W = rng.standard_normal((D, 15))
    Y = np.stack([X[:, 0] @ W + 0.01 * rng.standard_normal((n, 15)),
                  rng.standard_normal((n, 15))], 1).astype(np.float32)
    tr, te = np.arange(400), np.arange(400, 500)
    g = r2_grid(X, Y, tr, te, 0.1).r2
    assert g[0, 0] > 0.999
    assert g[1, 0] < 0.05 and g[0, 1] < 0.05  # unrelated layers
    Ysh = Y.copy()
    Ysh[:, 0] = Y[rng.permutation(n), 0]  # break the pairing
    assert r2_grid(X, Ysh, tr, te, 0.1).r2[0, 0] < 0.05


def test_subsets_equal_separate_grids():
    X, Y, tr, te = make(200, 3, 25, 2, 12, seed=5)
    subs = [te[:15], te[15:30], te[5:40]]
    got = r2_grid_subsets(X, Y, tr, subs, 0.1)
    for i, s in enumerate(subs):
        np.testing.assert_allclose(got[i], sklearn_grid(X, Y, tr, s, 0.1), atol=1e-5)


def test_cv_picks_the_grouped_cv_optimum():
    """alpha='cv' equals a brute-force sklearn grouped CV with the same folds and criterion, over
    the grid times each layer's scale (the mean non-zero eigenvalue of Xc'Xc on the training rows:
    layers a thousand times apart in variance search the same relative grid)."""
    X, Y, tr, te = make(240, 2, 30, 2, 6, seed=6, noise=2.0)
    X[:, 1] *= 1000.0  # a layer of another scale
    groups = tr // 4  # 4 samples per "episode"
    grid = (0.01, 0.1, 1.0, 10.0, 100.0)
    fit = r2_grid(X, Y, tr, te, Penalty("cv", cv_alphas=grid, cv_folds=3, cv_columns=None), groups=groups)
    r2, al = fit.r2, fit.alpha
    folds = episode_folds(groups, 3, seed=0)
    for l in range(2):
        Xc = X[tr, l].astype(float) - X[tr, l].astype(float).mean(0)
        scale = (Xc ** 2).sum() / min(len(tr) - 1, X.shape[2])
        score = np.zeros((len(grid), 2))
        for vm in folds:
            f, v = tr[~vm], tr[vm]
            for ai, a in enumerate(grid):
                for t in range(2):
                    m = Ridge(alpha=a * scale).fit(X[f, l].astype(float), Y[f, t].astype(float))
                    score[ai, t] += r2_score(Y[v, t].astype(float), m.predict(X[v, l].astype(float)))
        assert al[l] == pytest.approx(grid[int(score.max(1).argmax())] * scale, rel=1e-9)
    rel = relative_alphas(X, tr, al)
    assert all(any(r == pytest.approx(g, rel=1e-9) for g in grid) for r in rel)
    np.testing.assert_allclose(r2, sklearn_grid(X, Y, tr, te, al), atol=1e-5)
    # folds hold whole groups
    for vm in folds:
        assert not set(groups[vm]) & set(groups[~vm])


@pytest.mark.parametrize("kwargs, match", [
    (dict(train=np.arange(2)), "too few samples"),
    (dict(test=np.arange(50, 51)), "too few samples"),
    (dict(alpha=-1.0), "alpha"),
    (dict(alpha="auto"), "alpha"),
    (dict(compute=dict(precision="fp8")), "precision"),
    (dict(compute=dict(precision="tf32")), "CUDA"),
    (dict(train=np.arange(10, 60), test=(np.arange(5), np.arange(4))), "mismatched sample counts"),
    (dict(alpha=np.array([0.1, 1.0, 10.0])), "alpha: an array needs one penalty per source layer"),
])
def test_errors(kwargs, match):
    X, Y, _, _ = make(60, 2, 8, 2, 4, seed=7)
    args = dict(X=X, Y=Y, train=np.arange(10, 60), test=np.arange(10), alpha=0.1)
    args.update(kwargs)
    with pytest.raises(RidgeInputError, match=match):
        if "compute" in args:
            args["compute"] = ComputeOptions(**args["compute"])
        r2_grid(args.pop("X"), args.pop("Y"), args.pop("train"), args.pop("test"), args.pop("alpha"), **args)


def test_error_nan_constant_and_count_mismatch():
    X, Y, tr, te = make(60, 2, 8, 2, 4, seed=8)
    Xn = X.copy()
    Xn[tr[0], 1, 3] = np.nan
    with pytest.raises(RidgeInputError, match=r"X holds NaN or inf.*layer 1"):
        r2_grid(Xn, Y, tr, te)
    Yn = Y.copy()
    Yn[te[0], 0, 0] = np.inf
    with pytest.raises(RidgeInputError, match=r"Y holds NaN or inf"):
        r2_grid(X, Yn, tr, te)
    Xn[tr[0], 1, 3] = 0
    Xn[tr[1]] = np.nan  # a NaN in a row that is not used is fine
    np.testing.assert_allclose(r2_grid(Xn, Y, tr[2:], te).r2, sklearn_grid(X, Y, tr[2:], te, 0.1), atol=1e-5)
    Yc = Y.copy()
    Yc[:, 1] = 7.0
    with pytest.raises(RidgeInputError, match="target layer 1 is constant"):
        r2_grid(X, Yc, tr, te)
    with pytest.raises(RidgeInputError, match="mismatched sample counts"):
        r2_grid(X, Y[:50], tr[tr < 50], te[te < 50])
    with pytest.raises(RidgeInputError, match="groups"):
        r2_grid(X, Y, tr, te, "cv", groups=np.zeros(len(tr)))


# --------------------------------------------------------------------------- train R^2
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("method", ["gram", "direct"])
def test_train_r2_equals_sklearn_on_the_training_rows(shape, method):
    X, Y, tr, te = make(*shape)
    fit = r2_grid(X, Y, tr, te, 0.1, train_r2=True, compute=ComputeOptions(method=method))
    r2, train_r2, al = fit.r2, fit.train_r2, fit.alpha
    np.testing.assert_allclose(r2, sklearn_grid(X, Y, tr, te, 0.1), atol=1e-5, rtol=0)
    np.testing.assert_allclose(train_r2, sklearn_grid(X, Y, tr, tr, 0.1), atol=1e-5, rtol=0)
    assert al.shape == (shape[1],)
    np.testing.assert_array_equal(r2, r2_grid(X, Y, tr, te, 0.1, compute=ComputeOptions(method=method)).r2)  # same


def test_train_r2_with_a_column_constant_on_the_training_rows():
    X, Y, tr, te = make(200, 2, 10, 2, 6, seed=11)
    Y[tr, 0, 2] = 1.5  # constant on train: predicted exactly there (sklearn scores it 1)
    train_r2 = r2_grid(X, Y, tr, te, 0.1, train_r2=True).train_r2
    np.testing.assert_allclose(train_r2, sklearn_grid(X, Y, tr, tr, 0.1), atol=1e-5)


# --------------------------------------------------------------------------- splits
def test_episode_split_hand_worked():
    """The reference's rule on 6 episodes with 3, 0, 4, 2, 5, 1 samples (episode 1 empty).

    RandomState(0).permutation(6) = [5, 2, 1, 3, 0, 4] (over all episodes, the empty one too).
    """
    counts = [3, 0, 4, 2, 5, 1]
    groups = np.repeat(np.arange(6), counts)  # samples 0-2: ep 0, 3-6: ep 2, 7-8: ep 3, 9-13: ep 4, 14: ep 5
    assert list(np.random.RandomState(0).permutation(6)) == [5, 2, 1, 3, 0, 4]
    # N = 5: test >= 5 - int(4.0) = 1 -> [ep 5]; train >= 4 -> [ep 2]
    tr, te, info = episode_split(groups, 5, 0, n_groups=6)
    assert list(te) == [14] and list(tr) == [3, 4, 5, 6]
    assert list(info["test_groups"]) == [5] and list(info["train_groups"]) == [2]
    assert (info["n_train"], info["n_test"], info["short"], info["n_available"]) == (4, 1, 0, 15)
    # N = 10: test >= 2 -> eps 5 (1), 2 (5); train >= 8 -> eps 1 (0), 3 (2), 0 (5), 4 (10)
    tr, te, info = episode_split(groups, 10, 0, n_groups=6)
    assert list(info["test_groups"]) == [5, 2] and list(info["train_groups"]) == [1, 3, 0, 4]
    assert (len(te), len(tr), info["short"]) == (5, 10, 0)
    # short, N = 20 > 15: test >= 4 -> eps 5, 2 (5 samples); train runs out: all the rest (10)
    tr, te, info = episode_split(groups, 20, 0, n_groups=6)
    assert list(info["test_groups"]) == [5, 2] and list(info["train_groups"]) == [1, 3, 0, 4]
    assert (len(te), len(tr), info["short"]) == (5, 10, 1)
    # N = None: all samples, test >= 15 - int(12.0) = 3 -> eps 5, 2; train the rest
    tr, te, info = episode_split(groups, None, 0, n_groups=6)
    assert (len(te), len(tr), info["short"], info["n_requested"]) == (5, 10, 0, -1)
    # without n_groups the empty episode is unknown: 5 groups, another permutation
    assert list(np.random.RandomState(0).permutation(5)) == [2, 0, 1, 3, 4]  # labels 3, 0, 2, 4, 5
    _, te, info = episode_split(groups, 5, 0)
    assert list(info["test_groups"]) == [3] and list(te) == [7, 8]
    # a RandomState is used as is and left advanced (the shuffled control continues it)
    rs = np.random.RandomState(0)
    episode_split(groups, 5, rs, n_groups=6)
    after = np.random.RandomState(0)
    after.permutation(6)
    assert rs.randint(1 << 30) == after.randint(1 << 30)


def test_episode_split_guard_where_the_reference_crashes():
    groups = np.repeat(np.arange(6), [3, 0, 4, 2, 5, 1])
    # N = 100: the test set needs >= 20 of 15 samples and takes them all: no training set
    with pytest.raises(RidgeInputError, match="n_samples: .* leaves none of the 15 available for training"):
        episode_split(groups, 100, 0, n_groups=6)


def test_episode_split_sizes_and_disjoint():
    groups = np.repeat(np.arange(100), np.random.default_rng(0).integers(5, 15, 100))
    for seed in (0, 1, 2):
        tr, te, info = episode_split(groups, 500, seed, n_groups=100)
        assert not set(groups[tr]) & set(groups[te])
        assert len(te) >= 100 and len(tr) >= 400
        assert len(te) < 100 + 15 and len(tr) < 400 + 15  # stops at the first episode past the target
        assert info["short"] == 0 and info["n_available"] == len(groups)
    a = episode_split(groups, 500, 0)[1]
    b = episode_split(groups, 500, 1)[1]
    assert not np.array_equal(a, b)  # the seed shuffles
    n = len(groups)
    tr, te, info = episode_split(groups, n + 50, 0)  # fewer than requested: test first, train the rest
    assert info["short"] == 1 and len(tr) + len(te) == n
    assert len(te) >= n + 50 - int(0.8 * (n + 50))


def test_episode_split_errors_name_the_parameter():
    with pytest.raises(RidgeInputError, match="n_samples"):
        episode_split(np.arange(10), 1)
    with pytest.raises(RidgeInputError, match="groups"):
        episode_split(np.zeros(10, dtype=int), None, n_groups=0)
    with pytest.raises(RidgeInputError, match="groups"):
        episode_split(np.array([], dtype=int), None)
    with pytest.raises(RidgeInputError, match="train_frac"):
        episode_split(np.arange(10), None, train_frac=1.0)
    with pytest.raises(RidgeInputError, match="n_samples"):  # one group: nothing left for training
        episode_split(np.zeros(10), None)


def fixed_weight_r2(X, Y, tr, rows, te, alpha):
    """Reference for resampled test sets: sklearn's maps fitted on ``tr``, scored on the rows
    ``rows`` (repeats allowed) with each column's test variance held at the test set ``te``'s."""
    X, Y = X.astype(np.float64), Y.astype(np.float64)
    out = np.zeros((X.shape[1], Y.shape[1]))
    for i in range(X.shape[1]):
        for j in range(Y.shape[1]):
            m = Ridge(alpha=alpha, fit_intercept=True).fit(X[tr, i], Y[tr, j])
            var = Y[te, j].var(0)  # per column, ddof 0: SStot / n of the whole test set
            mse = ((Y[rows, j] - m.predict(X[rows, i])) ** 2).mean(0)
            out[i, j] = np.mean(1 - mse / var)
    return out


@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("method", ["gram", "direct"])
def test_group_losses_resample_whole_groups(shape, method):
    """Each test group's share of the loss: all groups once gives the grid itself, and a resample
    of whole groups (repeats allowed) gives sklearn's maps scored on those rows with the test set's
    column variances, by the gram and the direct form alike."""
    from synclib.analysis.ridge import resampled_r2

    X, Y, tr, te = make(*shape, seed=4)
    groups = (np.arange(len(te)) * 7) % 5 * 10 + 3  # five groups, labels 3, 13, ..., 43, interleaved
    fit = r2_grid(X, Y, tr, te, 0.3, test_groups=groups, compute=ComputeOptions(method=method))
    r2, (labels, loss, sizes) = fit.r2, (fit.test_loss.labels, fit.test_loss.loss, fit.test_loss.sizes)
    assert list(labels) == [3, 13, 23, 33, 43] and sizes.sum() == len(te)
    assert loss.shape == (5,) + r2.shape
    np.testing.assert_allclose(resampled_r2(r2, loss, sizes, np.ones((1, 5)))[0], r2, atol=1e-10)
    counts = np.array([[2, 0, 1, 0, 3], [0, 0, 0, 0, 0]])
    got = resampled_r2(r2, loss, sizes, counts)
    rows = np.concatenate([np.tile(te[groups == g], c) for g, c in zip(labels, counts[0])])
    np.testing.assert_allclose(got[0], fixed_weight_r2(X, Y, tr, rows, te, 0.3), atol=2e-5)
    assert np.isnan(got[1]).all()  # a resample that draws no group has no test set
    with pytest.raises(RidgeInputError, match="test_groups"):
        r2_grid(X, Y, tr, te, 0.3, test_groups=groups[:-1])
