"""The CV criterion of ``alpha="cv"`` (:func:`synclib.analysis.ridge_cv._cv_alpha`, and its Gram form
:func:`synclib.analysis.ridge_cv._gram_scores` that :func:`synclib.analysis.ridge.r2_grid` and the surrogates
use) against brute force: every (alpha, target layer) score, not only its argmax, in the primal (n > D)
and the dual (n < D) form."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from synclib.analysis.ridge_cv import _cv_alpha, _cv_setup, _fold_basis, _gram_pays, _gram_scores, _grams
from synclib.penalty import Penalty


@pytest.mark.parametrize("n, D", [(180, 12), (90, 140)])  # primal, dual
def test_cv_scores_equal_brute_force(n, D):
    rng = np.random.default_rng(3)
    Lt, Dt = 3, 5
    X = rng.standard_normal((n, D))
    # planted structure: each target layer a different linear map of X, with noise
    Y = np.stack([X @ rng.standard_normal((D, Dt)) * (t + 1) / D ** 0.5 + 2.0 * rng.standard_normal((n, Dt))
                  for t in range(Lt)], axis=1).astype(np.float32)
    groups = np.arange(n) // 5  # whole "episodes" of 5 samples
    grid = (0.01, 1.0, 30.0, 1e3, 1e5)
    cvd = _cv_setup(torch.from_numpy(Y), torch.arange(n), groups, Penalty("cv", grid, 3, None, 0), torch.device("cpu"))
    best, score = _cv_alpha(torch.from_numpy(X), cvd.folds, cvd.grid)
    want = np.zeros((len(grid), Lt))
    for f in cvd.folds:
        vm = f.vmask.numpy()
        for ai, a in enumerate(grid):
            m = Ridge(alpha=a).fit(X[~vm], Y[~vm].reshape(int((~vm).sum()), -1).astype(float))
            pred = m.predict(X[vm]).reshape(-1, Lt, Dt)
            want[ai] += [r2_score(Y[vm, t].astype(float), pred[:, t]) for t in range(Lt)]
    want /= len(cvd.folds)
    np.testing.assert_allclose(score.numpy(), want, atol=2e-4)
    assert best == int(want.max(1).argmax())
    Xt = torch.from_numpy(X)
    gram = sum(_gram_scores([_fold_basis(Xt, f.vmask)], _grams([f]), [cvd.grid])[0] for f in cvd.folds)
    np.testing.assert_allclose(gram.numpy() / len(cvd.folds), want, atol=2e-4)
    assert np.ptp(want) > 0.1  # the grid matters: the test would see a wrong quadratic term


def test_the_cheaper_form_is_chosen():
    """The Gram form for the models' wide states (the default run: rank ~ rows), the column form for
    narrow ones (the power page's synthetic states, 8 wide: rank << rows), where the Gram form's
    n_fit^2 work per target layer was 16x slower."""
    def fold(n, nv, Lt, m):
        cvd = _cv_setup(torch.zeros(n + nv, Lt, m) + torch.randn(n + nv, Lt, m), torch.arange(n + nv),
                        np.arange(n + nv) // 3, Penalty("cv", (1.0, 10.0), 3, None, 0), torch.device("cpu"))
        return cvd.folds[0]
    wide = fold(168, 0, 30, 32)
    assert _gram_pays(wide, 576, 100, 13) and _gram_pays(wide, 576, 1, 13)
    narrow = fold(195, 0, 3, 8)
    assert not _gram_pays(narrow, 8, 1, 13)
