"""Surrogate partners (synclib.analysis.surrogates): the batched solver against one fit per
target set, the partner rule, the null on states that share only what every dialog shares
(5 %), and a planted synchrony that the surrogates do not have.  Units: SyncR² (R² averaged
over source layers) and p-values."""
from __future__ import annotations

import numpy as np
import pytest

import synclib.analysis.ridge as ridge
from synclib.analysis import power
from synclib.analysis import analyze
from synclib.analysis.samples import build_dataset
from synclib.analysis.surrogates import surrogate_partners, surrogate_rows
from synthetic import Planted, Shapes, make_synthetic_cube
from synclib.stats import bootstrap_p, rank_p


def test_r2_grid_targets_equals_one_fit_per_target_set(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((90, 3, 12))
    Y = X[:, :2, :10] @ rng.standard_normal((10, 10)) * 0.3 + rng.standard_normal((90, 2, 10))
    xtr, xte = np.arange(60), np.arange(60, 90)
    sets = [(xtr, xte), (rng.permutation(xtr), rng.permutation(xte)), ((xtr + 7) % 90, (xte + 11) % 90)]
    alphas = np.array([0.5, 2.0, 8.0])
    groups = np.repeat(np.arange(6), 5)
    solves = []
    real = ridge.ridge_solve
    monkeypatch.setattr(ridge, "ridge_solve", lambda *a, **k: solves.append(1) or real(*a, **k))
    fit = ridge.r2_grid_targets(X, Y, xtr, xte, sets, alphas, test_groups=groups)
    r2, (labels, loss, sizes) = fit.r2, (fit.test_loss.labels, fit.test_loss.loss, fit.test_loss.sizes)
    assert len(solves) == X.shape[1]  # one factorisation per source layer, whatever the number of sets
    assert r2.shape == (3, 3, 2) and loss.shape == (3, 6, 3, 2)
    np.testing.assert_array_equal(labels, np.arange(6))
    for t, (ytr, yte) in enumerate(sets):
        one = ridge.r2_grid(X, Y, (xtr, ytr), (xte, yte), alphas, test_groups=groups)
        ref, ref_loss, ref_sizes = one.r2, one.test_loss.loss, one.test_loss.sizes
        np.testing.assert_allclose(r2[t], ref, atol=1e-6)
        np.testing.assert_allclose(loss[t], ref_loss, atol=1e-6)
        np.testing.assert_array_equal(sizes, ref_sizes)
    with pytest.raises(ridge.RidgeInputError, match=r"targets\[1\]"):
        ridge.r2_grid_targets(X, Y, xtr, xte, [sets[0], (xtr[:5], xte)], alphas)
    with pytest.raises(ridge.RidgeInputError, match="numeric alphas"):
        ridge.r2_grid_targets(X, Y, xtr, xte, sets, "cv")


@pytest.mark.parametrize("D", [10, 150], ids=["primal", "dual"])
@pytest.mark.parametrize("gram", [True, False], ids=["gram", "columns"])
def test_each_target_set_chooses_its_own_penalty_as_a_fit_of_its_own_would(monkeypatch, D, gram):
    """Per-set penalties (the surrogates' own CV): :func:`cv_penalties` chooses for each target set
    what :func:`r2_grid`'s CV chooses for that set alone (in both forms of the sets' CV, Gram or
    columns, and both forms of a fold's source side, primal or dual), and
    :func:`r2_grid_targets` with those (T, L_src) penalties scores each set as its own fit does,
    one factorisation per source layer and distinct penalty."""
    from synclib.analysis import ridge_cv
    if gram:  # whatever the flops say
        monkeypatch.setattr(ridge_cv, "_gram_pays", lambda *a: True)
    else:
        monkeypatch.setattr(ridge_cv, "CV_GRAM_BYTES", 0)
    rng = np.random.default_rng(1)
    n, L = 120, 3
    X = rng.standard_normal((n, L, D))
    Y = np.concatenate([X[:, :2] @ rng.standard_normal((D, D)) * 0.4 + rng.standard_normal((n, 2, D)),
                        rng.standard_normal((n, 2, D)) * 3.0], axis=0)  # rows n..: unrelated, another scale
    xtr, xte = np.arange(90), np.arange(90, 120)
    sets = [(xtr, xte), (xtr + n, xte + n), (rng.permutation(xtr), rng.permutation(xte))]
    groups = np.repeat(np.arange(18), 5)
    cv = ridge.Penalty("cv")
    alphas = ridge.cv_penalties(X, Y, xtr, [s[0] for s in sets], cv, groups)
    assert alphas.shape == (3, L)
    for t, (ytr, yte) in enumerate(sets):
        own = ridge.r2_grid(X, Y, (xtr, ytr), (xte, yte), cv, groups=groups)
        np.testing.assert_allclose(alphas[t], own.alpha, rtol=1e-12)
    assert len({tuple(a) for a in alphas}) > 1  # the sets differ in what they choose
    solves = []
    real = ridge.ridge_solve
    monkeypatch.setattr(ridge, "ridge_solve", lambda *a, **k: solves.append(1) or real(*a, **k))
    fit = ridge.r2_grid_targets(X, Y, xtr, xte, sets, alphas, test_groups=np.repeat(np.arange(6), 5))
    assert len(solves) == sum(len(set(alphas[:, l])) for l in range(L))
    np.testing.assert_array_equal(fit.alpha, alphas)
    for t, (ytr, yte) in enumerate(sets):
        one = ridge.r2_grid(X, Y, (xtr, ytr), (xte, yte), alphas[t], test_groups=np.repeat(np.arange(6), 5))
        np.testing.assert_allclose(fit.r2[t], one.r2, atol=1e-6)
        np.testing.assert_allclose(fit.test_loss.loss[t], one.test_loss.loss, atol=1e-6)
    with pytest.raises(ridge.RidgeInputError, match="one row of penalties"):
        ridge.r2_grid_targets(X, Y, xtr, xte, sets, alphas[:2])


def test_partners_follow_the_rule():
    E, S = 10, 3
    kw = dict(n_episodes=E, n_seeds=S, n_rounds=4, shapes=Shapes(layers_a=2, dim_a=4, layers_b=2, dim_b=4), seed=3,
              passive=False, tom=False)
    full = make_synthetic_cube(planted=Planted(min_utterances=8), **kw)  # every dialog plays all 8 utterances
    pe, ps = surrogate_partners(full, build_dataset(full, "B->A", "genuine"), 12)
    assert pe.shape == ps.shape == (E, S, 12)
    own = (pe == np.arange(E)[:, None, None]) & (ps == np.arange(S)[None, :, None])
    assert not own.any()  # no dialog is its own partner
    # the first two partners: the same task under the other seeds (ascending seed order, cyclic)
    np.testing.assert_array_equal(pe[:, :, :2], np.broadcast_to(np.arange(E)[:, None, None], (E, S, 2)))
    np.testing.assert_array_equal(ps[:, 0, :2], np.tile([1, 2], (E, 1)))
    np.testing.assert_array_equal(ps[:, 2, :2], np.tile([0, 1], (E, 1)))
    # then the 9 other tasks under the same seed, those of the dialog's scenario first; then drawn at random
    env = full["env_id"].values
    assert (ps[:, :, 2:11] == np.arange(S)[None, :, None]).all()
    assert all(sorted(pe[e, s, 2:11]) == sorted(set(range(E)) - {e}) for e in range(E) for s in range(S))
    drawn = pe[:, :, 11] * S + ps[:, :, 11]
    assert not (drawn == np.arange(E)[:, None] * S + np.arange(S)[None, :]).any()  # never the dialog itself
    np.testing.assert_array_equal(surrogate_partners(full, build_dataset(full, "B->A", "genuine"), 12)[0], pe)
    same = env[pe[:, 0, 2:11]] == env[:, None]
    assert all(np.all(np.diff(row.astype(int)) <= 0) for row in same)
    rows, share = surrogate_rows(full, build_dataset(full, "B->A", "genuine"), 12)
    np.testing.assert_allclose(share["same_personas"][:2], 1.0)  # same task: same personas
    # dialogs of different lengths: only partners that hold every round a dialog needs, while any does
    var = make_synthetic_cube(planted=Planted(min_utterances=3), **kw)
    samples = build_dataset(var, "B->A", "genuine")
    rows, _ = surrogate_rows(var, samples, 3 * ((S - 1) + (E - 1)))  # more surrogates than candidates
    ok = samples.Y.ok.reshape(E, S, -1)
    n_kept = 0
    for e in range(E):
        for s in range(S):
            mine = (samples.episode == e) & (samples.sim_seed == s)
            if not mine.any():
                continue
            k = samples.round[mine] + int(samples.info.get("round_shift", 0))
            cands = [(e, t) for t in range(S) if t != s] + [(o, s) for o in range(E) if o != e]
            covered = any(ok[o, t, k].all() for o, t in cands)
            assert covered == (rows[mine] >= 0).all(), (e, s)
            n_kept += covered
    assert n_kept > 0
    one = make_synthetic_cube(n_episodes=1, n_seeds=1, n_rounds=3,
                              shapes=Shapes(layers_a=2, dim_a=4, layers_b=2, dim_b=4), passive=False, tom=False)
    assert surrogate_partners(one, build_dataset(one, "A->B", "genuine"), 5)[0].shape == (1, 1, 0)


def _null_cube(i: int):
    """A and B independent but for a state every dialog holds at each round (shared position in
    the dialog, not interaction): the genuine pairing has nothing the surrogates lack."""
    cube = make_synthetic_cube(n_episodes=24, n_seeds=1, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=16, layers_b=3, dim_b=16), coupling=0.0,
                               planted=Planted(relationship_effect=0.0), seed=100 + i, passive=False, tom=False)
    rng = np.random.default_rng(i)
    for v in ("hidden_a", "hidden_b"):
        da = cube[v]
        cube[v] = da + 2.0 * rng.standard_normal((1, 1) + da.shape[2:])
    return cube


def test_surrogate_null_holds_at_five_percent():
    """On states that share only their position in the dialog, with every surrogate choosing its
    own penalty by the same CV as genuine (``alpha="cv"``), genuine's rank among the surrogates is
    uniform: rejected at 5 % about one cube in 20."""
    n, p_rank, p_boot, genuine = 40, [], [], []
    for i in range(n):
        ds = analyze(_null_cube(i), conditions=["genuine"], alpha="cv", n_samples=None, split_seeds=(0,), n_boot=200,
                     surrogates=20, cka=False, progress=False, log=lambda m: None)
        g = float(ds["sync_r2_surrogate_genuine"].mean())
        genuine.append(g)
        p_rank.append(rank_p(g, ds["sync_r2_surrogate"].mean("direction").values))
        p_boot.append(bootstrap_p(ds["surrogate_gap_boot"].mean("direction").values))
    p = np.maximum(p_rank, p_boot)
    # the old null: SyncR² > 0 holds on every one of these cubes, with no interaction at all
    assert min(genuine) > 0 and np.mean(genuine) > 0.1
    # the surrogate null: genuine's rank is uniform among the 21, rejected at 5 % about 1 in 20
    assert np.mean(np.array(p) <= 0.05) <= 0.10
    assert np.mean(np.array(p_rank) <= 0.05) <= 0.10
    assert 0.35 < np.mean(p_rank) < 0.65


def test_planted_synchrony_is_above_every_surrogate():
    # 48 dialogs: with their own penalties the surrogates fit as well as they can, and the planted
    # gap must be detectable by the episode bootstrap as well as by the rank
    cube = make_synthetic_cube(n_episodes=48, n_seeds=1, n_rounds=6,
                               shapes=Shapes(layers_a=3, dim_a=16, layers_b=3, dim_b=16), coupling=0.8, seed=5,
                               passive=False, tom=False)
    ds = analyze(cube, conditions=["genuine"], alpha="cv", n_samples=None, split_seeds=(0, 1), n_boot=200, surrogates=20,
                 cka=False, progress=False, log=lambda m: None)
    # every partner holds the rounds its dialog needs: the batch's genuine is the genuine condition
    keep = (surrogate_rows(cube, build_dataset(cube, "A->B", "genuine"), 20)[0] >= 0).all(1)
    if keep.all():
        np.testing.assert_allclose(ds["sync_r2_surrogate_genuine"].values,
                                   ds["sync_r2"].sel(condition="genuine").values, atol=1e-12)
    g = ds["sync_r2_surrogate_genuine"].values
    assert (g[:, None] > ds["sync_r2_surrogate"].values).all()
    assert ds["surrogate_gap_boot"].shape == (2, 200)
    assert bootstrap_p(ds["surrogate_gap_boot"].mean("direction").values) <= 0.05


def test_surrogate_test_on_results(tmp_path):
    from synclib.analysis.results import load_results
    from synthetic import build_synthetic_results

    root = build_synthetic_results(tmp_path / "r", n_episodes=30,
                                   analyze_kwargs={"sample_sizes": None, "nonlinear": False, "relationship": False,
                                                   "persona_disjoint": False, "tom": False, "n_boot": 200})
    res = load_results(root)
    t = power.surrogate_test(res)
    assert t["n_surrogates"] == 20 and t["n_runs"] == len(res.runs)
    assert t["p_rank"] == pytest.approx(1 / 21) and t["share_below"] == 1.0
    assert t["p"] == max(t["p_rank"], t["p_episodes"]) and t["n_boot"] == 200
    table = power.surrogate_table(res)
    assert list(table["pair"]) == res.pair_names + ["all"]
    assert table.iloc[-1]["genuine"] == pytest.approx(t["genuine"])


def test_the_gap_resamples_are_each_sets_resampled_score_averaged_over_seeds(monkeypatch):
    """The batched gap (chunks of target sets, seeds accumulated) against the plain rule: per set,
    each seed's grid resampled by whole test episodes (ridge.resampled_r2), the seeds that drew
    a test episode averaged, then SyncR²; genuine (set 0) minus the surrogates' mean."""
    from synclib.analysis import surrogates
    from synclib.analysis.scores import sync_r2_many

    rng = np.random.default_rng(4)
    T, L, B, E = 6, 3, 50, 9
    grids, losses = [], []
    for eps in (np.arange(0, 5), np.arange(4, 9)):  # two seeds, each testing 5 of the 9 episodes
        loss = rng.random((T, len(eps), L, L)) * 0.1
        grids.append(rng.random((T, L, L)) * 0.4)
        losses.append((eps, loss, rng.integers(3, 8, len(eps))))
    counts = rng.multinomial(E, np.ones(E) / E, size=B)
    counts[0, :] = 0
    counts[0, 0] = E                       # resample 0 draws only episode 0: the second seed drew nothing
    want = []
    for t in range(T):
        drawn = []
        for g, (eps, loss, sizes) in zip(grids, losses):
            drawn.append(ridge.resampled_r2(g[t], loss[t], sizes, counts[:, eps]))
        want.append(sync_r2_many(np.nanmean(drawn, axis=0)))
    want = np.array(want)
    monkeypatch.setattr(surrogates, "GAP_CHUNK_BYTES", 8 * B * L * L * 2)  # two sets a chunk
    gap, genuine = surrogates._gap_resamples(grids, losses, counts)
    np.testing.assert_allclose(gap, want[0] - want[1:].mean(0), rtol=1e-5, atol=1e-6)  # the resampled grids in float32
    np.testing.assert_allclose(genuine, want[0], rtol=1e-5, atol=1e-6)
